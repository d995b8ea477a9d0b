"""Hand-built run and sweep directories for the report tests (no training, no torch).

`make_sweep` writes what ``rlscope sweep`` writes: ``results.csv`` in tidy long form, a run
directory per (name, seed) with the same values in its JSONL files, ``sweep.json`` (with a
record per run) and ``crossings.csv``; plus `FAILED`, a run that failed before logging (a
directory with only ``config.json``, no rows, its error in ``sweep.json``). Values are a
closed-form function of (name, seed, step), so a test can recompute any mean or standard
error by hand with `value`.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

NAMES = {"beta": "dg", "alpha": "grpo"}
"""name → method; deliberately not in sorted order (colours follow the sorted names)."""
SEEDS = (0, 1, 2)
TRAIN_STEPS = tuple(range(10))
EVAL_STEPS = (0, 5, 9)
TRAIN_METRICS = ("reward/mean", "policy/entropy")
EVAL_METRICS = ("eval/test_error", "eval/entropy")
FAILED = ("beta_s3", "beta", 3, "RuntimeError: CUDA out of memory")
"""(run, name, seed, error) of the run that failed before logging anything."""
CROSSINGS = [["name", "metric", "threshold", "step_mean", "step_sd", "n"],
             ["alpha", "eval/test_error", "0.5", "5", "0", "3"],
             ["beta", "eval/test_error", "0.5", "9", "0", "2"]]


def value(name: str, seed: int, step: int, metric: str) -> float:
    """The logged value: a per-name trend plus a seed offset (exact in binary floating
    point, so hand computations match to the last bit where they can)."""
    base = {"alpha": 1.0, "beta": 2.0}[name]
    slope = {"reward/mean": 0.125, "policy/entropy": -0.0625, "eval/test_error": -0.0625,
             "eval/entropy": -0.03125}[metric]
    return base + slope * step + 0.25 * seed * (1 + (metric == "eval/test_error"))


def config(name: str, method: str, seed: int) -> dict[str, object]:
    """A config.json with the keys the report reads."""
    return {
        "config": {"method": method, "task": "token_reversal",
                   "run": {"seed": seed, "name": f"{name}_s{seed}", "num_steps": len(TRAIN_STEPS),
                           "batch_size": 16, "inner_epochs": 1, "num_minibatches": 1},
                   "model": {"arch": "tiny", "d_model": 64}, "sampling": {"temperature": 1.0},
                   "optim": {"lr": 0.001}, "components": {"advantage": None}},
        "derived": {"group_size": 8, "num_prompts": 2, "max_new_tokens": 4},
        "method_spec": {"description": f"{method} for the test", "source": "test",
                        "advantage": {"name": "group_zscore"}, "gate": {"name": "none"},
                        "objective": {"name": "ppo_clip", "clip_low": 0.2}, "agg": "token_mean",
                        "kl": {"coef": 0.04, "estimator": "k3", "target": "behaviour",
                               "place": "loss", "control": "fixed"},
                        "selection": "none", "correction": {"name": "none"}},
        "task_description": "token_reversal: reverse 4 tokens",
        "rlscope_version": "0.1.0", "torch_version": "2.13.0+cpu", "python_version": "3.11.7",
        "git_commit": "abc123", "device": "cpu", "torch_threads": 1, "platform": "Linux-test",
    }


def write_run_dir(run_dir: Path, name: str, method: str, seed: int) -> None:
    """metrics.jsonl, eval.jsonl, samples.jsonl (steps 0 and 9), status.json, config.json."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(config(name, method, seed)))
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, **{m: value(name, seed, s, m) for m in TRAIN_METRICS}}) + "\n"
        for s in TRAIN_STEPS))
    (run_dir / "eval.jsonl").write_text("".join(
        json.dumps({"step": s, **{m: value(name, seed, s, m) for m in EVAL_METRICS}}) + "\n"
        for s in EVAL_STEPS))
    (run_dir / "samples.jsonl").write_text("".join(
        json.dumps({"step": s, "prompt": [0, 1, i, 2], "completion": [i, 1, 0],
                    "reward": 0.25 * i, "advantage": 0.5 - 0.25 * i}) + "\n"
        for s in (0, TRAIN_STEPS[-1]) for i in range(4)))
    (run_dir / "status.json").write_text(json.dumps(
        {"status": "completed", "steps": len(TRAIN_STEPS), "wall_time_s": 1.5}))


def make_sweep(root: Path) -> Path:
    """A sweep directory of 2 names × 3 seeds; returns its path."""
    root.mkdir(parents=True, exist_ok=True)
    rows, records = [], []
    for name, method in NAMES.items():
        for seed in SEEDS:
            run = f"{name}_s{seed}"
            write_run_dir(root / "runs" / run, name, method, seed)
            records.append({"run": run, "name": name, "seed": seed, "status": "completed",
                            "wall_time_s": 1.5, "error": ""})
            for kind, steps, metrics in (("train", TRAIN_STEPS, TRAIN_METRICS),
                                         ("eval", EVAL_STEPS, EVAL_METRICS)):
                rows += [[run, name, method, seed, kind, s, m, value(name, seed, s, m)]
                         for s in steps for m in metrics]
    with (root / "results.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "name", "method", "seed", "kind", "step", "metric", "value"])
        w.writerows(rows)
    run, name, seed, error = FAILED
    (root / "runs" / run).mkdir()
    (root / "runs" / run / "config.json").write_text(json.dumps(config(name, NAMES[name], seed)))
    records.append({"run": run, "name": name, "seed": seed, "status": "failed",
                    "wall_time_s": 0.5, "error": error})
    (root / "sweep.json").write_text(json.dumps(
        {"name": "ablation", "manifest": "[sweep]\nseeds = [0, 1, 2]\n", "seeds": list(SEEDS),
         "machine": {"device": "cpu", "cpu_count": 2}, "runs": records}))
    with (root / "crossings.csv").open("w", newline="") as f:
        csv.writer(f).writerows(CROSSINGS)
    return root
