"""Multi-turn environments: the episode protocol (`rlscope.envs.base`) and the registered
environments (`rlscope.envs.registry`, docs/environments.md)."""

from rlscope.envs.base import (
    DONE_REASONS,
    TRUNCATION_REASONS,
    Environment,
    EnvironmentFactory,
    EpisodeBudget,
    Transition,
)
from rlscope.envs.config import EnvConfig
from rlscope.envs.registry import ENVIRONMENTS, RegisteredEnvironment, make_factory

__all__ = ["DONE_REASONS", "ENVIRONMENTS", "TRUNCATION_REASONS", "EnvConfig", "Environment",
           "EnvironmentFactory", "EpisodeBudget", "RegisteredEnvironment", "Transition",
           "make_factory"]
