"""The step loop shared by the supervised jobs, `rlscope sft` and `rlscope rm`.

A job names its output directory ``<runs_dir>/<name>`` (default ``<kind>_<task>_s<seed>_<time>``),
writes ``config.json`` (its config under ``kind``, the task's description and the environment)
and ``metrics.jsonl`` (one record per step, one per evaluation), shows a progress bar, evaluates
every ``eval_every`` steps and after the last, and then saves its model. What a step, an
evaluation and the save do is the job's own. `JobConfig` holds the settings every job shares.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlscope.metrics.sinks import JsonlWriter, LiveDisplay
from rlscope.policy import ModelConfig
from rlscope.tasks import Task, TaskConfig
from rlscope.utils import environment_info


@dataclass(frozen=True)
class JobConfig:
    """The settings every supervised job shares; `rlscope.supervised.sft.SftConfig` and
    `rlscope.supervised.rm.RmConfig` extend it (their flags stay flat: ``--device``, ...)."""

    num_steps: int = 300
    """Optimizer steps."""
    eval_every: int = 100
    """Evaluate every this many steps and at the end (0 = only at the end)."""
    runs_dir: str = "runs"
    """Parent folder of the output directory."""
    device: str = "auto"
    """cpu, cuda, cuda:N or auto."""
    threads: int = 0
    """CPU threads for torch (0 = leave torch's default)."""
    progress: bool = True
    """Show the progress bar."""
    task_options: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)


@dataclass(frozen=True)
class JobResult:
    """What a supervised job returns: its directory, step and evaluation records, wall time."""

    out_dir: Path
    metrics: list[dict[str, float]]
    evals: list[dict[str, float]]
    wall_time_s: float


def job_task(cfg: JobConfig, task_name: str) -> tuple[list[str], Task | None]:
    """The checks every supervised job starts with: the shared fields (finite floats, counts
    >= 0, device, --runs_dir, --name), the task's name, then the task's and the model's own
    checks. Returns the problems and the task (None when the name or the fields are wrong)."""
    from rlscope.checks import job_errors
    from rlscope.tasks import TASKS, make_task

    if errors := job_errors(cfg):
        return errors, None
    if task_name not in TASKS:
        return [f"--task: unknown task {task_name!r}; valid tasks: {', '.join(TASKS)}"], None
    task = make_task(task_name, cfg.task_options)
    return task.validate() + cfg.model.validate(), task


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the body with ``threads`` CPU threads for torch (0 = leave them), then restore."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_job(kind: str, cfg: Any, task: Task, device: torch.device,
            step: Callable[[int], dict[str, float]], evaluate: Callable[[], dict[str, float]],
            save: Callable[[Path, list[dict[str, float]]], object]) -> JobResult:
    """``cfg.num_steps`` calls of ``step(step_index)`` (its metrics), ``evaluate()`` every
    ``cfg.eval_every`` steps and after the last, then ``save(out_dir, evaluations)``.

    ``cfg`` is the job's frozen config; it must have ``task``, ``seed``, ``num_steps``,
    ``eval_every``, ``runs_dir``, ``name`` and ``progress``."""
    name = cfg.name or f"{kind}_{cfg.task}_s{cfg.seed}_{time.strftime('%Y%m%d-%H%M%S')}"
    out_dir = Path(cfg.runs_dir) / name
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(
        {kind: dataclasses.asdict(cfg), "task_description": task.describe(),
         **environment_info(device)}, indent=2))
    log = JsonlWriter(out_dir / "metrics.jsonl", append=False)
    display = LiveDisplay(cfg.progress, cfg.num_steps, f"{kind} · {cfg.task}")
    metrics: list[dict[str, float]] = []
    evals: list[dict[str, float]] = []
    t_run = time.perf_counter()

    def run_eval(at: int) -> None:
        record = {"step": at, **evaluate()}
        evals.append(record)
        log.write(record)
        display.eval(record)

    try:
        for i in range(cfg.num_steps):
            if cfg.eval_every and i % cfg.eval_every == 0:
                run_eval(i)
            record = {"step": i, **step(i)}
            metrics.append(record)
            log.write(record)
            display.update(record)
        run_eval(cfg.num_steps)
        save(out_dir, evals)
    finally:
        display.close()
        log.close()
    return JobResult(out_dir=out_dir, metrics=metrics, evals=evals,
                     wall_time_s=time.perf_counter() - t_run)
