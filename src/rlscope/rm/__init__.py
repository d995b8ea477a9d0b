"""The learned reward model of ``preference_rm``: `rlscope.rm.model` (the model, its
Bradley–Terry loss and checkpoint) and `rlscope.rm.train` (``rlscope rm``)."""
