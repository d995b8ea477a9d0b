"""Step kinds other than ``rollout``: the literal registry `STEPS` (kind → `StepKind`), and
`validate_run`, the one check of a training configuration whatever its step kind.

Every method names its step kind (`rlscope.methods.spec.MethodSpec.step`); a task belongs to
one kind (``rollout`` unless a `StepKind` lists it). A method and a task of different kinds are
rejected before anything is built, naming both.
"""

from __future__ import annotations

from collections.abc import Callable

from rlscope.checks import field_errors
from rlscope.config import FIELD_ALIASES, ConfigError, TrainConfig, validate
from rlscope.methods import METHODS, canonical_method_name, resolve_method
from rlscope.steps import set_step, tree, two_view
from rlscope.steps.base import KindStep, StepKind, common_errors

ROLLOUT = "rollout"
"""The step kind of the loop in `rlscope.train` (every task of `rlscope.tasks.TASKS`)."""

STEPS: dict[str, StepKind] = {
    "set": set_step.KIND,
    "two_view": two_view.KIND,
    "tree": tree.KIND,
}
"""Step kind → its record. Each kind is one module of this package."""


def task_kind(task: str) -> str:
    """The step kind whose tasks include ``task`` (``rollout`` for every other name)."""
    return next((kind for kind, record in STEPS.items() if task in record.tasks), ROLLOUT)


def kind_of(cfg: TrainConfig) -> str:
    """The step kind that trains ``cfg``; `ConfigError` for an unknown method, or a method and
    a task of different kinds."""
    try:
        name = canonical_method_name(cfg.method)
    except ValueError as e:
        raise ConfigError(f"--method: {e}") from None
    kind, needed = METHODS[name].step, task_kind(cfg.task)
    if kind != needed:
        methods = "`rlscope methods` lists them" if needed == ROLLOUT else ", ".join(
            n for n, spec in METHODS.items() if spec.step == needed)
        tasks = ", ".join(STEPS[kind].tasks) if kind in STEPS else "the tasks of `rlscope tasks`"
        raise ConfigError(
            f"--method {cfg.method} trains with the {kind!r} step, but --task {cfg.task} is a "
            f"task of the {needed!r} step: use one of its methods ({methods}) or one of the "
            f"method's tasks ({tasks})")
    return kind


def with_kind_defaults(cfg: TrainConfig, parse: Callable[[TrainConfig], TrainConfig]
                       ) -> TrainConfig:
    """``cfg`` (parsed from flags over the generic defaults) parsed again by ``parse`` over the
    defaults of its task's step kind (`StepKind.defaults`), so that the kind's defaults apply
    to every option the flags do not give; ``cfg`` itself where the kind has none."""
    record = STEPS.get(task_kind(cfg.task))
    return parse(record.defaults(cfg)) if record is not None and record.defaults else cfg


def validate_run(cfg: TrainConfig) -> str:
    """Check ``cfg`` whatever its step kind (`ConfigError` listing every problem) and return
    the kind: ``rollout`` goes through `rlscope.config.validate`; another kind through
    `common_errors` and its own `StepKind.validate`."""
    kind = kind_of(cfg)
    if kind == ROLLOUT:
        validate(cfg)
        return kind
    spec = resolve_method(cfg.method, cfg.components)
    errors = field_errors(cfg, aliases=FIELD_ALIASES) or (
        common_errors(cfg, kind) + STEPS[kind].validate(cfg, spec))
    if errors:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(errors))
    return kind


__all__ = ["ROLLOUT", "STEPS", "KindStep", "StepKind", "kind_of", "task_kind", "validate_run",
           "with_kind_defaults"]
