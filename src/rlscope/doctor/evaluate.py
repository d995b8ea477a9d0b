"""`rlscope doctor --eval DIR`: the doctor's precision and recall per rule on a labelled corpus
(issue 16, "A labelled corpus").

A corpus is a directory of cases. A case is a directory holding a log and ``expected.toml``:

```toml
log = "../../trl_grpo_trainer_state.json"   # optional: the log, relative to the case
must_find = ["entropy_collapse", "no_signal"]
must_not_find = ["kl_too_small"]
```

Without ``log``, the case directory is the log when it is an rlscope run directory (it has
``metrics.jsonl`` and ``config.json``), else the one file in it besides ``expected.toml``. A
rule *finds* a case when any finding with its id is reported, at any severity. Per rule: a
true positive is a case that must find it and does; a false negative one that must and does
not; a false positive one that must not and does. Cases that name the rule in neither list
do not count for it. Precision = TP/(TP + FP), recall = TP/(TP + FN) (None when the
denominator is 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from rlscope.doctor.diagnosis import run_doctor
from rlscope.doctor.findings import DoctorConfig
from rlscope.doctor.importers import DoctorError


@dataclass(frozen=True)
class Case:
    name: str
    log: Path
    must_find: tuple[str, ...]
    must_not_find: tuple[str, ...]


@dataclass
class RuleScore:
    tp: int = 0
    fn: int = 0
    fp: int = 0
    tn: int = 0
    missed: list[str] = field(default_factory=list)
    """Cases that must find the rule and did not."""
    false_alarms: list[str] = field(default_factory=list)
    """Cases that must not find the rule and did."""

    @property
    def precision(self) -> float | None:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    @property
    def recall(self) -> float | None:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else None

    def as_dict(self) -> dict[str, Any]:
        return {"tp": self.tp, "fn": self.fn, "fp": self.fp, "tn": self.tn,
                "precision": self.precision, "recall": self.recall,
                "missed": self.missed, "false_alarms": self.false_alarms}


@dataclass
class EvalResult:
    cases: dict[str, set[str]]
    """Case → the rule ids the doctor reported on it."""
    rules: dict[str, RuleScore]
    errors: dict[str, str] = field(default_factory=dict)

    def totals(self) -> RuleScore:
        out = RuleScore()
        for s in self.rules.values():
            out.tp, out.fn, out.fp, out.tn = out.tp + s.tp, out.fn + s.fn, out.fp + s.fp, \
                out.tn + s.tn
        return out

    def as_dict(self) -> dict[str, Any]:
        total = self.totals()
        return {"cases": {k: sorted(v) for k, v in self.cases.items()},
                "rules": {k: v.as_dict() for k, v in sorted(self.rules.items())},
                "overall": {"precision": total.precision, "recall": total.recall,
                            "tp": total.tp, "fn": total.fn, "fp": total.fp, "tn": total.tn},
                "errors": self.errors}


def load_case(directory: Path) -> Case:
    """One case directory (ValueError with what is wrong when it is not one)."""
    spec_path = directory / "expected.toml"
    spec = tomllib.loads(spec_path.read_text())
    for key in ("must_find", "must_not_find"):
        if not isinstance(spec.get(key, []), list) or not all(
                isinstance(rule, str) for rule in spec.get(key, [])):
            raise ValueError(f"{spec_path}: {key} must be a list of rule ids, e.g. "
                             f'{key} = ["entropy_collapse"]')
    if not isinstance(spec.get("log", ""), str):
        raise ValueError(f"{spec_path}: log must be a file name (a string)")
    if "log" in spec:
        log = (directory / spec["log"]).resolve()
    elif (directory / "metrics.jsonl").exists() and (directory / "config.json").exists():
        log = directory
    else:
        files = [p for p in directory.iterdir() if p.is_file() and p.name != "expected.toml"]
        if len(files) != 1:
            raise ValueError(f"{directory}: expected one log file besides expected.toml (or "
                             f"log = \"...\" in it), found {[p.name for p in files]}")
        log = files[0]
    if not log.exists():
        raise ValueError(f"{directory}: the log {log} does not exist")
    return Case(directory.name, log, tuple(spec.get("must_find", ())),
                tuple(spec.get("must_not_find", ())))


def load_corpus(directory: str | Path) -> list[Case]:
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"--eval {directory}: not a directory")
    cases = [load_case(d) for d in sorted(root.iterdir()) if (d / "expected.toml").exists()]
    if not cases:
        raise ValueError(f"--eval {directory}: no case directory (with expected.toml) in it")
    return cases


def evaluate(directory: str | Path, cfg: DoctorConfig | None = None) -> EvalResult:
    """Run the doctor on every case and score each rule."""
    result = EvalResult(cases={}, rules={})
    for case in load_corpus(directory):
        try:
            diagnoses = run_doctor(case.log, "auto", cfg)
        except (DoctorError, OSError) as e:
            result.errors[case.name] = str(e)
            diagnoses = []
        found = {f.id for d in diagnoses for f in d.findings}
        result.cases[case.name] = found
        for rule in case.must_find:
            s = result.rules.setdefault(rule, RuleScore())
            if rule in found:
                s.tp += 1
            else:
                s.fn += 1
                s.missed.append(case.name)
        for rule in case.must_not_find:
            s = result.rules.setdefault(rule, RuleScore())
            if rule in found:
                s.fp += 1
                s.false_alarms.append(case.name)
            else:
                s.tn += 1
    return result


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def to_table(result: EvalResult) -> str:
    """A Markdown table: rule, TP, FN, FP, TN, precision, recall, and the misses."""
    lines = [f"{len(result.cases)} cases", "",
             "| rule | TP | FN | FP | TN | precision | recall | missed / false alarms |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for rule, s in sorted(result.rules.items()):
        notes = ", ".join([f"missed {c}" for c in s.missed]
                          + [f"false alarm {c}" for c in s.false_alarms])
        lines.append(f"| `{rule}` | {s.tp} | {s.fn} | {s.fp} | {s.tn} | {_pct(s.precision)} | "
                     f"{_pct(s.recall)} | {notes} |")
    t = result.totals()
    lines.append(f"| **all** | {t.tp} | {t.fn} | {t.fp} | {t.tn} | {_pct(t.precision)} | "
                 f"{_pct(t.recall)} | |")
    if result.errors:
        lines += ["", "Cases that could not be read:"]
        lines += [f"- {k}: {v}" for k, v in result.errors.items()]
    return "\n".join(lines)
