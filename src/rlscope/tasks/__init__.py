"""Tasks: the task contract (`rlscope.tasks.base`) and the literal registry `TASKS` (name →
constructor)."""

from __future__ import annotations

from collections.abc import Callable

from rlscope.tasks.arithmetic import ArithmeticTask
from rlscope.tasks.bandit import DigitsBanditTask
from rlscope.tasks.base import (
    Interactive,
    OwnsPolicy,
    PreferencePairs,
    Scores,
    SupervisedPairs,
    Task,
    TaskConfig,
    TaskTraits,
    Tokenized,
    TrainingChecks,
    WatchesPolicy,
)
from rlscope.tasks.chains import ChainArithmeticTask, FormatAnswerTask
from rlscope.tasks.code import CodeUnitTestsTask
from rlscope.tasks.length_target import LengthTargetTask
from rlscope.tasks.lm_bandit import LMBanditTask
from rlscope.tasks.preference import PreferenceTask
from rlscope.tasks.reversal import ChainReversalTask, MaskedReversalTask, ReversalTask

TASKS: dict[str, Callable[[TaskConfig], Task]] = {
    "token_reversal": ReversalTask,
    "masked_reversal": MaskedReversalTask,
    "chain_reversal": ChainReversalTask,
    "chain_arithmetic": ChainArithmeticTask,
    "format_answer": FormatAnswerTask,
    "digits_bandit": DigitsBanditTask,
    "lm_bandit": LMBanditTask,
    "arithmetic": ArithmeticTask,
    "length_target": LengthTargetTask,
    "code_unit_tests": CodeUnitTestsTask,
    "preference_rm": PreferenceTask,
}


def make_task(name: str, cfg: TaskConfig | None = None) -> Task:
    """Construct the task ``name``; unknown names list the valid ones."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(TASKS)}")
    return TASKS[name](cfg or TaskConfig())


__all__ = ["TASKS", "Interactive", "OwnsPolicy", "PreferencePairs", "Scores", "SupervisedPairs",
           "Task", "TaskConfig", "TaskTraits", "Tokenized", "TrainingChecks", "WatchesPolicy",
           "make_task"]
