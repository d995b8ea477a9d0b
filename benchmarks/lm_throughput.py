"""Sampler and learner throughput of `rlscope train` on a ~100M-parameter Qwen2-style model.

Runs short GRPO runs on `length_target` (free text up to ``--length_limit`` bytes; a random
init writes nearly full-length answers) for each precision × batch size, and reports the
median over the steps after the first two of the loop's own timings:

- ``sample_tokens_per_s``: generated tokens / s (KV-cached decoding, batched);
- ``learn_tokens_per_s``: learner tokens (prompt + completion, forward and backward) / s;
- ``learn_mfu`` ≈ 6·N·learn_tokens_per_s / peak and ``sample_mfu`` ≈ 2·N·sample_tokens_per_s
  / peak, with N the parameter count and the peak the card's dense bf16 rate (H100/H200 SXM:
  989 TFLOP/s); attention FLOPs are left out, so both are slight underestimates.

The baseline of the ratios is float32 at the same batch size, measured in the same process.

    python benchmarks/lm_throughput.py --batch_sizes 64 256 --steps 6 --output lm.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile

import torch

from rlscope.config import OptimConfig, RunConfig, TrainConfig
from rlscope.methods import MethodConfig
from rlscope.policy import ModelConfig
from rlscope.sampling import SamplingConfig
from rlscope.tasks import TaskConfig
from rlscope.train import train
from rlscope.utils import environment_info

PEAK_BF16_FLOPS = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}


def model_config(args: argparse.Namespace, autocast: str) -> ModelConfig:
    return ModelConfig(arch="qwen2", d_model=args.d_model, n_layers=args.n_layers,
                       n_heads=args.n_heads, n_kv_heads=args.n_kv_heads,
                       intermediate_size=args.intermediate_size, autocast=autocast,
                       attn_implementation=args.attn)


def peak_flops() -> float | None:
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def run_one(args: argparse.Namespace, autocast: str, batch_size: int, runs_dir: str
            ) -> dict[str, float]:
    cfg = TrainConfig(
        method="grpo", task="length_target",
        task_options=TaskConfig(length_limit=args.length_limit, eval_batches=1,
                                eval_batch_size=8),
        components=MethodConfig(selection="none", kl_coef=0.0),
        sampling=SamplingConfig(),
        model=model_config(args, autocast),
        optim=OptimConfig(lr=1e-5),
        run=RunConfig(num_steps=args.steps, batch_size=batch_size, group_size=8,
                      micro_batch_size=args.micro_batch_size, eval_every=0,
                      device=args.device, progress=False, runs_dir=runs_dir, log_samples=0,
                      doctor_every=0, name=f"{autocast}_{batch_size}"))
    result = train(cfg)
    steps = result.metrics[2:] or result.metrics

    def med(key: str) -> float:
        return statistics.median(m[key] for m in steps)

    return {"sample_tokens_per_s": med("throughput/sample_tokens_per_s"),
            "learn_tokens_per_s": med("throughput/learn_tokens_per_s"),
            "step_s": med("time/step"), "sample_s": med("time/sample"),
            "learn_s": med("time/learn"),
            "completion_len": med("length/mean"),
            "peak_memory_mb": max(m.get("perf/peak_memory_mb", 0.0) for m in steps)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--d_model", type=int, default=768)
    p.add_argument("--n_layers", type=int, default=12)
    p.add_argument("--n_heads", type=int, default=12)
    p.add_argument("--n_kv_heads", type=int, default=4)
    p.add_argument("--intermediate_size", type=int, default=3072)
    p.add_argument("--attn", default="sdpa", choices=["eager", "sdpa"])
    p.add_argument("--length_limit", type=int, default=128)
    p.add_argument("--batch_sizes", type=int, nargs="+", default=[64, 256, 512])
    p.add_argument("--micro_batch_size", type=int, default=0)
    p.add_argument("--precisions", nargs="+", default=["none", "bf16"])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--output", default="")
    args = p.parse_args()
    from rlscope.policy import build_policy

    n_params = sum(x.numel() for x in build_policy(model_config(args, "none"), 256,
                                                    64).parameters())
    peak = peak_flops()
    rows = []
    with tempfile.TemporaryDirectory() as runs_dir:
        for batch_size in args.batch_sizes:
            base = None
            for autocast in args.precisions:
                r = run_one(args, autocast, batch_size, runs_dir)
                if peak:
                    r["learn_mfu"] = 6 * n_params * r["learn_tokens_per_s"] / peak
                    r["sample_mfu"] = 2 * n_params * r["sample_tokens_per_s"] / peak
                base = base or r
                r["learn_speedup_vs_fp32"] = r["learn_tokens_per_s"] / base["learn_tokens_per_s"]
                r["sample_speedup_vs_fp32"] = (r["sample_tokens_per_s"]
                                               / base["sample_tokens_per_s"])
                rows.append({"batch_size": batch_size, "autocast": autocast, **r})
    out = {"benchmark": "lm_throughput", "params": n_params, "peak_bf16_flops": peak,
           "config": vars(args), "rows": rows,
           "environment": environment_info(torch.device(args.device))}
    text = json.dumps(out, indent=2)
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
