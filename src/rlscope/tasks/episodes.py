"""``EpisodeTask``: any environment factory (`rlscope.envs.EnvironmentFactory`) as a task.

The task is `Interactive`: the loop samples its rows as episodes
(`rlscope.sampling.episodes.generate_episodes`) instead of single completions.

- **Prompts**: the environments' initial observations, left-padded, with each row's
  environment seed in ``env_seeds_B`` (drawn from the run's stream; the rows of a GRPO group
  repeat their prompt, hence share the seed and the environment's hidden state).
- **Score**: the episode return R = Σ_k γ^k r_k over the policy turns k = 0, 1, ... (r_k the
  environment's reward for turn k, γ = ``--turn_discount``, 1 by default). It is the row's
  scalar reward: group advantages compare the returns of episodes from the same start, and the
  loss covers the policy's tokens only (no per-token rewards: a method that needs them is
  refused before training).
- **Evaluation** (greedy episodes on held-out seeds): ``success`` (episodes the environment
  ended 'solved'), ``test_error`` = 1 − success, ``turns``, ``return``.
- **Warm start** (``sft_pairs``, for `rlscope sft`): the factory's demonstration episodes
  (`rlscope.envs.demos.Demonstrator`) of fresh seeds, each a `MaskedPair` whose loss mask is 1
  on the policy's segments only (not on a policy segment marked `Unlearned`: a wrong attempt
  the demonstration repairs).

Budgets are the task options ``--max_turns``, ``--max_turn_tokens``, ``--max_episode_tokens``
(``--env_processes N``: slow environments step in N worker processes, `EpisodePool`);
the completion length is ``max_episode_tokens`` and the prompt length the longest initial
observation over the held-out set and `PROBE_SEEDS` more seeds, with `PROMPT_MARGIN` positions
to spare where the observations vary in length (the model's context must hold both; a longer
observation met in training is an error naming the sizes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Protocol, runtime_checkable

import torch

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.envs.base import DONE_REASONS, EnvironmentFactory, EpisodeBudget
from rlscope.envs.config import EnvConfig
from rlscope.envs.demos import Demonstrator, Unlearned
from rlscope.envs.registry import ENVIRONMENTS
from rlscope.sampling.episodes import EpisodePool, initial_observations
from rlscope.tasks.base import (
    EPISODE_OPTIONS,
    EVAL_OPTIONS,
    MaskedPair,
    Scores,
    TaskConfig,
    TaskTraits,
    env_option_errors,
    unused_option_errors,
)

EVAL_SEED_OFFSET = 7_000_003
"""Held-out environment seeds come from ``seed + EVAL_SEED_OFFSET`` (never the run's stream)."""
PROBE_SEEDS = 20_000
"""Environment seeds probed (besides the held-out ones) for the longest initial observation
(about 0.3 s for each shipped environment)."""
PROMPT_MARGIN = 16
"""Positions added to the longest probed observation, for the rare longer one a run may still
draw (calculator_tool's word problems vary by a few tokens with their numbers)."""
SEED_RANGE = 2**31
"""Environment seeds are drawn from [0, SEED_RANGE)."""


@runtime_checkable
class ValidatedFactory(Protocol):
    """A factory that checks its own options (the registered environments do)."""

    def validate(self) -> list[str]: ...


@runtime_checkable
class BudgetValidatedFactory(Protocol):
    """A factory whose options depend on the episode budget (code_repair's repair
    demonstrations need two turns)."""

    def budget_problems(self, budget: EpisodeBudget) -> list[str]: ...


def episode_returns(turn_rewards_BK: torch.Tensor, discount: float) -> torch.Tensor:
    """``[B]`` returns Σ_k γ^k r_k of per-turn rewards ``[B, K]`` (0 after the last turn)."""
    K = turn_rewards_BK.shape[1]
    gamma_K = discount ** torch.arange(K, dtype=turn_rewards_BK.dtype,
                                       device=turn_rewards_BK.device)
    return (turn_rewards_BK * gamma_K).sum(-1)


class EpisodeTask:
    """A multi-turn task over ``factory``'s environments (module docstring)."""

    family = "sequence"
    has_labels = False
    options: tuple[str, ...] = (*EPISODE_OPTIONS, *EVAL_OPTIONS)

    def __init__(self, name: str, factory: EnvironmentFactory, cfg: TaskConfig,
                 option_prefix: str | None = None, summary: str = "") -> None:
        self.name = name
        self.option_prefix = option_prefix
        """The `EnvConfig` fields this environment reads start with it (None: all of them)."""
        if summary:  # what `rlscope tasks` shows for this environment
            self.__doc__ = summary
        self.options = (*EPISODE_OPTIONS,
                        *(f.name for f in fields(EnvConfig)
                          if option_prefix is None or f.name.startswith(option_prefix)),
                        *EVAL_OPTIONS)
        self.factory = factory
        self.cfg = cfg
        self.vocab_size = factory.vocab_size
        self.budget = EpisodeBudget(max_turns=cfg.max_turns,
                                    max_turn_tokens=cfg.max_turn_tokens,
                                    max_episode_tokens=cfg.max_episode_tokens)
        self.completion_len = cfg.max_episode_tokens
        self._prompt_len: int | None = None
        self.pool = EpisodePool(cfg.env_processes) if cfg.env_processes > 0 else None

    @property
    def prompt_len(self) -> int:
        """The longest initial observation over the held-out seeds of seed 0 and `PROBE_SEEDS`
        more, plus `PROMPT_MARGIN` where observations vary in length (computed once, on first
        use)."""
        if self._prompt_len is None:
            seeds = self._eval_seeds(0) + list(range(PROBE_SEEDS))
            lengths = [len(o) for o in initial_observations(self.factory, seeds)]
            margin = PROMPT_MARGIN if min(lengths) != max(lengths) else 0
            self._prompt_len = max(lengths) + margin
        return self._prompt_len

    @property
    def environment_factory(self) -> EnvironmentFactory:
        return self.factory

    @property
    def episode_budget(self) -> EpisodeBudget:
        return self.budget

    @property
    def episode_pool(self) -> EpisodePool | None:
        return self.pool

    @property
    def traits(self) -> TaskTraits:
        """Turns end at the factory's turn stop tokens; returns are not 0/1 in general and do
        not decompose over tokens."""
        return TaskTraits(stop_token_ids=tuple(self.factory.turn_stop_token_ids))

    def _prompts(self, seeds: list[int], width: int = 0) -> PromptBatch:
        """The initial observations of ``seeds``' environments, left-padded to the longest
        (at least ``width``), with the seeds."""
        observations = [torch.tensor(o, dtype=torch.long)
                        for o in initial_observations(self.factory, seeds)]
        P = max(width, *(o.numel() for o in observations))
        tokens_BP = torch.zeros(len(seeds), P, dtype=torch.long)
        mask_BP = torch.zeros(len(seeds), P, dtype=torch.long)
        for i, o in enumerate(observations):
            tokens_BP[i, P - o.numel():] = o
            mask_BP[i, P - o.numel():] = 1
        return PromptBatch(tokens_BP=tokens_BP, attention_mask_BP=mask_BP,
                           env_seeds_B=torch.tensor(seeds, dtype=torch.long))

    def sample_prompts(self, generator: torch.Generator, n: int) -> PromptBatch:
        """``n`` fresh environments: their seeds from ``generator`` and initial observations."""
        seeds = torch.randint(0, SEED_RANGE, (n,), generator=generator).tolist()
        return self._prompts(seeds)

    def sft_pairs(self, generator: torch.Generator, n: int) -> list[MaskedPair]:
        """``n`` demonstration episodes of fresh seeds from ``generator``, as (initial
        observation, the segments after it, 1 on the policy's tokens): the episodes the
        sampler would record for the demonstrator's turns (`rlscope sft` learns the policy's
        segments only, less those marked `Unlearned`). A seed whose initial observation is
        longer than ``prompt_len`` is skipped (another is drawn); a demonstration that exceeds
        the turn or episode token budget is a ValueError naming the option to raise."""
        if not isinstance(self.factory, Demonstrator):
            raise ValueError(f"environment {self.factory.name!r} has no demonstrations "
                             "(rlscope sft needs them: give --data FILE.jsonl)")
        b, P = self.budget, self.prompt_len
        pairs: list[MaskedPair] = []
        while len(pairs) < n:
            seed = int(torch.randint(0, SEED_RANGE, (1,), generator=generator))
            segments = self.factory.demonstration(seed, max_turns=b.max_turns)
            if len(segments[0][0]) > P:
                continue
            while len(segments) > 1 and not segments[-1][1]:  # no observation after the end
                segments.pop()
            completion: list[int] = []
            mask: list[int] = []
            for tokens, is_policy in segments[1:]:
                if is_policy and len(tokens) > b.max_turn_tokens:
                    raise ValueError(
                        f"{self.name}: the demonstration of seed {seed} has a policy turn of "
                        f"{len(tokens)} tokens: raise --max_turn_tokens (now "
                        f"{b.max_turn_tokens}) to at least {len(tokens)}")
                completion += tokens
                learnt = is_policy and not isinstance(tokens, Unlearned)
                mask += [int(learnt)] * len(tokens)
            if len(completion) > b.max_episode_tokens:
                raise ValueError(
                    f"{self.name}: the demonstration of seed {seed} has {len(completion)} "
                    f"tokens after the initial observation: raise --max_episode_tokens (now "
                    f"{b.max_episode_tokens}) to at least {len(completion)}")
            pairs.append((list(segments[0][0]), completion, mask))
        return pairs

    def score(self, batch: RolloutBatch) -> Scores:
        """The episode return Σ_k γ^k r_k of each row."""
        if batch.turn_rewards_BK is None:
            raise ValueError(f"{self.name}: the batch holds no episodes (turn_rewards_BK); "
                             "sample it with rlscope.sampling.episodes.generate_episodes")
        return Scores(rewards_B=episode_returns(batch.turn_rewards_BK, self.cfg.turn_discount))

    def expected_reward(self, logp_targets_BT: torch.Tensor) -> torch.Tensor | None:
        """Not exposed (an episode's return depends on the environment's answers)."""
        return None

    def _eval_seeds(self, seed: int) -> list[int]:
        g = torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET)
        n = self.cfg.eval_batches * self.cfg.eval_batch_size
        return torch.randint(0, SEED_RANGE, (n,), generator=g).tolist()

    def eval_prompts(self, seed: int) -> list[PromptBatch]:
        """``eval_batches`` held-out sets of ``eval_batch_size`` environments, fixed per
        seed."""
        seeds = self._eval_seeds(seed)
        size = self.cfg.eval_batch_size
        # one width for every set (the evaluation stacks them)
        width = max(len(o) for o in initial_observations(self.factory, seeds))
        return [self._prompts(seeds[i:i + size], width) for i in range(0, len(seeds), size)]

    def eval_metrics(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """Per greedy episode: ``success``, ``test_error`` = 1 − success, ``turns``,
        ``return``."""
        if batch.end_reason_B is None or batch.turns_B is None:
            raise ValueError(f"{self.name}: evaluation needs an episode batch")
        success_B = (batch.end_reason_B == DONE_REASONS.index("solved")).float()
        return {"success": success_B, "test_error": 1.0 - success_B,
                "turns": batch.turns_B.float(), "return": self.score(batch).rewards_B}

    def describe(self) -> str:
        b = self.budget
        return (f"{self.name}: multi-turn episodes against the {self.factory.name} environment "
                f"(at most {b.max_turns} turns of {b.max_turn_tokens} tokens, "
                f"{b.max_episode_tokens} tokens per episode; return discounted per turn by "
                f"{self.cfg.turn_discount})")

    def validate(self) -> list[str]:
        c = self.cfg
        errors = unused_option_errors(
            c, self.name, ("vocab", "seq_len", "binary_reward", "score_len", "reward_noise",
                           "reward_noise_mode"), " (an interactive task)")
        errors += env_option_errors(c, self.name, self.option_prefix or "")
        errors += self.budget.validate()
        if not 0.0 < c.turn_discount <= 1.0:
            errors.append(f"task.turn_discount={c.turn_discount} must lie in (0, 1] "
                          "(--turn_discount)")
        if not self.factory.turn_stop_token_ids:
            errors.append(f"environment {self.factory.name!r} declares no turn stop token")
        if isinstance(self.factory, ValidatedFactory):  # the environment's own options
            errors += self.factory.validate()
        if isinstance(self.factory, BudgetValidatedFactory):
            errors += self.factory.budget_problems(self.budget)
        if c.eval_batches < 1 or c.eval_batch_size < 1:
            errors.append("task.eval_batches and task.eval_batch_size must be >= 1")
        if c.env_processes < 0:
            errors.append(f"task.env_processes={c.env_processes} must be >= 0 (0 = step the "
                          "environments in the trainer's process)")
        return errors


def environment_task(name: str, option_prefix: str, summary: str
                     ) -> Callable[[TaskConfig], EpisodeTask]:
    """The `TASKS` constructor of the registered environment ``name`` (`ENVIRONMENTS`): an
    `EpisodeTask` over its factory built from the run's `EnvConfig`, reading the options named
    ``option_prefix…``; ``summary`` is what `rlscope tasks` shows."""
    def make(cfg: TaskConfig) -> EpisodeTask:
        return EpisodeTask(name, ENVIRONMENTS[name](cfg.env), cfg, option_prefix, summary)
    return make
