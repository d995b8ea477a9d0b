"""Run a sweep's runs, resume a killed sweep, and aggregate the results.

Each run is planned from what its directory holds (`rlscope.sweep.plan`: run, skip, resume,
restart or fail). A run "completes" only when, after it ran, `verify_run` accepts its
directory; otherwise it is recorded as failed with what is missing, and the next invocation
runs it again.

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
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlscope.sweep.aggregate import Aggregate, aggregate
from rlscope.sweep.manifest import Manifest, RunSpec
from rlscope.sweep.plan import (
    FINAL,
    Corrupt,
    Plan,
    prepare,
    read_json,
    read_log,
    safe_plan,
    verify_run,
)
from rlscope.sweep.processes import OutputLock, Workers, stop_on_signals


@dataclass(frozen=True)
class SweepOptions:
    """How to execute a sweep (the manifest says what to run)."""

    jobs: int = 1
    """Worker processes running runs in parallel (1 = one after another, in this process)."""
    threads: int = 0
    """CPU threads for torch in each run; 0 = the manifest's ``threads`` if it sets one, else
    the available cores divided by jobs."""
    backend: str = "process"
    """Where runs execute: ``process`` (this process or ``jobs`` worker processes) or ``ray``
    (one Ray task per run, `rlscope.sweep.ray_backend`)."""
    address: str = ""
    """With ``backend = "ray"``: the cluster to join (empty: start a local one)."""


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
    findings = (read_json(run_dir / "findings.json") or {}).get("findings", [])
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
        "backend": options.backend,
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
    if problem := backend_problem(manifest, options):
        raise ValueError(problem)
    if lock is not None:
        if lock.fd is None or lock.path.parent != manifest.output:
            raise ValueError(f"the lock given is not held on {manifest.output}")
        with stop_on_signals():
            return _run_locked(manifest, options, report, lock)
    with OutputLock(manifest.output) as own, stop_on_signals():
        return _run_locked(manifest, options, report, own)


def backend_problem(manifest: Manifest, options: SweepOptions) -> str:
    """Why the sweep cannot run on ``options.backend`` ("" if it can): an unknown backend,
    ``--address`` without Ray, Ray not installed, or a run whose device Ray cannot assign."""
    if options.backend not in ("process", "ray"):
        return f"--backend {options.backend!r} is unknown: use process or ray"
    if options.backend != "ray":
        return "--address joins a Ray cluster: add --backend ray" if options.address else ""
    from rlscope.ray_cluster import ray_missing

    if missing := ray_missing("--backend ray"):
        return missing
    from rlscope.sweep.ray_backend import device_problem

    return next((p for spec in manifest.runs if (p := device_problem(spec))), "")


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
    problem = verify_run(spec, read_json(spec.run_dir / "status.json") or {})
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
        if options.backend == "ray":
            from rlscope.sweep.ray_backend import run_ray

            on_ray = run_ray(todo, options.address, execute,
                             lambda how, seconds: Outcome("failed", seconds, {}, how))
            try:
                for k, (i, outcome) in enumerate(on_ray, 1):
                    finished(i, outcome, k)
            finally:
                on_ray.close()  # cancels the tasks still out, whatever happened
        elif options.jobs == 1 or len(todo) <= 1:
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
