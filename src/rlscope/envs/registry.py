"""The registered environments: one literal dict from name to factory constructor.

Each constructor takes the `EnvConfig` and returns a `RegisteredEnvironment`: an
`EnvironmentFactory` that also checks its options (``validate() -> list[str]``, each problem
saying what to change) and plays demonstration episodes (`rlscope.envs.demos.Demonstrator`).
`make_factory` builds one by name and refuses unknown names and invalid options before any
episode runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from rlscope.envs.base import EnvironmentFactory
from rlscope.envs.calculator_tool import CalculatorTool
from rlscope.envs.code_repair import CodeRepair
from rlscope.envs.config import EnvConfig
from rlscope.envs.demos import Demonstrator
from rlscope.envs.guess_number import GuessNumber
from rlscope.envs.twenty_questions import TwentyQuestions


@runtime_checkable
class RegisteredEnvironment(EnvironmentFactory, Demonstrator, Protocol):
    """What every registered factory is."""

    def validate(self) -> list[str]:
        """Problems with the environment's options, each saying what to change."""
        ...


ENVIRONMENTS: dict[str, Callable[[EnvConfig], RegisteredEnvironment]] = {
    "guess_number": GuessNumber,
    "twenty_questions": TwentyQuestions,
    "calculator_tool": CalculatorTool,
    "code_repair": CodeRepair,
}
"""Environment name → factory constructor (docs/environments.md)."""


def make_factory(name: str, cfg: EnvConfig) -> RegisteredEnvironment:
    """The factory of environment ``name`` with options ``cfg``; ValueError listing every
    problem (an unknown name, invalid options) otherwise."""
    if name not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {name!r}; choose one of "
                         f"{', '.join(ENVIRONMENTS)}")
    factory = ENVIRONMENTS[name](cfg)
    if problems := factory.validate():
        raise ValueError(f"{name}: " + "; ".join(problems))
    return factory
