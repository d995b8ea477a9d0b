"""Per-experiment figures of the evidence suite from docs/evidence/curves.csv.

    python docs/evidence/make_figures.py

curves.csv (written by collect.py) holds the sweep's mean ± SEM curves (3 seeds) for the metrics
below, training curves thinned to every 5th step (every 25th for the 1500-step chain runs). One
PNG per experiment (the run-id prefix: influence, noise, replay, credit, dense, entropy, init,
clip, scale) and metric,
drawn with the same code as `rlscope report` (`rlscope.report.figures.plot_metric`), into
docs/evidence/figures/.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import numpy as np

from rlscope.report.figures import name_colors, plot_metric, slug
from rlscope.report.tidy import Curve

HERE = Path(__file__).parent
METRICS = {
    "influence": ("eval/test_error", "eval/entropy", "adv/amplification"),
    "noise": ("eval/test_error", "eval/entropy"),
    "replay": ("eval/test_error", "eval/entropy", "replay/age"),
    "credit": ("eval/test_error", "eval/test_error_unscored", "eval/entropy"),
    "dense": ("eval/test_error", "eval/chain_reward"),
    "entropy": ("eval/test_error", "policy/entropy", "diag/entropy_delta_pos_adv",
                "diag/entropy_delta_neg_adv"),
    "init": ("eval/test_error", "eval/entropy"),
    "clip": ("eval/test_error", "eval/entropy", "diag/batch_entropy_delta"),
    "scale": ("eval/test_error", "eval/entropy"),
}


def load(path: Path) -> dict[tuple[str, str], Curve]:
    points: dict[tuple[str, str], list[tuple[float, float, float, int]]] = defaultdict(list)
    for row in csv.DictReader(path.open()):
        points[(row["name"], row["metric"])].append(
            (float(row["step"]), float(row["mean"]), float(row["sem"]), int(row["n"])))
    curves = {}
    for (name, metric), rows in points.items():
        rows.sort()
        s, m, e, n = (np.array(col) for col in zip(*rows, strict=True))
        curves[(name, metric)] = Curve(name=name, steps_S=s, mean_S=m, sem_S=e, n_S=n)
    return curves


def main() -> None:
    curves = load(HERE / "curves.csv")
    out = HERE / "figures"
    out.mkdir(exist_ok=True)
    for experiment, metrics in METRICS.items():
        names = sorted({n for n, _ in curves if n.split("-", 1)[0] == experiment})
        styles = name_colors(names)
        for metric in metrics:
            group = {n: curves[(n, metric)] for n in names if (n, metric) in curves}
            if not group:
                continue
            fig = plot_metric(metric, group, styles)
            fig.suptitle(experiment, fontsize=11)
            fig.savefig(out / f"{experiment}-{slug(metric)}.png", dpi=90,
                        metadata={"Software": None})


if __name__ == "__main__":
    main()
