"""GPU kernels of one cached decode step of the sampler (CUDA), by name, count and time.

Times `generate` at the bench's sampler size (96 rows, 11 prompt tokens, 128 new tokens) with
and without CUDA graphs, then profiles one graphed call and lists its kernels per step.

    python benchmarks/decode_kernels.py
"""

from __future__ import annotations

import statistics
from collections import defaultdict

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from rlscope.batch import PromptBatch
from rlscope.policy.tiny import TinyConfig, TinyTransformer
from rlscope.sampling.sampler import SamplingConfig, generate

B, P, T = 96, 11, 128


def main() -> None:
    torch.manual_seed(0)
    policy = TinyTransformer(TinyConfig(vocab_size=3, max_len=P + T)).cuda().eval()
    prompts = PromptBatch(torch.randint(0, 3, (B, P))).to("cuda")
    seeds_B = torch.arange(B, device="cuda")
    for cfg in (SamplingConfig(), SamplingConfig(decode_graphs=False),
                SamplingConfig(use_cache=False)):
        times = []
        for _ in range(7):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            generate(policy, prompts, cfg, seeds_B, T)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        print(f"graphs={cfg.decode_graphs} cache={cfg.use_cache}: "
              f"{statistics.median(times[2:]) / T * 1e3:.1f} us per token step")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        generate(policy, prompts, SamplingConfig(), seeds_B, T)
        torch.cuda.synchronize()
    stats: dict[str, list[float]] = defaultdict(list)
    for event in prof.events():
        if event.device_type == DeviceType.CUDA:
            stats[event.name[:90]].append(event.device_time)
    total = sum(sum(v) for v in stats.values())
    print(f"{sum(len(v) for v in stats.values()) / T:.1f} kernels and "
          f"{total / T:.1f} us of kernel time per step")
    for name, v in sorted(stats.items(), key=lambda kv: -sum(kv[1])):
        print(f"{len(v) / T:6.2f}/step {statistics.mean(v):7.2f} us  {name}")


if __name__ == "__main__":
    main()
