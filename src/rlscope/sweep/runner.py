"""Run a sweep's runs, resume a killed sweep, and aggregate the results.

Each run is planned from what its directory holds:

- ``skip``: ``status.json`` says the run finished (`FINAL`), ``config.json`` holds the
  configuration the manifest now gives (settings such as threads aside, `NOT_COMPARED`), and
  the files bear it out (`verify_run`: the step count, one parseable record per expected step
  in ``metrics.jsonl``, the expected evaluations in ``eval.jsonl`` up to the final one);
- ``resume``: a checkpoint (``checkpoints/latest.pt``) of the same configuration, no verified
  final status, and intact logs before the checkpoint's step: `train` continues from it with
  ``--resume``. Records logged from that step on are dropped first; the resumed run writes
  them again (bit for bit, every random stream derives from the seed and the checkpointed
  state);
- ``restart``: anything else of the same run (no checkpoint, damaged logs, a configuration the
  manifest no longer gives) is deleted and the run starts clean;
- ``fail``: a directory that cannot be this run's or anyone's (``config.json`` unreadable or not
  JSON, or not a directory) is left alone and the run fails with that reason; the others go on;
- ``run``: no directory yet.

A run "completes" only when, after it ran, `verify_run` accepts its directory; otherwise it is
recorded as failed with what is missing, and the next invocation runs it again.

Runs go one after another in this process (``jobs = 1``) or in ``jobs`` worker processes
(`rlscope.sweep.processes`: nothing shared, each in its own process group and killed by the
kernel if the sweep dies; a run's results do not depend on where it ran). A run that raises is
recorded as failed with its error and the others go on; each run's console output goes to
``<output>/logs/<run>.log``. ``<output>/sweep.json`` lists every run with its plan, status,
wall time and error, rewritten after each run, so a killed sweep leaves an accurate record.
The sweep holds ``<output>/sweep.lock`` while it runs, so a second sweep on the same folder is
refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rlscope.config import TrainConfig, to_dict
from rlscope.sweep.aggregate import Aggregate, aggregate
from rlscope.sweep.manifest import Manifest, RunSpec
from rlscope.sweep.processes import OutputLock, Workers, stop_on_signals

Plan = Literal["run", "skip", "resume", "restart", "fail"]
FINAL = ("completed", "out_of_regime", "diverged")
"""Statuses of a run that ended by itself; running it again would end the same way."""
NOT_COMPARED = ("resume", "progress", "threads", "jobs", "num_seeds", "runs_dir", "name")
"""``run.*`` fields left out when a run directory's config is compared with the manifest's:
where the directory lies and how the run executes, not what it computes (threads can change
float rounding, see docs/training.md, "Several seeds", but not what the run means), so that
another ``--jobs``, ``--threads`` or ``--output`` path does not restart finished runs."""
LOGS = ("metrics.jsonl", "eval.jsonl", "samples.jsonl")


@dataclass(frozen=True)
class SweepOptions:
    """How to execute a sweep (the manifest says what to run)."""

    jobs: int = 1
    """Worker processes running runs in parallel (1 = one after another, in this process)."""
    threads: int = 0
    """CPU threads for torch in each run; 0 = the manifest's ``threads`` if it sets one, else
    the available cores divided by jobs."""


@dataclass
class RunRecord:
    """One run's line in ``sweep.json``."""

    run: str
    """The run directory's name, ``<id>_s<seed>``."""
    name: str
    """The run id without the seed."""
    entry: str
    """Its ``[runs.<entry>]`` table."""
    seed: int
    """Its seed."""
    run_dir: str
    """Its directory."""
    command: str
    """The equivalent `rlscope train` command."""
    plan: Plan
    """What this invocation did with it: run, skip, resume, restart or fail."""
    reason: str = ""
    """Why it was planned so (for skip, resume, restart and fail)."""
    status: str = "pending"
    """pending, completed, out_of_regime, diverged, failed, or interrupted (the sweep was
    stopped by a signal before the run finished)."""
    wall_time_s: float | None = None
    """Seconds the run took in this invocation (None when skipped or pending)."""
    final_eval: dict[str, float] = field(default_factory=dict)
    """Its last evaluation."""
    findings: list[str] = field(default_factory=list)
    """Ids of the doctor's findings on it, informative ones aside (all: its findings.json)."""
    log: str = ""
    """Its console output (``<output>/logs/<run>.log``)."""
    error: str = ""
    """For a failed run: the exception."""
    traceback: str = ""
    """For a failed run: where it was raised."""


@dataclass(frozen=True)
class Outcome:
    """What a worker reports back about one run."""

    status: str
    """completed, out_of_regime, diverged or failed."""
    wall_time_s: float
    """Seconds from start to finish."""
    final_eval: dict[str, float]
    """The last evaluation's values."""
    error: str = ""
    """The exception, for a failed run."""
    traceback: str = ""
    """Its traceback."""
    findings: list[str] = field(default_factory=list)
    """Ids of the doctor's findings on the run (findings.json), informative ones aside."""


@dataclass(frozen=True)
class SweepResult:
    """A finished sweep: every run's record and the aggregation."""

    output: Path
    """The sweep directory."""
    records: list[RunRecord]
    """One per run, in manifest order."""
    aggregate: Aggregate
    """What was computed and written from the runs."""

    def count(self, status: str) -> int:
        """Runs run now that ended with ``status``."""
        return sum(r.plan != "skip" and r.status == status for r in self.records)

    @property
    def skipped(self) -> int:
        """Runs already finished before this invocation."""
        return sum(r.plan == "skip" for r in self.records)

    @property
    def failed(self) -> list[RunRecord]:
        """Runs that raised, could not be planned, or ended without a verified directory."""
        return [r for r in self.records if r.status == "failed"]


# ----------------------------------------------------------------------------------- plan


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


def _read_json(path: Path) -> dict[str, Any] | None:
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
    """The steps a finished run logs: train records (``metrics.jsonl``; one per optimizer
    step from the first step that trains, ``delay`` without replay, else 0) and the
    evaluations before the last (``eval.jsonl``, every ``eval_every`` steps from ``delay``);
    a completed run adds its final evaluation at ``num_steps``."""
    r = cfg.run
    first = 0 if cfg.replay.replay_capacity > 0 else min(r.delay, r.num_steps)
    evals = [s for s in range(r.delay, r.num_steps)
             if r.eval_every and (s - r.delay) % r.eval_every == 0]
    return range(first, r.num_steps), evals


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
    """The step of a run directory's latest checkpoint (from ``latest.pt``'s pointer);
    `Corrupt` when there is none to resume from, saying why."""
    folder = run_dir / "checkpoints"
    pointer = folder / "latest.pt"
    try:
        name = pointer.read_bytes().decode("ascii").strip()
    except FileNotFoundError:
        raise Corrupt("no checkpoint") from None
    except (OSError, UnicodeDecodeError):
        raise Corrupt("checkpoints/latest.pt is unreadable") from None
    match = re.fullmatch(r"step_(\d+)\.pt", name)
    if match is None:
        raise Corrupt("checkpoints/latest.pt does not name a checkpoint")
    if not (folder / name).is_file():
        raise Corrupt(f"checkpoints/{name} is missing")
    return int(match[1])


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


def trim_logs(run_dir: Path, step: int) -> None:
    """Drop records at or after ``step`` from the run's JSONL logs (and a line cut off by a
    kill): the run resumed from that step writes them again."""
    for log in LOGS:
        path = run_dir / log
        if not path.exists():
            continue
        kept = [raw + b"\n" for raw in path.read_bytes().split(b"\n")
                if (record := _record(raw)) is not None and record["step"] < step]
        tmp = path.with_suffix(".trim")
        tmp.write_bytes(b"".join(kept))
        tmp.replace(path)


def prepare(spec: RunSpec, plan: Plan) -> RunSpec:
    """Ready a run's directory for its plan; the spec to train (with ``resume`` set to resume)."""
    if plan == "restart":
        shutil.rmtree(spec.run_dir)
    if plan != "resume":
        return spec
    trim_logs(spec.run_dir, checkpoint_step(spec.run_dir))
    cfg = spec.config
    return dataclasses.replace(
        spec, argv=(*spec.argv, "--resume", str(spec.run_dir)),
        config=dataclasses.replace(cfg, run=dataclasses.replace(
            cfg.run, resume=str(spec.run_dir))))


# -------------------------------------------------------------------------------- execute


def log_path(spec: RunSpec) -> Path:
    """Where a run's console output goes: ``<output>/logs/<run>.log`` (beside, not inside, the
    run directory, which `train` must find empty to use it)."""
    return spec.run_dir.parent.parent / "logs" / f"{spec.run}.log"


def execute(spec: RunSpec) -> Outcome:
    """Train one run with its console output (the doctor's live alerts, warnings) sent to its
    log, so parallel runs do not interleave unlabelled lines; an exception becomes a failed
    outcome (so one run cannot stop a sweep). Runs in a worker process when jobs > 1."""
    from rlscope.train import train

    log = log_path(spec)
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with log.open("a", encoding="utf-8") as f, contextlib.redirect_stdout(f), \
            contextlib.redirect_stderr(f):
        f.write(f"$ {spec.command_line}\n")
        try:
            result = train(spec.config)
        except Exception as e:
            f.write(traceback.format_exc())
            return Outcome("failed", time.perf_counter() - t0, {}, f"{type(e).__name__}: {e}",
                           traceback.format_exc())
    return Outcome(result.status, result.wall_time_s, dict(result.final_eval),
                   findings=_finding_ids(result.run_dir))


def _finding_ids(run_dir: Path) -> list[str]:
    """The ids of the doctor's findings on a finished run that are not merely informative."""
    findings = (_read_json(run_dir / "findings.json") or {}).get("findings", [])
    if not isinstance(findings, list):
        return []
    return [str(f.get("id")) for f in findings
            if isinstance(f, dict) and f.get("severity") != "info"]


def default_threads(jobs: int) -> int:
    """The cores this process may use, shared out among ``jobs`` workers (at least 1)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1
    return max(1, cores // max(jobs, 1))


def with_threads(specs: Sequence[RunSpec], options: SweepOptions) -> list[RunSpec]:
    """Set each run's torch threads: ``options.threads`` if given, else the manifest's if it
    set one, else `default_threads`."""
    out = []
    for spec in specs:
        threads = options.threads or spec.config.run.threads or default_threads(options.jobs)
        out.append(spec if threads == spec.config.run.threads else spec.with_threads(threads))
    return out


def _machine(options: SweepOptions) -> dict[str, Any]:
    from rlscope.utils import environment_info, resolve_device

    info = environment_info(resolve_device("auto"))
    info.pop("torch_threads")  # this process's, not the runs' (their commands say --threads)
    return {**info, "cpu_count": os.cpu_count()}


def write_index(manifest: Manifest, options: SweepOptions, records: Sequence[RunRecord],
                machine: dict[str, Any], started: float) -> Path:
    """Write ``<output>/sweep.json`` atomically."""
    path = manifest.output / "sweep.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({
        "name": manifest.name, "description": manifest.description,
        "manifest": manifest.source, "output": str(manifest.output),
        "seeds": list(manifest.seeds), "jobs": options.jobs, "threads": options.threads,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "wall_time_s": time.time() - started, "machine": machine,
        "runs": [dataclasses.asdict(r) for r in records]}, indent=2, default=str),
        encoding="utf-8")
    tmp.replace(path)
    return path


def run_sweep(manifest: Manifest, options: SweepOptions = SweepOptions(),
              report: Callable[[str], None] = lambda line: None,
              lock: OutputLock | None = None) -> SweepResult:
    """Run every unfinished run of ``manifest``, then aggregate; ``report`` receives one line
    per planned skip/resume/restart/fail and per finished run.

    Holds ``<output>/sweep.lock`` throughout: ``lock`` if the caller already holds it (and
    releases it), else one taken here (`SweepLocked` when another sweep holds it). SIGINT,
    SIGTERM and SIGHUP stop the running runs and raise `SweepInterrupted` once ``sweep.json``
    records them as interrupted."""
    if options.jobs < 1 or options.threads < 0:
        raise ValueError("jobs must be >= 1 and threads >= 0")
    if lock is not None:
        if lock.fd is None or lock.path.parent != manifest.output:
            raise ValueError(f"the lock given is not held on {manifest.output}")
        with stop_on_signals():
            return _run_locked(manifest, options, report, lock)
    with OutputLock(manifest.output) as own, stop_on_signals():
        return _run_locked(manifest, options, report, own)


def _plan_all(specs: Sequence[RunSpec], report: Callable[[str], None]
              ) -> tuple[list[RunRecord], list[tuple[int, RunSpec]]]:
    """Plan and prepare every run: its record, and the runs to train with their index. A run
    whose directory cannot be planned or prepared is failed with the reason; the others go on."""
    records: list[RunRecord] = []
    todo: list[tuple[int, RunSpec]] = []
    for i, spec in enumerate(specs):
        plan, reason = safe_plan(spec)
        ready = spec
        if plan in ("resume", "restart"):
            try:
                ready = prepare(spec, plan)
            except Exception as e:  # one unusable directory fails only its run
                plan, reason = "fail", f"cannot {plan} it: {type(e).__name__}: {e}"
        record = RunRecord(spec.run, spec.id, spec.entry, spec.seed, str(spec.run_dir),
                           spec.command_line, plan, reason, log=str(log_path(spec)))
        if plan == "skip":
            record.status = reason
            record.final_eval = _last_eval(spec.run_dir)
            record.findings = _finding_ids(spec.run_dir)
        elif plan == "fail":
            record.status, record.error = "failed", reason
        else:
            todo.append((i, ready))
        if plan != "run":
            report(f"{plan:<8} {spec.run} ({reason})")
        records.append(record)
    return records, todo


def _verified(spec: RunSpec, outcome: Outcome) -> Outcome:
    """``outcome``, or a failed one when the run says it finished but `verify_run` finds its
    directory incomplete."""
    if outcome.status not in FINAL:
        return outcome
    problem = verify_run(spec, _read_json(spec.run_dir / "status.json") or {})
    if not problem:
        return outcome
    return dataclasses.replace(outcome, status="failed",
                               error=f"ended {outcome.status} but {problem}")


def _run_locked(manifest: Manifest, options: SweepOptions, report: Callable[[str], None],
                lock: OutputLock) -> SweepResult:
    started = time.time()
    out = manifest.output
    (out / "runs").mkdir(parents=True, exist_ok=True)
    (out / "manifest.toml").write_text(manifest.text, encoding="utf-8")
    records, todo = _plan_all(with_threads(manifest.runs, options), report)
    machine = _machine(options)
    write_index(manifest, options, records, machine, started)
    specs = dict(todo)

    def finished(i: int, outcome: Outcome, k: int) -> None:
        outcome = _verified(specs[i], outcome)
        r = records[i]
        r.status, r.wall_time_s = outcome.status, outcome.wall_time_s
        r.final_eval, r.findings = outcome.final_eval, outcome.findings
        r.error, r.traceback = outcome.error, outcome.traceback
        write_index(manifest, options, records, machine, started)
        report(f"[{k}/{len(todo)}] {progress_line(r)}")

    try:
        if options.jobs == 1 or len(todo) <= 1:
            for k, (i, spec) in enumerate(todo, 1):
                finished(i, execute(spec), k)
        else:
            assert lock.fd is not None
            workers = Workers(options.jobs, log_path, out / "logs" / "workers.log",
                              keep_fds=(lock.fd,))
            ended = workers.run(todo, lambda how, seconds: Outcome("failed", seconds, {}, how))
            try:
                for k, (i, outcome) in enumerate(ended, 1):
                    finished(i, outcome, k)
            finally:
                ended.close()  # stops the workers still running, whatever happened
    except BaseException:
        for i, _ in todo:
            if records[i].status == "pending":
                records[i].status = "interrupted"
        write_index(manifest, options, records, machine, started)
        raise
    result = aggregate(out, manifest.final_metrics, manifest.crossings)
    write_index(manifest, options, records, machine, started)
    return SweepResult(out, records, result)


def _last_eval(run_dir: Path) -> dict[str, float]:
    try:
        records = read_log(run_dir / "eval.jsonl").records
    except Corrupt:
        return {}
    return records[-1] if records else {}


def progress_line(record: RunRecord) -> str:
    """One finished run: status, wall time and its final test error and entropy."""
    if record.status == "failed":
        return f"{record.run} FAILED: {record.error}"
    shown = "  ".join(f"{k.removeprefix('eval/')} {record.final_eval[k]:.4g}"
                      for k in ("eval/test_error", "eval/entropy")
                      if isinstance(record.final_eval.get(k), int | float))
    if record.findings:
        shown += f"  doctor: {', '.join(record.findings)}"
    return f"{record.run} {record.status} in {record.wall_time_s or 0.0:.1f}s  {shown}".rstrip()
