"""Issue 18's scaling table: the GRPO step on 1 and N GPUs, and FSDP2 against DDP, one JSON.

Each configuration is one ``rlscope train`` run (``--nproc N``, relaunched through torchrun; one
GPU per rank) of the fast-engine issue's GRPO step on a Qwen2-shaped model built from config and
saved once: ``length_target`` (byte-level instructions, answers up to ``--length_limit``
tokens), ``--prompts`` × ``--group_size`` rows, bf16 autocast over float32 master weights, no KL.
The same seed everywhere, so the 1-GPU and N-GPU runs sample the same prompts and (by the
counter-based noise) the same first batch: their first steps' metrics are compared.

    python benchmarks/scaling.py --shape qwen0.5b --nprocs 1 2            # DDP scaling
    python benchmarks/scaling.py --shape qwen1.5b --nprocs 2 --fsdp both  # FSDP2 vs DDP
    python benchmarks/scaling.py --shape tiny --device cpu --nprocs 1 2 --prompts 4 \\
        --group_size 2 --length_limit 8 --steps 2 --warmup 1            # CPU smoke (gloo)

``--weak`` measures weak scaling instead: ``--prompts`` per rank, so N ranks train N times the
rows of the 1-rank run in each step (the batch a user grows into with more GPUs); their first
steps then differ (other prompts) and are not compared.

Per configuration: the median step time after ``--warmup`` steps (the slowest rank's, as the
metrics record it), completion tokens per step and per second, the sample and learn times, and
rank 0's peak GPU memory (``perf/peak_memory_mb``). The N-GPU rows carry ``speedup`` and
``efficiency`` (speedup / N) against the 1-GPU row of the same shape and mode (speedup: the
ratio of step times; under ``--weak`` the ratio of completion tokens per second), and
``first_steps_max_abs_diff``: per metric, the largest difference over the first
``--compare_steps`` steps from the 1-GPU run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_engine import SHAPES, build_model, n_params

SHAPES = {**SHAPES,
          "qwen1.5b": dict(vocab_size=151936, hidden_size=1536, num_hidden_layers=28,
                           num_attention_heads=12, num_key_value_heads=2,
                           intermediate_size=8960, tie_word_embeddings=True, rope_theta=1e6,
                           rms_norm_eps=1e-6, max_position_embeddings=32768)}
COMPARED = ("reward/mean", "length/mean", "loss/policy", "policy/entropy", "optim/grad_norm",
            "adv/abs_mean")
"""Metrics compared between the 1-GPU run and the N-GPU run's first steps."""


def save(shape: str, path: Path) -> int:
    """The shape's init with ``length_target``'s ids (newline = EOS, NUL = pad)."""
    import hf_engine

    hf_engine.SHAPES.update(SHAPES)
    model = build_model(shape)
    model.config.eos_token_id = 10
    model.config.pad_token_id = 0
    model.save_pretrained(path)
    return n_params(model)


def rows(args: argparse.Namespace, nproc: int) -> int:
    """Rows per step: ``--prompts`` × ``--group_size``, times the ranks under ``--weak``."""
    return args.prompts * args.group_size * (nproc if args.weak else 1)


def train_command(args: argparse.Namespace, model_dir: Path, runs_dir: Path, name: str,
                  nproc: int, fsdp: bool) -> list[str]:
    cmd = [sys.executable, "-m", "rlscope.cli", "train", "--method", "grpo",
           "--task", "length_target", "--length_limit", str(args.length_limit),
           "--arch", "hf", "--path", str(model_dir), "--autocast", args.autocast,
           "--device", args.device, "--batch_size", str(rows(args, nproc)),
           "--group_size", str(args.group_size), "--micro_batch_size", str(args.micro_batch),
           "--selection", "none", "--kl_coef", "0", "--lr", "1e-5",
           "--num_steps", str(args.steps), "--eval_every", "0", "--log_samples", "0",
           "--doctor_every", "0", "--no_progress", "--seed", str(args.seed),
           "--runs_dir", str(runs_dir), "--name", name, "--nproc", str(nproc)]
    if fsdp:
        cmd.append("--fsdp")
    return cmd + list(args.extra)


def summarise(run_dir: Path, warmup: int, batch: int) -> dict[str, Any]:
    rows = [json.loads(line) for line in run_dir.joinpath("metrics.jsonl").read_text()
            .splitlines() if line.strip()]
    timed = rows[warmup:] or rows
    step_s = statistics.median(r["time/step"] for r in timed)
    tokens = statistics.median(r["length/mean"] for r in timed) * batch
    out: dict[str, Any] = {
        "steps": len(rows), "step_s": step_s, "completion_tokens_per_step": tokens,
        "completion_tokens_per_s": tokens / step_s,
        "sample_s": statistics.median(r["time/sample"] for r in timed),
        "learn_s": statistics.median(r["time/learn"] for r in timed),
        "peak_memory_mb_rank0": max((r.get("perf/peak_memory_mb", 0.0) for r in rows),
                                    default=None)}
    if "time/step_mean" in timed[0]:
        out["step_s_mean_over_ranks"] = statistics.median(r["time/step_mean"] for r in timed)
    out["_rows"] = rows
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.fsdp]
    result: dict[str, Any] = {"benchmark": "scaling", "config": {
        k: v for k, v in vars(args).items() if k != "extra"} | {"extra": list(args.extra)},
        "card": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "gpus": torch.cuda.device_count(), "torch": torch.__version__, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp, "model")
        result["params"] = save(args.shape, model_dir)
        runs_dir = Path(args.runs_dir or tmp) / "runs"
        base: dict[bool, dict[str, Any]] = {}
        for fsdp in modes:
            for nproc in args.nprocs:
                if fsdp and nproc < 2:
                    continue
                name = f"{args.shape}_n{nproc}{'_fsdp' if fsdp else ''}"
                cmd = train_command(args, model_dir, runs_dir, name, nproc, fsdp)
                print(f"[scaling] {name}: {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
                proc = subprocess.run(cmd, capture_output=True, text=True,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1"})
                entry: dict[str, Any] = {"name": name, "nproc": nproc, "fsdp": fsdp,
                                         "rc": proc.returncode}
                if proc.returncode != 0:
                    entry["error"] = (proc.stdout + proc.stderr)[-3000:]
                else:
                    entry |= summarise(runs_dir / name, args.warmup, rows(args, nproc))
                    if nproc == 1:
                        base[fsdp] = entry
                    ref = base.get(False)
                    if ref is not None and nproc > 1:
                        entry["speedup"] = (entry["completion_tokens_per_s"]
                                            / ref["completion_tokens_per_s"]) if args.weak \
                            else ref["step_s"] / entry["step_s"]
                        entry["efficiency"] = entry["speedup"] / nproc
                    if ref is not None and nproc > 1 and not args.weak:
                        entry["first_steps_max_abs_diff"] = {
                            m: max(abs(a[m] - b[m]) for a, b in zip(
                                ref["_rows"][:args.compare_steps],
                                entry["_rows"][:args.compare_steps], strict=False)
                                   if m in a and m in b)
                            for m in COMPARED}
                print(f"[scaling] {name}: " + json.dumps(
                    {k: v for k, v in entry.items() if k not in ("_rows", "error")}),
                    file=sys.stderr, flush=True)
                if "error" in entry:
                    print(entry["error"], file=sys.stderr, flush=True)
                result["runs"].append(entry)
                if args.output:
                    Path(args.output).write_text(json.dumps(_public(result), indent=1))
    return _public(result)


def _public(result: dict[str, Any]) -> dict[str, Any]:
    return {**result, "runs": [{k: v for k, v in r.items() if k != "_rows"}
                               for r in result["runs"]]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--shape", default="qwen0.5b", choices=list(SHAPES),
                   help="model shape, built from config with a random init")
    p.add_argument("--nprocs", type=int, nargs="+", default=[1, 2],
                   help="ranks (GPUs) per configuration; the 1-rank run is the baseline")
    p.add_argument("--fsdp", choices=("off", "on", "both"), default="off",
                   help="DDP only, FSDP2 only (N >= 2), or both at every N >= 2")
    p.add_argument("--device", default="cuda", help="cuda (NCCL) or cpu (gloo)")
    p.add_argument("--autocast", default="bf16", choices=("bf16", "none"))
    p.add_argument("--prompts", type=int, default=32,
                   help="prompts per step (per rank under --weak)")
    p.add_argument("--weak", action="store_true",
                   help="weak scaling: --prompts per rank, speedup = tokens/s ratio")
    p.add_argument("--group_size", type=int, default=8, help="rows per prompt")
    p.add_argument("--length_limit", type=int, default=256, help="most new tokens per row")
    p.add_argument("--micro_batch", type=int, default=32, help="rows per micro-batch")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps per run")
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the medians")
    p.add_argument("--compare_steps", type=int, default=3,
                   help="first steps compared with the 1-GPU run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs_dir", default="", help="keep the runs here (default: a temp dir)")
    p.add_argument("--output", default="", help="also write the JSON to this file")
    p.add_argument("extra", nargs="*", help="more `rlscope train` options, after --")
    args = p.parse_args()
    if args.warmup >= args.steps:
        p.error(f"--warmup {args.warmup} must be < --steps {args.steps}")
    if args.micro_batch < 1 or (args.prompts * args.group_size) % args.micro_batch:
        p.error(f"--micro_batch {args.micro_batch} must divide --prompts × --group_size")
    print(json.dumps(run(args), indent=1))


if __name__ == "__main__":
    main()
