"""Summarise issue 19's evidence sweeps into this directory: what each 2025-26 rule changed.

    rlscope sweep --builtin rules2026 --jobs 16 --threads 1              # sweeps/rules2026
    rlscope sweep docs/evidence/rules2026/teacher.toml --jobs 1           # sweeps/rules2026_teacher
    rlscope sweep docs/evidence/rules2026/distill.toml --jobs 9           # sweeps/rules2026_distill
    python docs/evidence/rules2026/collect.py sweeps/rules2026 sweeps/rules2026_distill

Writes, beside this file:

- ``summary.md`` / ``summary.csv``: per configuration (run id without the seed) and seed-mean
  ± sample sd (ddof = 1, n seeds): the final and best held-out test error, the final entropy,
  the first step at which the test error is ≤ 0.4 (seeds that never get there are counted
  apart), the whole-run
  mean of the policy entropy, of the entropy decomposition (``diag/*``) and of the gradient
  norm, and the difference of each to its parent (grpo, dapo or ppo under the same condition);
- ``method_metrics.md``: the whole-run means of the metrics a preset logs that its parent does
  not (the per-method metrics: clip/mask fractions, IS weights, selected-token fractions...);
- ``curves.csv``: eval/test_error and eval/entropy per configuration and evaluation step
  (mean and standard error over seeds).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).parent
REACHED = 0.4
"""The test error whose first crossing is reported (``steps to ≤ 0.4``): the constant-guess
plateau is 0.5 and no rule gets a run near 0 in 300 steps on these tasks."""
PARENT = {
    "grpo": "grpo", "dapo": "dapo", "ppo": "ppo", "grpo-1epoch": "grpo-1epoch",
    "gspo_token": "grpo", "gmpo": "grpo", "intellect2": "grpo", "dppo_tv": "grpo",
    "dppo_kl": "grpo", "clip_cov": "grpo", "kl_cov": "grpo", "dapo_forking": "dapo",
    "opo": "grpo-1epoch", "gpg": "grpo-1epoch", "scalerl": "grpo", "vapo": "ppo",
    "grpo_tis": "grpo", "grpo_mis": "grpo", "icepop": "grpo", "dsv32": "grpo",
    "opd": "grpo", "gkd": "grpo",
}
"""Each configuration's parent (the rule it is compared with, as METHODS_2026.md maps it)."""
RUN_MEANS = ("policy/entropy", "diag/batch_entropy_delta", "diag/entropy_delta_pos_adv",
             "diag/entropy_delta_neg_adv", "optim/grad_norm", "policy/approx_kl")


def _jsonl(path: Path) -> list[dict[str, float]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _finite_mean(values: list[float]) -> float:
    good = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return statistics.fmean(good) if good else math.nan


def _stats(values: list[float]) -> tuple[float, float, int]:
    good = [v for v in values if math.isfinite(v)]
    if not good:
        return math.nan, math.nan, 0
    sd = statistics.stdev(good) if len(good) > 1 else math.nan
    return statistics.fmean(good), sd, len(good)


def _fmt(values: list[float]) -> str:
    mean, sd, n = _stats(values)
    return "–" if n == 0 else f"{mean:.4g} ± {sd:.2g}"


def _run_summary(run: Path) -> dict[str, float]:
    """One run's numbers: final eval, steps to ≤ REACHED, whole-run means of every metric."""
    metrics = _jsonl(run / "metrics.jsonl") or _jsonl(run / "metrics_thin.jsonl")
    evals = _jsonl(run / "eval.jsonl")
    status = json.loads((run / "status.json").read_text()) if (run / "status.json").exists() \
        else {}
    out: dict[str, float] = {"completed": float(status.get("status") == "completed"),
                             "out_of_regime": float(status.get("status") == "out_of_regime"),
                             "steps_run": float(status.get("steps", math.nan))}
    if evals:
        out["final_test_error"] = float(evals[-1].get("eval/test_error", math.nan))
        out["final_eval_entropy"] = float(evals[-1].get("eval/entropy", math.nan))
        out["best_test_error"] = min(float(e.get("eval/test_error", math.nan)) for e in evals)
        reached = [e["step"] for e in evals if e.get("eval/test_error", 1.0) <= REACHED]
        out["steps_to_reached"] = float(reached[0]) if reached else math.nan
    keys = {k for row in metrics for k in row if k != "step"}
    for key in sorted(keys):
        out["mean:" + key] = _finite_mean([row[key] for row in metrics if key in row])
    return out


def _run_dirs(sweep: Path) -> list[Path]:
    """The run directories of a sweep (``sweep/runs/*``) or of an unpacked copy of one
    (``sweep/*`` holding config.json)."""
    root = sweep / "runs" if (sweep / "runs").is_dir() else sweep
    return [run for run in sorted(root.iterdir()) if (run / "config.json").exists()]


def _configurations(sweeps: list[Path]) -> dict[str, list[dict[str, float]]]:
    named: dict[str, list[dict[str, float]]] = defaultdict(list)
    for sweep in sweeps:
        for run in _run_dirs(sweep):
            named[run.name.rsplit("_s", 1)[0]].append(_run_summary(run))
    return named


def _split(name: str) -> tuple[str, str]:
    """``clean-gmpo`` → (``clean``, ``gmpo``)."""
    condition, _, rule = name.partition("-")
    return condition, rule


def _parent(name: str, named: dict[str, list[dict[str, float]]]) -> str | None:
    condition, rule = _split(name)
    parent = PARENT.get(rule)
    if parent is None or parent == rule:
        return None
    key = f"{condition}-{parent}"
    return key if key in named else None


def _column(runs: list[dict[str, float]], key: str) -> list[float]:
    return [r.get(key, math.nan) for r in runs]


def _stopped(runs: list[dict[str, float]]) -> str:
    """How many seeds stopped as out_of_regime (10 batches in a row without a group of mixed
    rewards: no learning signal left), with the steps each ran."""
    stopped = [int(r["steps_run"]) for r in runs if r.get("out_of_regime")]
    return "0" if not stopped else f"{len(stopped)} ({', '.join(map(str, stopped))})"


def write(sweeps: list[Path], out: Path) -> None:
    named = _configurations(sweeps)
    order = sorted(named, key=lambda n: (
        _split(n)[0], PARENT.get(_split(n)[1], "~") != _split(n)[1], _split(n)[1]))
    header = ["configuration", "parent", "seeds", "final test error", "Δ vs parent",
              "best test error", f"reached ≤ {REACHED}", f"steps to ≤ {REACHED}",
              "no signal (steps run)",
              "final eval entropy", "mean policy entropy",
              "mean batch Δentropy", "mean Δentropy (A>0)", "mean Δentropy (A<0)",
              "mean grad norm"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    rows_csv = []
    for name in order:
        runs = named[name]
        parent = _parent(name, named)
        err = _column(runs, "final_test_error")
        delta = "–"
        if parent is not None:
            d = _stats(err)[0] - _stats(_column(named[parent], "final_test_error"))[0]
            delta = f"{d:+.3f}"
        steps = _column(runs, "steps_to_reached")
        reached = sum(math.isfinite(s) for s in steps)
        cells = [name, parent or "–", str(len(runs)), _fmt(err), delta,
                 _fmt(_column(runs, "best_test_error")), f"{reached}/{len(runs)}",
                 _fmt(steps), _stopped(runs), _fmt(_column(runs, "final_eval_entropy"))]
        cells += [_fmt(_column(runs, "mean:" + k)) for k in
                  ("policy/entropy", "diag/batch_entropy_delta", "diag/entropy_delta_pos_adv",
                   "diag/entropy_delta_neg_adv", "optim/grad_norm")]
        lines.append("| " + " | ".join(cells) + " |")
        row = {"configuration": name, "parent": parent or "", "seeds": len(runs),
               "reached": reached,
               "out_of_regime": int(sum(_column(runs, "out_of_regime")))}
        for key in ("final_test_error", "best_test_error", "steps_to_reached",
                    "final_eval_entropy",
                    *("mean:" + k for k in RUN_MEANS)):
            mean, sd, n = _stats(_column(runs, key))
            row[key] = mean
            row[key + "_sd"] = sd
            row[key + "_n"] = n
        rows_csv.append(row)
    out.joinpath("summary.md").write_text(
        "# Issue 19 evidence: each 2025-26 rule beside its parent\n\n"
        "Generated by `collect.py` (its docstring has the commands). Values are the mean ± "
        "sample sd over seeds; 'reached' counts the seeds whose held-out test error reached "
        f"{REACHED} at an evaluation (every 20 steps); 'steps to' averages over those seeds "
        "only; 'no signal' counts the seeds that stopped as out_of_regime (10 batches in a row "
        "without a group of mixed rewards; their final test error is their last evaluation) "
        "with the steps each ran; Δ vs parent is the difference of the mean final test "
        "errors. Whole-run means "
        "are over the logged training steps the collected files hold (every 5th step of the "
        "committed thin logs, plus every step with the entropy decomposition).\n\n"
        + "\n".join(lines) + "\n", encoding="utf-8")
    with out.joinpath("summary.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows_csv[0]))
        writer.writeheader()
        writer.writerows(rows_csv)
    _method_metrics(named, order, out)
    _curves(sweeps, out)


def _method_metrics(named: dict[str, list[dict[str, float]]], order: list[str],
                    out: Path) -> None:
    lines = ["# Per-method metrics (whole-run means, mean ± sd over seeds)\n",
             "The metrics each preset logs that its parent does not, plus the sampler/learner "
             "agreement metrics of the rollout-correction presets.\n"]
    for name in order:
        parent = _parent(name, named)
        if parent is None:
            continue
        own = {k for r in named[name] for k in r if k.startswith("mean:")}
        theirs = {k for r in named[parent] for k in r if k.startswith("mean:")}
        keys = sorted(own - theirs)
        if _split(name)[1] in ("grpo_tis", "grpo_mis", "icepop", "dsv32"):
            keys += sorted(k for k in own if k.startswith("mean:sampler/") and k not in keys)
        if not keys:
            continue
        lines.append(f"\n## {name} (parent {parent})\n\n| metric | {name} | {parent} |\n"
                     "| --- | --- | --- |")
        for key in keys:
            lines.append(f"| `{key[5:]}` | {_fmt(_column(named[name], key))} | "
                         f"{_fmt(_column(named[parent], key))} |")
    out.joinpath("method_metrics.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _curves(sweeps: list[Path], out: Path) -> None:
    series: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for sweep in sweeps:
        for run in _run_dirs(sweep):
            name = run.name.rsplit("_s", 1)[0]
            for row in _jsonl(run / "eval.jsonl"):
                for metric in ("eval/test_error", "eval/entropy"):
                    if metric in row:
                        series[(name, metric, int(row["step"]))].append(float(row[metric]))
    with out.joinpath("curves.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["configuration", "metric", "step", "mean", "sem", "n"])
        for (name, metric, step), values in sorted(series.items()):
            mean, sd, n = _stats(values)
            sem = sd / math.sqrt(n) if n > 1 else math.nan
            writer.writerow([name, metric, step, f"{mean:.6g}", f"{sem:.3g}", n])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweeps", nargs="+", type=Path, help="sweep directories to summarise")
    parser.add_argument("--out", type=Path, default=HERE, help="where to write (default: here)")
    args = parser.parse_args()
    write(args.sweeps, args.out)


if __name__ == "__main__":
    main()
