"""RLHF against a learned reward model on CPU, per seed: `rlscope sft` → `rlscope rm` → PPO
against the RM with its adaptive KL to the SFT model, the same PPO with a KL coefficient too
small to matter, and GRPO with its k3 KL pointed at the SFT model. Prints the Markdown tables
of docs/recipes.md ("RLHF against a learned reward model").

    OMP_NUM_THREADS=1 python benchmarks/rlhf_preference_rm.py --seeds 0 1 > /tmp/rlhf.md

Runs one after another (parallel runs on 2 cores oversubscribe the threads); about 5 minutes
per seed on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from rlscope.metrics.sinks import read_jsonl

COMMON = ["--task", "preference_rm", "--device", "cpu", "--threads", "1", "--no_progress"]
SFT = ["sft", "--num_steps", "600", "--batch_size", "64", "--lr", "3e-3", "--eval_every", "0",
       "--eval_batches", "2", "--eval_batch_size", "100"]
RM = ["rm", "--num_steps", "300", "--batch_size", "64", "--lr", "1e-3", "--eval_every", "100"]
RL = ["train", "--num_steps", "150", "--batch_size", "64", "--lr", "3e-4", "--eval_every", "25",
      "--eval_batches", "2", "--eval_batch_size", "100"]
ARMS = {"ppo_kl": ("PPO, KL (adaptive, β₀ 0.2)", ["--method", "ppo"]),
        "ppo_small_kl": ("PPO, KL too small (fixed β 0.001)",
                         ["--method", "ppo", "--kl_control", "fixed", "--kl_coef", "0.001"]),
        "grpo_kl": ("GRPO, k3 KL to ref in the loss (β 0.04)",
                    ["--method", "grpo", "--kl_target", "ref"])}


def run(args: list[str], runs: Path, name: str) -> float:
    """Run ``rlscope ARGS`` into ``runs/name``; returns its wall time in seconds."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rlscope.cli", *args, *COMMON, "--runs_dir",
                    str(runs), "--name", name], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--runs_dir", default="runs/rlhf_bench")
    a = parser.parse_args()
    runs = Path(a.runs_dir)
    summary = ["| seed | RM held-out acc. | RM probe acc. | run | true pref. step 0 → best → 150 "
               "| RM score step 0 → 150 | KL to ref (last 10 steps) | wall: SFT / RM / PPO |",
               "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    curves = ["| seed | run | " + " | ".join(f"step {s}" for s in range(0, 151, 25)) + " |",
              "| --- | --- | " + " | ".join("---" for _ in range(0, 151, 25)) + " |"]
    for seed in a.seeds:
        s = ["--seed", str(seed)]
        t_sft = run([*SFT, *s], runs, f"sft_s{seed}")
        t_rm = run([*RM, *s], runs, f"rm_s{seed}")
        rm_eval = read_jsonl(runs / f"rm_s{seed}" / "metrics.jsonl")[-1]
        for key, (arm, extra) in ARMS.items():
            name = f"{key}_s{seed}"
            t_rl = run([*RL, *s, "--init", str(runs / f"sft_s{seed}"), "--rm_path",
                        str(runs / f"rm_s{seed}"), *extra], runs, name)
            evals = read_jsonl(runs / name / "eval.jsonl")
            steps = read_jsonl(runs / name / "metrics.jsonl")
            true = [e["eval/true_reward"] for e in evals]
            kl = sum(r["policy/kl_ref_seq_k1"] for r in steps[-10:]) / 10
            summary.append(
                f"| {seed} | {rm_eval['rm/heldout_accuracy']:.3f} | "
                f"{rm_eval['rm/probe_accuracy']:.3f} | {arm} | {true[0]:.2f} → {max(true):.2f} "
                f"→ {true[-1]:.2f} | {evals[0]['eval/rm_score']:.2f} → "
                f"{evals[-1]['eval/rm_score']:.2f} | {kl:.2f} nats | {t_sft:.0f} s / "
                f"{t_rm:.0f} s / {t_rl:.0f} s |")
            curves.append(f"| {seed} | {arm} | " + " | ".join(
                f"{e['eval/true_reward']:.2f} / {e['eval/rm_score']:.2f}" for e in evals) + " |")
            sys.stderr.write(summary[-1] + "\n")
    commands = [shlex.join(["rlscope", *SFT]), shlex.join(["rlscope", *RM]),
                shlex.join(["rlscope", *RL])]
    sys.stdout.write("\n".join(summary) + "\n\ntrue preference / RM score of the greedy "
                     "held-out answers:\n\n" + "\n".join(curves) + "\n\n" +
                     json.dumps(commands, indent=1) + "\n")


if __name__ == "__main__":
    main()
