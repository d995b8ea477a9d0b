"""The supervised jobs: `rlscope.supervised.sft` (``rlscope sft``, the warm start) and
`rlscope.supervised.rm` (``rlscope rm``, the reward model of ``preference_rm``), on the step
loop of `rlscope.supervised.loop`."""
