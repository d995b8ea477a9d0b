"""Plan each run of a sweep from what its directory holds, and verify finished runs.

- ``skip``: ``status.json`` says the run finished (`FINAL`), ``config.json`` holds the
  configuration the manifest now gives (settings such as threads aside, `NOT_COMPARED`), and
  the files bear it out (`verify_run`: the step count, one parseable record per expected step
  in ``metrics.jsonl``, the expected evaluations in ``eval.jsonl`` up to the final one);
- ``resume``: a checkpoint (the newest ``checkpoints/step_<N>.pt``, `checkpoint_step`) of
  the same configuration, no verified final status, and intact logs before the checkpoint's
  step: `train` continues from it with ``--resume``, dropping the records logged from that
  step on (`rlscope.train.open_run`, from the checkpoint it does load); the resumed run
  writes them again (bit for bit, every random stream derives from the seed and the
  checkpointed state);
- ``restart``: anything else of the same run (no checkpoint, damaged logs, a configuration the
  manifest no longer gives) is deleted and the run starts clean;
- ``fail``: a directory that cannot be this run's or anyone's (``config.json`` unreadable or not
  JSON, or not a directory) is left alone and the run fails with that reason;
- ``run``: no directory yet.

No file a run directory holds makes planning raise (`safe_plan`): whatever cannot be read is a
reason for this run's plan.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlscope.checkpoint import checkpoint_files
from rlscope.config import TrainConfig, to_dict
from rlscope.sweep.manifest import RunSpec

Plan = Literal["run", "skip", "resume", "restart", "fail"]
FINAL = ("completed", "out_of_regime", "diverged")
"""Statuses of a run that ended by itself; running it again would end the same way."""
NOT_COMPARED = ("resume", "progress", "threads", "jobs", "num_seeds", "runs_dir", "name",
                "env_workers")
"""``run.*`` fields left out when a run directory's config is compared with the manifest's:
where the directory lies and how the run executes, not what it computes (threads can change
float rounding, see docs/training.md, "Several seeds", but not what the run means), so that
another ``--jobs``, ``--threads`` or ``--output`` path does not restart finished runs."""
LOGS = ("metrics.jsonl", "eval.jsonl", "samples.jsonl")


class Corrupt(ValueError):
    """A run file that cannot be read as what it should be; the message says which and why."""


def _same_config(spec: RunSpec, stored: dict[str, Any]) -> bool:
    """Whether a run directory's ``config.json`` config is the one the manifest gives now."""
    def normal(cfg: dict[str, Any]) -> dict[str, Any]:
        run = cfg.get("run", {})
        run = {k: v for k, v in run.items() if k not in NOT_COMPARED} \
            if isinstance(run, dict) else run
        return {**cfg, "run": run}

    mine = json.loads(json.dumps(to_dict(spec.config)))
    return normal(mine) == normal(stored)


def json_object(path: Path) -> dict[str, Any] | None:
    """A JSON file holding one object; None when the file does not exist, `Corrupt` when it
    cannot be read, is not text, is not JSON or holds something else than an object."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise Corrupt(f"{path.name} cannot be read ({e.strerror})") from None
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise Corrupt(f"{path.name} is not text") from None
    except json.JSONDecodeError as e:
        raise Corrupt(f"{path.name} is not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(value, dict):
        raise Corrupt(f"{path.name} holds a JSON {type(value).__name__}, not an object")
    return value


def read_json(path: Path) -> dict[str, Any] | None:
    """`json_object`, with None for a file that cannot be read either."""
    try:
        return json_object(path)
    except Corrupt:
        return None


@dataclass(frozen=True)
class Log:
    """A run's JSONL log as read from disk."""

    records: list[dict[str, Any]]
    """The records that parse: JSON objects with an integer ``step``, in file order."""
    bad: list[int]
    """1-based numbers of the lines that do not (not JSON, not text, no integer step)."""
    cut_off: bool
    """The last line is unfinished (no newline) and does not parse: a write cut by a kill."""

    @property
    def steps(self) -> list[int]:
        """Each record's step, in file order."""
        return [int(r["step"]) for r in self.records]

    def damaged(self, name: str, allow_cut_off: bool) -> str:
        """Why the log cannot be trusted ("" if it can): a line that does not parse other
        than, where ``allow_cut_off``, an unfinished last line."""
        bad = self.bad[:-1] if allow_cut_off and self.cut_off else self.bad
        return f"{name} line {bad[0]} is not a JSON record with a step" if bad else ""


def _record(raw: bytes) -> dict[str, Any] | None:
    """One JSONL line as a record with an integer step, or None."""
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return record if isinstance(step, int) and not isinstance(step, bool) else None


def read_log(path: Path) -> Log:
    """Read a JSONL log line by line, whatever it holds (a missing file is an empty log)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = b""
    except OSError as e:
        raise Corrupt(f"{path.name} cannot be read ({e.strerror})") from None
    lines = data.split(b"\n")
    records: list[dict[str, Any]] = []
    bad: list[int] = []
    for number, raw in enumerate(lines, 1):
        if raw.strip():
            record = _record(raw)
            if record is None:
                bad.append(number)
            else:
                records.append(record)
    cut_off = bool(lines[-1].strip()) and bool(bad) and bad[-1] == len(lines)
    return Log(records, bad, cut_off)


def expected_steps(cfg: TrainConfig) -> tuple[range, list[int]]:
    """The steps a finished run logs: train records (``metrics.jsonl``; one per step from 0,
    since every step trains, the staleness warm-up on the fresh batch) and the evaluations
    before the last (``eval.jsonl``, every ``eval_every`` steps from ``delay``); a completed
    run adds its final evaluation at ``num_steps``."""
    r = cfg.run
    evals = [s for s in range(r.delay, r.num_steps)
             if r.eval_every and (s - r.delay) % r.eval_every == 0]
    return range(0, r.num_steps), evals


def _spans(steps: Sequence[int], limit: int = 4) -> str:
    """``1, 4-7, 9`` (the first ``limit`` runs of consecutive steps)."""
    spans: list[list[int]] = []
    for s in sorted(steps):
        if spans and s == spans[-1][1] + 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans[:limit])
    return text + (", ..." if len(spans) > limit else "")


def _steps_problem(name: str, steps: Sequence[int], expected: Sequence[int]) -> str:
    """How a log's steps differ from the expected ones ("" if they are the same)."""
    if list(steps) == list(expected):
        return ""
    seen: set[int] = set()
    repeated = {s for s in steps if s in seen or seen.add(s)}  # type: ignore[func-returns-value]
    missing = set(expected) - seen
    extra = seen - set(expected)
    parts = [f"lacks step{'s' * (len(missing) > 1)} {_spans(list(missing))}"] if missing else []
    parts += [f"repeats step{'s' * (len(repeated) > 1)} {_spans(list(repeated))}"] \
        if repeated else []
    parts += [f"has unexpected step{'s' * (len(extra) > 1)} {_spans(list(extra))}"] \
        if extra else []
    return f"{name} " + ("; ".join(parts) or "has its steps out of order")


def verify_run(spec: RunSpec, status: dict[str, Any]) -> str:
    """Why a run directory that says it finished (``status``: its status.json) is not a
    finished run of ``spec`` ("" if it is): ``status.json``'s step count, every line of
    ``metrics.jsonl`` and ``eval.jsonl`` parsed, one train record per expected step (no gap,
    no repeat), the expected evaluations and, for a completed run, its final evaluation."""
    d, num_steps = spec.run_dir, spec.config.run.num_steps
    train_steps, eval_steps = expected_steps(spec.config)
    try:
        metrics, evals = read_log(d / "metrics.jsonl"), read_log(d / "eval.jsonl")
    except Corrupt as e:
        return str(e)
    problem = metrics.damaged("metrics.jsonl", False) or evals.damaged("eval.jsonl", False)
    if problem:
        return problem
    done = status.get("steps")
    if not isinstance(done, int) or isinstance(done, bool):
        return f"status.json has no step count ({done!r})"
    if status.get("status") == "completed":
        if done != num_steps:
            return f"status.json counts {done} steps, not {num_steps}"
        final = evals.records[-1] if evals.records else {}
        if final.get("step") == num_steps and not any(
                isinstance(v, int | float) for k, v in final.items() if k != "step"):
            return "eval.jsonl's final evaluation holds no value"
        return (_steps_problem("metrics.jsonl", metrics.steps, train_steps)
                or _steps_problem("eval.jsonl", evals.steps, [*eval_steps, num_steps]))
    # stopped early (out of regime, diverged): every step up to where it stopped
    first = train_steps.start
    last = metrics.steps[-1] if metrics.records else first - 1
    if last not in (done - 1, done) and (metrics.records or done > first):
        return f"metrics.jsonl ends at step {last} but status.json counts {done} steps"
    expected = [s for s in eval_steps if s <= done]
    return (_steps_problem("metrics.jsonl", metrics.steps, range(first, last + 1))
            or _steps_problem("eval.jsonl", evals.steps,
                              [*expected, done] if evals.steps[-1:] == [done]
                              and done not in expected else expected))


def checkpoint_step(run_dir: Path) -> int:
    """The step a resumed run continues from: its newest ``checkpoints/step_<N>.pt`` (every
    such file is complete, see `rlscope.files.atomic_save`; should it not load,
    `rlscope.checkpoint.newest_intact` falls back to an older one and `train` trims the logs
    at that step, so checking them up to this one is only stricter). Not ``latest.pt``'s
    pointer: a kill between writing a checkpoint and moving the pointer leaves the pointer one
    checkpoint behind, and trimming the logs at the pointer's step would lose the steps in
    between. `Corrupt` when there is no checkpoint to resume from."""
    files = checkpoint_files(run_dir)
    if not files:
        raise Corrupt("no checkpoint")
    return files[0][0]


def _resume_problem(spec: RunSpec, step: int) -> str:
    """Why the run cannot resume at ``step`` ("" if it can): what it logged before that step
    must be intact (resuming drops everything from that step on, and writes it again)."""
    train_steps, eval_steps = expected_steps(spec.config)
    d = spec.run_dir
    for name, expected in (("metrics.jsonl", [s for s in train_steps if s < step]),
                           ("eval.jsonl", [s for s in eval_steps if s < step])):
        log = read_log(d / name)
        problem = log.damaged(name, allow_cut_off=True) or _steps_problem(
            name, [s for s in log.steps if s < step], expected)
        if problem:
            return problem
    return ""


def plan_run(spec: RunSpec) -> tuple[Plan, str]:
    """What to do with one run given its directory, and why. A file that cannot be read never
    raises: the run is resumed or restarted when the directory is provably this run's (its
    config.json gives this configuration), else planned ``fail`` with the reason, and the
    directory is left as it is."""
    d = spec.run_dir
    if not d.exists():
        return "run", ""
    if not d.is_dir():
        return "fail", f"{d} is not a directory; move or delete it to run this run"
    keep = f"cannot tell what ran in {d}; move or delete it to run this run again"
    try:
        config = json_object(d / "config.json")
    except Corrupt as e:
        return "fail", f"{e}: {keep}"
    if config is None:
        return "restart", "no config.json"
    stored = config.get("config")
    if not isinstance(stored, dict):
        return "fail", f"config.json holds no configuration: {keep}"
    if not _same_config(spec, stored):
        return "restart", "the manifest now gives a different configuration"
    try:
        status = json_object(d / "status.json") or {}
        state = status.get("status")
        why = str(state or "interrupted")
    except Corrupt as e:
        status, state, why = {}, None, str(e)
    if state in FINAL:
        problem = verify_run(spec, status)
        if not problem:
            return "skip", str(state)
        why = f"{state} but {problem}"
    try:
        step = checkpoint_step(d)
        problem = _resume_problem(spec, step)
    except Corrupt as e:
        return "restart", f"{why}, {e}"
    if problem:
        return "restart", f"{why}, cannot resume at step {step}: {problem}"
    return "resume", f"{why}, checkpoint at step {step}"


def safe_plan(spec: RunSpec) -> tuple[Plan, str]:
    """`plan_run`, with anything it raises (a directory that cannot even be listed) turned
    into a ``fail`` plan for this run alone."""
    try:
        return plan_run(spec)
    except Exception as e:  # one unusable directory fails only its run
        return "fail", f"cannot plan it: {type(e).__name__}: {e}"


def prepare(spec: RunSpec, plan: Plan) -> RunSpec:
    """Ready a run's directory for its plan; the spec to train (with ``resume`` set to resume)."""
    if plan == "restart":
        shutil.rmtree(spec.run_dir)
    if plan != "resume":
        return spec
    cfg = spec.config
    return dataclasses.replace(
        spec, argv=(*spec.argv, "--resume", str(spec.run_dir)),
        config=dataclasses.replace(cfg, run=dataclasses.replace(
            cfg.run, resume=str(spec.run_dir))))
