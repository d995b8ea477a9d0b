"""``unique_path``: a tree with one rewarded path per prompt (COMPANIONS.md §5, Learnability).

Each of N = ``--num_prompts`` prompts (0 → 128) has a random target action per depth, drawn from
``--task_seed`` (never the run seed). An episode takes H = ``--horizon`` decisions among
b = ``--branching`` actions; a wrong action ends it with reward 0, and H right actions earn 1.
The H positions are sampled as one completion and `score` returns a mask that drops the
positions after the first wrong action (`Scores.valid_mask_BT`, multiplied into the loss mask),
so the trajectory's length is the number of actions taken.

The policy is the task's own `rlscope.policy.tabular.TabularPolicy`, one categorical per
(prompt, depth), each target starting at probability p₀ = ``--initial_correct_probability``.
Evaluation is exact, read from the table (p_{x,d} = π(target | x, d), reach_{x,d} =
Π_{t<d} p_{x,t}, q_x = Π_d p_{x,d}; means over the N prompts), beside the greedy test error.
"""

from __future__ import annotations

import torch

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.metrics.learnability import mixed_group_probability, pass_at_k
from rlscope.policy.base import Policy
from rlscope.policy.tabular import TabularPolicy
from rlscope.tasks.base import (
    EVAL_OPTIONS,
    NOISE_OPTIONS,
    Scores,
    TaskConfig,
    TaskTraits,
    refuse_transformer_options,
    unused_option_errors,
)

DEFAULT_NUM_PROMPTS = 128
DEFAULT_GROUP_SIZE = 8


def path_targets(num_prompts: int, horizon: int, branching: int, task_seed: int
                 ) -> torch.Tensor:
    """The target action per (prompt, depth), ``[N, H]`` long, from ``task_seed`` alone."""
    generator = torch.Generator().manual_seed(task_seed)
    return torch.randint(0, branching, (num_prompts, horizon), generator=generator)


def path_valid_mask(correct_BT: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` float: 1 on every action up to and including the first wrong one (the
    episode has ended after it), 0 after. ``correct_BT`` is 1 where the action is the
    target."""
    alive_BT = correct_BT.float().cumprod(-1)
    return torch.cat([torch.ones_like(alive_BT[:, :1]), alive_BT[:, :-1]], dim=-1)


def exact_path_metrics(p_NH: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    """Per prompt (``[N]`` each), from the target probabilities ``p_NH``: ``success_probability``
    q = Π_d p_d, ``pass_at_group_size`` 1 − (1 − q)^K, ``predicted_mixed_group_rate``
    M(q, K), ``mean_state_correct_probability`` mean_d p_d, ``expected_visited_steps``
    Σ_d reach_d (reach_d = Π_{t<d} p_t), ``correct_probability_d{d}`` and
    ``reach_probability_d{d}``."""
    p_NH = p_NH.double()
    reach_NH = torch.cat([torch.ones_like(p_NH[:, :1]), p_NH.cumprod(-1)[:, :-1]], dim=-1)
    q_N = p_NH.prod(-1)
    out = {"success_probability": q_N,
           "pass_at_group_size": pass_at_k(q_N, group_size),
           "predicted_mixed_group_rate": mixed_group_probability(q_N, group_size),
           "mean_state_correct_probability": p_NH.mean(-1),
           "expected_visited_steps": reach_NH.sum(-1)}
    for d in range(p_NH.shape[1]):
        out[f"correct_probability_d{d}"] = p_NH[:, d]
        out[f"reach_probability_d{d}"] = reach_NH[:, d]
    return {k: v.float() for k, v in out.items()}


class UniquePathTask:
    """One rewarded path of H decisions per prompt; a wrong action ends the episode."""

    name = "unique_path"
    family = "sequence"
    traits = TaskTraits(binary_rewards=True)
    options: tuple[str, ...] = ("num_prompts", "horizon", "branching", "task_seed",
                                "initial_correct_probability")
    has_labels = True
    prompt_len = 1

    def __init__(self, cfg: TaskConfig) -> None:
        self.cfg = cfg
        self.num_prompts = cfg.num_prompts or DEFAULT_NUM_PROMPTS
        self.vocab_size = max(cfg.branching, 2)
        """Actions 0..b − 1 (the tabular policy's output width; prompt ids are 0..N − 1)."""
        self.completion_len = max(cfg.horizon, 1)
        self.targets_NH = path_targets(self.num_prompts, self.completion_len, self.vocab_size,
                                       cfg.task_seed)
        self.group_size = DEFAULT_GROUP_SIZE
        """K of the exact pass@K and M(q, K) (the run's group size, `use_group_size`)."""
        self.policy: TabularPolicy | None = None
        """The policy the exact metrics read: the first one `build_policy` built."""

    def validate(self) -> list[str]:
        c = self.cfg
        errors = []
        if c.num_prompts < 0:
            errors.append(f"task.num_prompts={c.num_prompts} must be >= 1 (0 = "
                          f"{DEFAULT_NUM_PROMPTS})")
        if c.horizon < 1:
            errors.append(f"task.horizon={c.horizon}: unique_path needs at least one decision; "
                          "set --horizon >= 1")
        if c.branching < 2:
            errors.append(f"task.branching={c.branching}: a decision needs at least two "
                          "actions; set --branching >= 2")
        if not 0 < c.initial_correct_probability < 1:
            errors.append(f"task.initial_correct_probability={c.initial_correct_probability} "
                          "must be strictly between 0 and 1")
        errors += unused_option_errors(c, self.name, ("vocab", "seq_len", "score_len",
                                                      "binary_reward"),
                                       " (its actions are --branching, its length --horizon)")
        errors += unused_option_errors(c, self.name, NOISE_OPTIONS,
                                       ": the learnability experiments need clean rewards")
        errors += unused_option_errors(c, self.name, EVAL_OPTIONS,
                                       f": evaluation is exact over all {self.num_prompts} "
                                       "prompts")
        return errors

    def describe(self) -> str:
        return (f"{self.name}: {self.num_prompts} prompts, H={self.completion_len} decisions "
                f"of b={self.vocab_size} actions, one rewarded path each (task_seed "
                f"{self.cfg.task_seed}); tabular policy, p0="
                f"{self.cfg.initial_correct_probability}")

    def build_policy(self, model_cfg: object) -> Policy:
        """The task's own `TabularPolicy` (the transformer options do not apply)."""
        model_cfg = refuse_transformer_options(model_cfg, self.name, "tabular policy")
        policy = TabularPolicy(self.targets_NH, self.vocab_size,
                               self.cfg.initial_correct_probability)
        policy = policy.to(getattr(torch, model_cfg.dtype))
        if self.policy is None:
            self.policy = policy
        return policy

    def use_group_size(self, group_size: int) -> None:
        """K of the exact pass@K and M(q, K) (the run's group size)."""
        self.group_size = group_size

    def _prompts(self, index_B: torch.Tensor) -> PromptBatch:
        return PromptBatch(tokens_BP=index_B[:, None], targets_BT=self.targets_NH[index_B],
                           score_mask_BT=torch.ones(index_B.shape[0], self.completion_len))

    def sample_prompts(self, generator: torch.Generator, n: int) -> PromptBatch:
        """``n`` prompt ids drawn uniformly with replacement."""
        return self._prompts(torch.randint(0, self.num_prompts, (n,), generator=generator))

    def eval_prompts(self, seed: int) -> list[PromptBatch]:
        """Every prompt once, in order (the exact metrics are means over prompts)."""
        return [self._prompts(torch.arange(self.num_prompts))]

    def _correct_BT(self, batch: RolloutBatch) -> torch.Tensor:
        if batch.targets_BT is None:
            raise ValueError("unique_path: rollout batch carries no targets")
        T = self.completion_len
        return ((batch.completion_tokens_BT[:, :T] == batch.targets_BT[:, :T])
                & batch.completion_mask_BT[:, :T].bool())

    def score(self, batch: RolloutBatch) -> Scores:
        """Reward 1 iff all H actions are right; the valid mask ends at the first wrong one."""
        correct_BT = self._correct_BT(batch)
        reward_B = correct_BT.all(-1).float()
        valid_BT = torch.zeros_like(batch.completion_mask_BT, dtype=torch.float)
        valid_BT[:, :self.completion_len] = path_valid_mask(correct_BT)
        return Scores(rewards_B=reward_B, valid_mask_BT=valid_BT)

    def expected_reward(self, logp_targets_BT: torch.Tensor) -> torch.Tensor | None:
        """E[r | x] = Π_d π(target_d | x, d), exact."""
        return logp_targets_BT[:, :self.completion_len].sum(-1).exp()

    def eval_metrics(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """``test_error`` (1 − greedy success) per row and, where the task built the policy,
        the exact metrics of each row's prompt (`exact_path_metrics`)."""
        out = {"test_error": 1.0 - self._correct_BT(batch).all(-1).float()}
        if self.policy is not None:
            p_NH = self.policy.probabilities_NH(self.targets_NH)
            prompt_B = batch.prompt_tokens_BP[:, -1].to(p_NH.device)
            exact = exact_path_metrics(p_NH, self.group_size)
            device = batch.completion_tokens_BT.device
            out |= {k: v[prompt_B].to(device) for k, v in exact.items()}
        return out
