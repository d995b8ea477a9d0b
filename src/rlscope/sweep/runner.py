"""Run a sweep's runs, resume a killed sweep, and aggregate the results.

Each run is planned from what its directory holds:

- ``skip``: ``status.json`` says completed or out_of_regime, and ``config.json`` holds the
  same configuration the manifest now gives (settings such as threads aside, `NOT_COMPARED`);
- ``resume``: a checkpoint (``checkpoints/latest.pt``) of the same configuration and no final
  status: `train` continues from it with ``--resume``. Records logged after that checkpoint
  are dropped first; the resumed run writes them again (bit for bit, every random stream
  derives from the seed and the checkpointed state);
- ``restart``: anything else already there (no checkpoint, or a configuration the manifest no
  longer gives) is deleted and the run starts clean;
- ``run``: no directory yet.

Runs go one after another in this process (``jobs = 1``) or in ``jobs`` spawned worker
processes (nothing shared; a run's results do not depend on where it ran). A run that raises is
recorded as failed with its error and the others go on; each run's console output goes to
``<output>/logs/<run>.log``. ``<output>/sweep.json`` lists every run
with its plan, status, wall time and error, rewritten after each run, so a killed sweep leaves
an accurate record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing
import os
import shutil
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rlscope.config import to_dict
from rlscope.sweep.aggregate import Aggregate, aggregate
from rlscope.sweep.manifest import Manifest, RunSpec

Plan = Literal["run", "skip", "resume", "restart"]
FINAL = ("completed", "out_of_regime")
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
    """What this invocation did with it: run, skip, resume or restart."""
    reason: str = ""
    """Why it was planned so (for skip, resume and restart)."""
    status: str = "pending"
    """pending, completed, out_of_regime or failed."""
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
    """completed, out_of_regime or failed."""
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
        """Runs that raised."""
        return [r for r in self.records if r.status == "failed"]


# ----------------------------------------------------------------------------------- plan


def _same_config(spec: RunSpec, stored: dict[str, Any]) -> bool:
    """Whether a run directory's ``config.json`` config is the one the manifest gives now."""
    def normal(cfg: dict[str, Any]) -> dict[str, Any]:
        run = {k: v for k, v in cfg.get("run", {}).items() if k not in NOT_COMPARED}
        return {**cfg, "run": run}

    mine = json.loads(json.dumps(to_dict(spec.config)))
    return normal(mine) == normal(stored)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def plan_run(spec: RunSpec) -> tuple[Plan, str]:
    """What to do with one run given its directory, and why."""
    d = spec.run_dir
    if not d.exists():
        return "run", ""
    config = _read_json(d / "config.json")
    status = (_read_json(d / "status.json") or {}).get("status")
    if config is None:
        return "restart", "no config.json"
    if not _same_config(spec, config.get("config", {})):
        return "restart", "the manifest now gives a different configuration"
    if status in FINAL:
        return "skip", str(status)
    if (d / "checkpoints" / "latest.pt").exists():
        step = checkpoint_step(d)
        return "resume", f"{status or 'interrupted'}, checkpoint at step {step}"
    return "restart", f"{status or 'interrupted'}, no checkpoint"


def checkpoint_step(run_dir: Path) -> int:
    """The step of a run directory's latest checkpoint (from ``latest.pt``'s pointer)."""
    name = (run_dir / "checkpoints" / "latest.pt").read_text().strip()
    return int(name.removeprefix("step_").removesuffix(".pt"))


def trim_logs(run_dir: Path, step: int) -> None:
    """Drop records at or after ``step`` from the run's JSONL logs (and a line cut off by a
    kill): the run resumed from that step writes them again."""
    for log in LOGS:
        path = run_dir / log
        if not path.exists():
            continue
        kept = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if int(record.get("step", 0)) < step:
                kept.append(line + "\n")
        path.write_text("".join(kept), encoding="utf-8")


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
              report: Callable[[str], None] = lambda line: None) -> SweepResult:
    """Run every unfinished run of ``manifest``, then aggregate; ``report`` receives one line
    per planned skip/resume/restart and per finished run."""
    if options.jobs < 1 or options.threads < 0:
        raise ValueError("jobs must be >= 1 and threads >= 0")
    started = time.time()
    out = manifest.output
    (out / "runs").mkdir(parents=True, exist_ok=True)
    (out / "manifest.toml").write_text(manifest.text, encoding="utf-8")
    specs = with_threads(manifest.runs, options)
    records: list[RunRecord] = []
    todo: list[tuple[int, RunSpec]] = []
    for i, spec in enumerate(specs):
        plan, reason = plan_run(spec)
        record = RunRecord(spec.run, spec.id, spec.entry, spec.seed, str(spec.run_dir),
                           spec.command_line, plan, reason, log=str(log_path(spec)))
        if plan == "skip":
            record.status = reason
            record.final_eval = _last_eval(spec.run_dir)
            record.findings = _finding_ids(spec.run_dir)
            report(f"skip     {spec.run} ({reason})")
        else:
            if plan != "run":
                report(f"{plan:<8} {spec.run} ({reason})")
            todo.append((i, prepare(spec, plan)))
        records.append(record)
    machine = _machine(options)
    write_index(manifest, options, records, machine, started)

    def finished(i: int, outcome: Outcome, k: int) -> None:
        r = records[i]
        r.status, r.wall_time_s = outcome.status, outcome.wall_time_s
        r.final_eval, r.findings = outcome.final_eval, outcome.findings
        r.error, r.traceback = outcome.error, outcome.traceback
        write_index(manifest, options, records, machine, started)
        report(f"[{k}/{len(todo)}] {progress_line(r)}")

    if options.jobs == 1 or len(todo) <= 1:
        for k, (i, spec) in enumerate(todo, 1):
            finished(i, execute(spec), k)
    else:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=options.jobs, mp_context=context) as pool:
            futures: dict[Future[Outcome], int] = {pool.submit(execute, spec): i
                                                   for i, spec in todo}
            for k, future in enumerate(as_completed(futures), 1):
                try:
                    outcome = future.result()
                except Exception as e:  # the worker process itself died
                    outcome = Outcome("failed", 0.0, {}, f"{type(e).__name__}: {e}")
                finished(futures[future], outcome, k)
    result = aggregate(out, manifest.final_metrics, manifest.crossings)
    write_index(manifest, options, records, machine, started)
    return SweepResult(out, records, result)


def _last_eval(run_dir: Path) -> dict[str, float]:
    lines = (run_dir / "eval.jsonl").read_text(encoding="utf-8").splitlines() \
        if (run_dir / "eval.jsonl").exists() else []
    return json.loads(lines[-1]) if lines else {}


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
