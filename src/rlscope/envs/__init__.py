"""Multi-turn environments: the episode protocol (`rlscope.envs.base`) and, as they land, the
registered environments."""

from rlscope.envs.base import (
    DONE_REASONS,
    TRUNCATION_REASONS,
    Environment,
    EnvironmentFactory,
    EpisodeBudget,
    Transition,
)

__all__ = ["DONE_REASONS", "TRUNCATION_REASONS", "Environment", "EnvironmentFactory",
           "EpisodeBudget", "Transition"]
