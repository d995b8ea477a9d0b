"""The doctor during training: the same rules, run every few steps on the run's own history.

`LiveDoctor` keeps a `MetricTable` that grows by one record a step (no re-reading of files).
Every ``every`` steps it runs the rules (not the summary tables, so a check costs a few
milliseconds) and returns the findings that fired for the first time; the training loop prints
each as a one-line alert. At the end `final` gives the full diagnosis that becomes the run's
``findings.json``.
"""

from __future__ import annotations

from typing import Any

from rlscope.doctor.diagnosis import Diagnosis, diagnose_table
from rlscope.doctor.findings import DoctorConfig, Finding
from rlscope.doctor.rules import diagnose
from rlscope.doctor.table import MetricTable


class LiveDoctor:
    def __init__(self, every: int, config: dict[str, Any], source: str,
                 cfg: DoctorConfig | None = None) -> None:
        self.every = every
        self.cfg = cfg or DoctorConfig()
        self.table = MetricTable(source=source, fmt="run", config=config)
        self.alerted: set[str] = set()
        self._records = 0

    def add(self, record: dict[str, float]) -> None:
        """One metrics or evaluation record (``step`` plus metric values)."""
        step = float(record["step"])
        for name, value in record.items():
            if name != "step" and isinstance(value, (int, float)):
                self.table.add(step, name, float(value))

    def step(self, record: dict[str, float]) -> list[Finding]:
        """Add a training step's record; every ``every`` records, the new findings."""
        self.add(record)
        self._records += 1
        if self.every <= 0 or self._records % self.every:
            return []
        findings, _ = diagnose(self.table, self.cfg)
        new = [f for f in findings if f.id not in self.alerted
               and f.severity in ("warning", "critical")]
        self.alerted |= {f.id for f in new}
        return new

    def final(self) -> Diagnosis:
        return diagnose_table(self.table, self.cfg)


def alert_line(f: Finding) -> str:
    """The one-line alert for a newly fired finding."""
    cause = f" (likely cause: {', '.join(f.causes)})" if f.causes else ""
    at = f" at step {f.step:g}" if f.step is not None else ""
    return f"doctor {f.severity}: {f.id}{at}: {f.title}{cause}"
