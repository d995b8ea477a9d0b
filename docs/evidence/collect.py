"""Copy a finished evidence sweep into docs/evidence: its tables, thinned curves and run summaries.

    rlscope sweep --builtin evidence --jobs 16 --threads 1            # on a GPU: sweeps/evidence
    rlscope sweep docs/evidence/noise_seeds.toml --jobs 16 --threads 1  # sweeps/noise_seeds
    python docs/evidence/collect.py sweeps/evidence --noise_seeds sweeps/noise_seeds
    python docs/evidence/make_figures.py

Writes, beside this file: ``final.md`` / ``final.csv`` and ``crossings.md`` / ``crossings.csv``
(copied from the sweep), ``curves.csv`` (the sweep's mean ± SEM curves of the metrics the
figures draw; training curves thinned to every 5th step, every 25th for the 1500-step
chain_reversal runs) and ``summary.md`` (whole-run means the final tables cannot show: the age
of the replayed batches, the entropy-change decomposition, and the 10-seed reward-noise runs).
Means across seeds are mean ± sample sd (ddof = 1), n = the number of seeds.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import statistics
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).parent
CURVE_METRICS = ("eval/test_error", "eval/entropy", "eval/test_error_unscored",
                 "eval/chain_reward", "reward/mean", "policy/entropy", "adv/amplification",
                 "replay/age", "diag/batch_entropy_delta", "diag/entropy_delta_pos_adv",
                 "diag/entropy_delta_neg_adv", "diag/cov_pi_dlogit")
DIAG = (("diag/batch_entropy_delta", "whole run", None),
        ("diag/batch_entropy_delta", "steps ≤ 100", 100),
        ("diag/entropy_delta_pos_adv", "whole run", None),
        ("diag/entropy_delta_neg_adv", "whole run", None),
        ("diag/cov_pi_dlogit", "whole run", None))
PLATEAU = 0.45
"""A final test error at or above this is the constant-guess plateau (≈ 0.5) or worse."""


def _fmt(values: list[float]) -> str:
    if not values:
        return "–"
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else math.nan
    return f"{mean:.4g} ± {sd:.2g} ({len(values)})"


def _runs(sweep: Path) -> dict[str, list[Path]]:
    """Run directories by name (the run id without its ``_s<seed>``), seeds in order."""
    named: dict[str, list[Path]] = defaultdict(list)
    for run in sorted(sweep.joinpath("runs").iterdir()):
        named[run.name.rsplit("_s", 1)[0]].append(run)
    return named


def _series(run: Path, metric: str) -> list[tuple[int, float]]:
    out = []
    log = "eval.jsonl" if metric.startswith("eval/") else "metrics.jsonl"
    with run.joinpath(log).open(encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            value = row.get(metric)
            if isinstance(value, int | float) and math.isfinite(value):
                out.append((int(row["step"]), float(value)))
    return out


def _config(run: Path) -> dict:
    return json.loads(run.joinpath("config.json").read_text(encoding="utf-8"))


def thin_curves(sweep: Path) -> int:
    rows = []
    with sweep.joinpath("curves.csv").open(encoding="utf-8") as f:
        reader = csv.DictReader(f)
        fields = reader.fieldnames
        for row in reader:
            if row["metric"] not in CURVE_METRICS:
                continue
            every = 25 if row["name"].startswith("dense-") else 5
            if row["kind"] == "train" and int(row["step"]) % every:
                continue
            rows.append(row)
    assert fields is not None
    with HERE.joinpath("curves.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)


def replay_table(named: dict[str, list[Path]]) -> list[str]:
    lines = ["## Age of the replayed batch", "",
             "Mean of `replay/age` (the age of the batch each step trained on) over the steps "
             "after the warm-up (step ≥ delay), per seed; then mean ± sd (n) across seeds.", "",
             "| name | mean replay age | per seed |", "| --- | --- | --- |"]
    for name, runs in named.items():
        if not name.startswith("replay-"):
            continue
        delay = int(_config(runs[0])["config"]["run"]["delay"])
        per_seed = [statistics.fmean(v for s, v in series if s >= delay)
                    for run in runs if (series := _series(run, "replay/age"))]
        lines.append(f"| {name} | {_fmt(per_seed)} | "
                     + ", ".join(f"{v:.2f}" for v in per_seed) + " |")
    return lines


def diag_table(named: dict[str, list[Path]]) -> list[str]:
    lines = ["## Entropy-change decomposition", "",
             "Entropy diagnostics (`--entropy_diagnostics`, measured on the trained batch before "
             "and after each evaluation step's update): the mean over a run's evaluation steps, "
             "per seed; then mean ± sd (n) across seeds. `batch_entropy_delta` is the change of "
             "the batch's mean token entropy; `entropy_delta_pos_adv` / `_neg_adv` the change on "
             "tokens with A > 0 / A < 0 (negative = entropy lost).", "",
             "| name | " + " | ".join(f"`{m.split('/')[1]}` ({when})" for m, when, _ in DIAG)
             + " |", "| --- |" + " --- |" * len(DIAG)]
    for name, runs in named.items():
        if not _series(runs[0], "diag/batch_entropy_delta"):
            continue
        cells = []
        for metric, _, last in DIAG:
            per_seed = [statistics.fmean(v for s, v in series if last is None or s <= last)
                        for run in runs if (series := _series(run, metric))]
            cells.append(_fmt(per_seed))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def noise_table(noise_sweep: Path) -> list[str]:
    lines = ["## Reward noise over 10 seeds", "",
             f"`{noise_sweep.name}` (docs/evidence/noise_seeds.toml): the noise-* settings with "
             "seeds 0–9. Final test error and entropy: mean ± sd (n); the last column counts the "
             f"seeds that end at the constant-guess plateau or worse (test error ≥ {PLATEAU}).", "",
             "| name | test error | entropy | seeds ≥ plateau | test error per seed |",
             "| --- | --- | --- | --- | --- |"]
    for name, runs in _runs(noise_sweep).items():
        err = [_series(run, "eval/test_error")[-1][1] for run in runs]
        ent = [_series(run, "eval/entropy")[-1][1] for run in runs]
        lines.append(f"| {name} | {_fmt(err)} | {_fmt(ent)} | "
                     f"{sum(e >= PLATEAU for e in err)}/{len(err)} | "
                     + ", ".join(f"{e:.3f}" for e in err) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", type=Path, help="the evidence sweep directory")
    parser.add_argument("--noise_seeds", type=Path, default=None,
                        help="the noise_seeds sweep directory (optional)")
    args = parser.parse_args()
    for name in ("final.md", "final.csv", "crossings.md", "crossings.csv"):
        shutil.copyfile(args.sweep / name, HERE / name)
    n_points = thin_curves(args.sweep)
    named = _runs(args.sweep)
    lines = ["# Run summaries", "", "Written by `docs/evidence/collect.py` from the sweep's "
             "run directories.", "", *replay_table(named), "", *diag_table(named)]
    if args.noise_seeds is not None:
        lines += ["", *noise_table(args.noise_seeds)]
    HERE.joinpath("summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {HERE}/final.*, crossings.*, curves.csv ({n_points} points), summary.md")


if __name__ == "__main__":
    main()
