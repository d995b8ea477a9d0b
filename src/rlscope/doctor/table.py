"""The doctor's input: one run's metrics as a long table (step, metric, value) in compact form.

Every importer produces `MetricTable`s, one per run it finds in a file. Values are stored per
metric in two ``array('d')`` columns (16 bytes a point), so memory grows with the number of
points kept, never with the size of the text they came from. Names are canonical (translated
through `rlscope.doctor.translate`) where a translation exists and kept as written otherwise;
``original`` and ``notes`` remember the foreign name and where its population or reduction
differs from ours. ``problems`` lists what the importer skipped, with line numbers.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Problem:
    """Something an importer skipped: where (1-based line, or None) and why."""

    line: int | None
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}" if self.line is not None else self.message


MAX_PROBLEMS = 200
"""Problems kept per table; further ones are only counted."""


@dataclass
class MetricTable:
    """One run's metrics. ``source`` names the run (file name, or run name in a W&B export);
    ``fmt`` is the format it was read as; ``config`` holds what the log says about the run
    (our ``config.json``, a TRL ``trainer_state.json``'s header) for rules that cite it."""

    source: str
    fmt: str
    config: dict[str, Any] = field(default_factory=dict)
    _steps: dict[str, array] = field(default_factory=dict)
    _values: dict[str, array] = field(default_factory=dict)
    original: dict[str, str] = field(default_factory=dict)
    """Canonical name → the name in the file, for translated metrics."""
    notes: dict[str, str] = field(default_factory=dict)
    """Canonical name → where the foreign metric's population/reduction/timing differs."""
    problems: list[Problem] = field(default_factory=list)
    n_problems: int = 0
    n_skipped_values: int = 0
    """Non-finite values (nan, inf) seen and not stored."""
    framework: str | None = None
    """Whose metric names the importer recognised (verl, trl, tinker, openrlhf), if any."""
    import_notes: list[str] = field(default_factory=list)
    """What the importer decided that changes what the rules see (duplicated steps and how they
    were resolved, sign flips, a foreign name kept because another one took its canonical
    name); printed with the diagnosis."""

    def add(self, step: float, name: str, value: float) -> None:
        """One point; non-finite values are counted, not stored."""
        if not math.isfinite(value) or not math.isfinite(step):
            self.n_skipped_values += 1
            return
        steps = self._steps.get(name)
        if steps is None:
            steps = self._steps[name] = array("d")
            self._values[name] = array("d")
        steps.append(step)
        self._values[name].append(value)

    def move(self, name: str, new_name: str) -> None:
        """Store the series ``name`` under ``new_name`` (which must be free)."""
        if new_name in self._steps:
            raise ValueError(f"{new_name!r} already has a series")
        self._steps[new_name] = self._steps.pop(name)
        self._values[new_name] = self._values.pop(name)

    def scale(self, name: str, factor: float) -> None:
        """Multiply every stored value of ``name`` by ``factor`` (a sign flip: -1)."""
        values = self._values[name]
        for i in range(len(values)):
            values[i] *= factor

    def duplicated_steps(self) -> dict[str, list[float]]:
        """Metric → the steps logged more than once for it (`series` keeps the last value)."""
        out: dict[str, list[float]] = {}
        for name, steps in self._steps.items():
            if len(steps) < 2:
                continue
            unique, counts = np.unique(np.frombuffer(steps, dtype=np.float64),
                                       return_counts=True)
            if (counts > 1).any():
                out[name] = unique[counts > 1].tolist()
        return out

    def problem(self, line: int | None, message: str) -> None:
        self.n_problems += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(Problem(line, message))

    def names(self) -> list[str]:
        return sorted(self._steps)

    def has(self, name: str, min_points: int = 1) -> bool:
        """Whether ``name`` has at least ``min_points`` points (and at least one)."""
        return len(self._steps.get(name, ())) >= max(min_points, 1)

    def series(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) sorted by step; a step logged twice keeps its last value."""
        steps = np.frombuffer(self._steps[name], dtype=np.float64)
        values = np.frombuffer(self._values[name], dtype=np.float64)
        order = np.argsort(steps, kind="stable")
        steps, values = steps[order], values[order]
        if len(steps) > 1:
            last = np.append(steps[1:] != steps[:-1], True)
            steps, values = steps[last], values[last]
        return steps.copy(), values.copy()

    def values(self, name: str) -> np.ndarray:
        return self.series(name)[1]

    def first(self, *names: str) -> str | None:
        """The first of ``names`` the table has (rules accept equivalent metrics)."""
        return next((n for n in names if self.has(n)), None)

    @property
    def n_points(self) -> int:
        return sum(len(s) for s in self._steps.values())

    @property
    def steps(self) -> tuple[float, float] | None:
        """(first, last) step over all metrics, or None for an empty table."""
        lows = [min(s) for s in self._steps.values() if len(s)]
        highs = [max(s) for s in self._steps.values() if len(s)]
        return (min(lows), max(highs)) if lows else None


class DoctorError(ValueError):
    """A file the doctor cannot read at all; the message says why and what it expected."""


@dataclass
class ImportResult:
    """What an importer read from one file: one table per run, the format it used."""

    path: str
    fmt: str
    tables: list[MetricTable]
