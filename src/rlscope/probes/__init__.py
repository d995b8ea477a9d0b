"""Probes: measurements that are not training runs (``rlscope probe NAME``; COMPANIONS.md §0).

Each probe is a frozen config (parsed by tyro) and a ``run`` function that writes
``<name>.csv`` (a row per seed and setting) and ``summary.md`` into its ``--output``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlscope.probes import opd_variance


@dataclass(frozen=True)
class Probe:
    """A registered probe: its config class and the function that runs it."""

    config: type
    run: Callable[[Any], object]
    description: str


PROBES: dict[str, Probe] = {
    "opd_variance": Probe(opd_variance.OpdVarianceConfig, opd_variance.run,
                          "variance of OPD gradient estimators against the horizon "
                          "(COMPANIONS.md §1)"),
}
