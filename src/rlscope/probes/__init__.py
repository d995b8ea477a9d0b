"""Probes: measurements that are not training runs (``rlscope probe NAME``; COMPANIONS.md §0).

`PROBES` is one literal dict, name → `rlscope.probes.base.ProbeSpec` (options class, run
function, description). Each probe writes ``<out_dir>/<name>.csv`` (a row per seed and setting)
and ``<out_dir>/summary.md`` (seed means, fitted slopes).
"""

from __future__ import annotations

from pathlib import Path

from rlscope.probes.base import ProbeOptions, ProbeResult, ProbeSpec, write_result
from rlscope.probes.learnability_drift import DriftConfig, run_drift
from rlscope.probes.opd_variance import OpdVarianceConfig
from rlscope.probes.opd_variance import run as run_opd_variance
from rlscope.probes.puzzle_topology import PuzzleConfig, run_puzzles

PROBES: dict[str, ProbeSpec] = {
    "opd_variance": ProbeSpec(
        OpdVarianceConfig, run_opd_variance,
        "OPD: variance of the sequence / token policy-gradient and full-vocabulary reverse-KL "
        "estimators against the horizon, with the log-log slope (COMPANIONS.md §1)."),
    "learnability_drift": ProbeSpec(
        DriftConfig, run_drift,
        "Learnability: drift of the success probability q under group policy gradient against "
        "the start q₀, K and the normalisation (slope of log drift on log q₀, std/mean ratio, "
        "conversion time per halving)."),
    "puzzle_topology": ProbeSpec(
        PuzzleConfig, run_puzzles,
        "Learnability: on a synthetic puzzle set, exact vs sampled reward and mixed-group rate "
        "per horizon, strict vs replay actions and replay's post-error share."),
}


def run_probe(name: str, cfg: ProbeOptions) -> tuple[ProbeResult, Path, Path]:
    """Run the registered probe ``name`` with its options ``cfg`` and write its CSV and
    summary into ``cfg.out_dir``; returns the result and both paths."""
    if name not in PROBES:
        raise ValueError(f"unknown probe {name!r}; valid probes: {', '.join(PROBES)}")
    spec = PROBES[name]
    if not isinstance(cfg, spec.config):
        raise TypeError(f"probe {name!r} takes a {spec.config.__name__}")
    result = spec.run(cfg)
    csv_path, summary_path = write_result(result, name, Path(cfg.out_dir))
    return result, csv_path, summary_path


__all__ = ["PROBES", "ProbeResult", "ProbeSpec", "run_probe"]
