"""Tasks: the task contract (`rlscope.tasks.base`) and the literal registry `TASKS` (name →
constructor)."""

from __future__ import annotations

from collections.abc import Callable

from rlscope.tasks.answerer import AnswererTask
from rlscope.tasks.arithmetic import ArithmeticTask
from rlscope.tasks.bandit import DigitsBanditTask
from rlscope.tasks.base import (
    GroupSized,
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
    TrainsCompanion,
    WatchesPolicy,
)
from rlscope.tasks.chains import ChainArithmeticTask, FormatAnswerTask
from rlscope.tasks.code import CodeUnitTestsTask
from rlscope.tasks.episodes import environment_task
from rlscope.tasks.length_target import LengthTargetTask
from rlscope.tasks.lm_bandit import LMBanditTask
from rlscope.tasks.preference import PreferenceTask
from rlscope.tasks.reversal import ChainReversalTask, MaskedReversalTask, ReversalTask
from rlscope.tasks.twenty_questions import TwentyQuestionsTask
from rlscope.tasks.unique_path import UniquePathTask

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
    "unique_path": UniquePathTask,
    # multi-turn environments (rlscope.envs): each reads the EnvConfig options named after it
    "guess_number": environment_task(
        "guess_number", "guess_",
        "Multi-turn: guess a hidden number, told higher or lower each turn; fewer turns "
        "earn more."),
    "twenty_questions": TwentyQuestionsTask,  # an environment task that owns its answerer
    "twenty_questions_answerer": AnswererTask,  # the model answerer's warm start
    "calculator_tool": environment_task(
        "calculator_tool", "calculator_",
        "Multi-turn: a word problem with a calc(...) tool evaluated safely; reward for the "
        "right answer."),
    "code_repair": environment_task(
        "code_repair", "code_repair_",
        "Multi-turn: write a function body; the failing test comes back from the sandbox; "
        "revise."),
}


def make_task(name: str, cfg: TaskConfig | None = None) -> Task:
    """Construct the task ``name``; unknown names list the valid ones."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(TASKS)}")
    return TASKS[name](cfg or TaskConfig())


__all__ = ["TASKS", "GroupSized", "Interactive", "OwnsPolicy", "PreferencePairs", "Scores",
           "SupervisedPairs", "Task", "TaskConfig", "TaskTraits", "Tokenized", "TrainingChecks",
           "TrainsCompanion", "WatchesPolicy", "make_task"]
