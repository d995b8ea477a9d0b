"""CUDA runtime calls and GPU kernels per training step, counted with torch.profiler.

Runs the `rlscope bench` sandbox step (grpo, token_reversal, batch 96, group 8, 4 inner epochs,
selection off) for N and for 2N steps without periodic evaluation and reports the difference
divided by N, so set-up, graph capture and the final evaluation cancel out.

    python benchmarks/profile_step.py --steps 10 [--no-graphs] [--output counts.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import Counter

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from rlscope.config import OptimConfig, RunConfig, TrainConfig
from rlscope.methods import MethodConfig
from rlscope.tasks import TaskConfig
from rlscope.train import train

LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
            "cudaGraphLaunch", "cudaMemcpyAsync", "cudaMemsetAsync")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def _config(steps: int, graphs: bool) -> TrainConfig:
    run = RunConfig(num_steps=steps, batch_size=96, group_size=8, inner_epochs=4, eval_every=0,
                    device="cuda", progress=False, runs_dir="runs/profile", log_samples=0)
    if "cuda_graphs" in {f.name for f in dataclasses.fields(RunConfig)}:
        run = dataclasses.replace(run, cuda_graphs=graphs)
    return TrainConfig(method="grpo", task="token_reversal", task_options=TaskConfig(seq_len=10),
                       components=MethodConfig(selection="none"), optim=OptimConfig(), run=run)


def count(steps: int, graphs: bool) -> tuple[Counter[str], object]:
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        train(_config(steps, graphs))
        torch.cuda.synchronize()
    counts: Counter[str] = Counter()
    for event in prof.events():
        if event.device_type == DeviceType.CUDA:
            counts["gpu_kernels_and_copies"] += 1
        elif event.name in LAUNCHES:
            counts["launches"] += 1
            counts[event.name] += 1
        elif event.name in SYNCS:
            counts["syncs"] += 1
            counts[event.name] += 1
    return counts, prof


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--no-graphs", action="store_true")
    parser.add_argument("--output", default="")
    parser.add_argument("--table", default="", help="write the top CPU ops of the long run here")
    args = parser.parse_args()
    graphs = not args.no_graphs
    train(_config(2, graphs))  # CUDA context, cuBLAS handles
    short, _ = count(args.steps, graphs)
    long, prof = count(2 * args.steps, graphs)
    per_step = {k: (long[k] - short[k]) / args.steps for k in sorted(long | short)}
    result = {"graphs": graphs, "device": torch.cuda.get_device_name(), "per_step": per_step}
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    if args.table:
        with open(args.table, "w", encoding="utf-8") as f:
            for key in ("self_cpu_time_total", "self_device_time_total"):
                f.write(prof.key_averages().table(sort_by=key, row_limit=50) + "\n")


if __name__ == "__main__":
    main()
