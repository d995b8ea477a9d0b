"""The contract of a step kind other than ``rollout`` (COMPANIONS.md, "Shared additions").

A method's `MethodSpec.step` names its step kind. ``rollout`` is the loop of `rlscope.train`
(sample completions, score them, update one policy). The other kinds (``set``, ``two_view``,
``tree``) train on their own tasks with their own models, batch contract (`rlscope.batch`) and
update; each lives in its own module of this package and is one `StepKind` record of the
literal registry `rlscope.steps.STEPS`. `rlscope.train` runs every kind through the same loop
(run directory, evaluation schedule, logs, live doctor, checkpoints, exact resume), which calls
only the `KindStep` methods below and never looks at the method's or the kind's name.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from rlscope.methods.spec import MethodSpec

if TYPE_CHECKING:
    from rlscope.config import TrainConfig


class KindStep(Protocol):
    """One run of a step kind: built once by `StepKind.build`, then driven by the loop."""

    def train_step(self, step: int) -> dict[str, float]:
        """Collect a batch and update on it; the step's metrics (names from
        `rlscope.metrics.schema`; the loop adds ``time/step``). A non-finite ``loss/*`` value
        stops the run as diverged."""
        ...

    def evaluate(self, step: int) -> dict[str, float]:
        """Held-out evaluation before step ``step``'s update (``eval/*`` metrics); it must not
        draw from the training stream, so that evaluating never changes training."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs (modules, optimizers, generators), as tensors,
        numbers, strings and containers (`rlscope.checkpoint.save_state`)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        ...

    def describe(self) -> str:
        """One line on the task and the models, for ``config.json``."""
        ...

    # Optional, read by the loop through getattr: ``take_samples() -> list[dict]`` (records
    # to append to samples.jsonl after each step) and ``export(directory)`` (what a user
    # loads outside rlscope, written to <run_dir>/model beside every checkpoint).


@dataclass(frozen=True)
class StepKind:
    """A step kind: the tasks it trains on, its checks and its constructor."""

    tasks: dict[str, str]
    """The tasks this kind trains on: name → one-line summary (``rlscope tasks`` lists them)."""
    validate: Callable[[TrainConfig, MethodSpec], list[str]]
    """The kind's and its presets' rejections (one line each, saying what to change), beside
    `common_errors`, which the loop checks for every kind."""
    build: Callable[[TrainConfig, MethodSpec, torch.device], KindStep]
    """The run's models, optimizers and generators, seeded from ``cfg.run.seed`` (called after
    the checks pass and torch's seed is set)."""
    defaults: Callable[[TrainConfig], TrainConfig] | None = None
    """The kind's own defaults (num_steps, batch size, lr, ...) for the options a command line
    or a sweep manifest does not give: called with the first parse (its method and task), it
    returns the config the flags are parsed over again (`rlscope.steps.with_kind_defaults`);
    None = the generic defaults of `TrainConfig`."""


def common_errors(cfg: TrainConfig, kind: str) -> list[str]:
    """What no step kind but ``rollout`` supports, and the run options every kind reads
    (COMPANIONS.md: "Delay, replay and reward noise are rejected for every companion
    preset")."""
    r, errors = cfg.run, []
    if r.num_steps < 0 or r.batch_size < 1 or r.eval_every < 0 or r.inner_epochs < 1:
        errors.append("run.num_steps and run.eval_every must be >= 0, run.batch_size and "
                      "run.inner_epochs >= 1")
    if cfg.optim.lr <= 0 or cfg.optim.grad_clip < 0:
        errors.append("optim.lr must be > 0 and optim.grad_clip >= 0")
    refused = {
        "--delay": r.delay > 0, "--replay_capacity": cfg.replay.replay_capacity > 0,
        "--reward_noise": cfg.task_options.reward_noise > 0,
        "--overfit_batch": r.overfit_batch, "--fill_batch": r.fill_batch,
        "--nproc / torchrun": r.nproc > 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1,
        "--fsdp": r.fsdp, "--env_workers": r.env_workers > 0}
    errors += [f"{flag} is not supported by the {kind!r} step (a companion preset trains "
               f"on-policy, on clean rewards, in one process): drop it"
               for flag, given in refused.items() if given]
    return errors


__all__ = ["KindStep", "StepKind", "common_errors"]
