"""``vector_pareto``: a bandit with two objectives (COMPANIONS.md §2, VPO).

P = ``--num_prompts`` prompts (0 → 8), 7 actions, O = 2 objectives. Every prompt reuses one
base table b of reward vectors, rolled by the prompt: R(p, a) = b[(a − p) mod 7], its two
components swapped when p is odd. The gold scalarisation w* = (0.5, 0.5) scores the best
single answer (0.6, 0.6) at 0.6; the corner answers (1, 0) and (0, 1) score 0.5 each, but a set
holding both serves every preference w better than the compromise alone.

The pure parts live here: the reward table, the reward vectors of sampled candidates and the
pool metrics of the evaluation (best@k, in-set diversity). The model (`rlscope.policy.
set_policy.SetPolicy`) and the update (the ``set`` step, `rlscope.steps.set_step`) live apart.
"""

from __future__ import annotations

import torch

BASE_TABLE = ((1.0, 0.0), (0.85, 0.25), (0.6, 0.6), (0.25, 0.85), (0.0, 1.0), (0.3, 0.2),
              (0.05, 0.05))
"""The base reward vectors b[a] of the 7 actions (prompt 0's row)."""
NUM_ACTIONS = len(BASE_TABLE)
NUM_OBJECTIVES = 2
GOLD_WEIGHTS = (0.5, 0.5)
"""w*: the gold scalarisation (``scalar_grpo``'s and ``multi_rlvr``'s score, the evaluation's)."""
DEFAULT_NUM_PROMPTS = 8
EVAL_SETS = 12
"""Sets sampled per prompt for one evaluation pool (pool of 12·M candidates)."""
BEST_AT = (1, 3, 9)
"""The k of ``eval/best@k``: the best gold score among the pool's first k candidates."""


def num_prompts_of(num_prompts: int) -> int:
    """P in force: ``--num_prompts``, 0 → 8."""
    return num_prompts or DEFAULT_NUM_PROMPTS


def reward_table(num_prompts: int) -> torch.Tensor:
    """``[P, A, O]``: R(p, a) = b[(a − p) mod A], the two objectives swapped when p is odd."""
    base_AO = torch.tensor(BASE_TABLE)
    actions_A = torch.arange(NUM_ACTIONS)
    rows = []
    for p in range(num_prompts):
        rolled_AO = base_AO[(actions_A - p) % NUM_ACTIONS]
        rows.append(rolled_AO.flip(-1) if p % 2 else rolled_AO)
    return torch.stack(rows)


def gold_weights(device: torch.device | str = "cpu") -> torch.Tensor:
    """``[O]`` w* = (0.5, 0.5)."""
    return torch.tensor(GOLD_WEIGHTS, device=device)


def candidate_rewards(table_PAO: torch.Tensor, prompt_ids_B: torch.Tensor,
                      actions_BM: torch.Tensor) -> torch.Tensor:
    """``[B, M, O]``: the reward vector R(p_b, a_bm) of each candidate."""
    return table_PAO[prompt_ids_B[:, None], actions_BM]


def in_set_diversity(rewards_SMO: torch.Tensor) -> torch.Tensor:
    """``[S]``: per set, the mean pairwise L1 distance ‖r_m − r_m'‖₁ over its m < m' pairs
    (0 for a set of one candidate)."""
    M = rewards_SMO.shape[1]
    if M < 2:
        return rewards_SMO.new_zeros(rewards_SMO.shape[0])
    dist_SMM = (rewards_SMO[:, :, None, :] - rewards_SMO[:, None, :, :]).abs().sum(-1)
    upper_MM = torch.ones(M, M, dtype=torch.bool, device=rewards_SMO.device).triu(1)
    return dist_SMM[:, upper_MM].mean(-1)


def pool_metrics(rewards_PSMO: torch.Tensor, gold_O: torch.Tensor) -> dict[str, torch.Tensor]:
    """Evaluation pool metrics (means over the P prompts). Per prompt, the S sets' candidates
    listed set by set form the pool x_1..x_{S·M}, s_i = w*ᵀ r(x_i): ``mean_scalar_reward`` the
    mean s_i; ``best@k`` = max(s_1..s_k) for k in `BEST_AT` (capped at the pool size);
    ``pool_diversity_l1`` the mean over sets of `in_set_diversity`."""
    P, S, M, n_obj = rewards_PSMO.shape
    s_PI = (rewards_PSMO.reshape(P, S * M, n_obj) * gold_O).sum(-1)
    out = {"mean_scalar_reward": s_PI.mean()}
    for k in BEST_AT:
        out[f"best@{k}"] = s_PI[:, :min(k, S * M)].max(-1).values.mean()
    out["pool_diversity_l1"] = in_set_diversity(rewards_PSMO.reshape(P * S, M, n_obj)).mean()
    return out


__all__ = ["BASE_TABLE", "BEST_AT", "DEFAULT_NUM_PROMPTS", "EVAL_SETS", "GOLD_WEIGHTS",
           "NUM_ACTIONS", "NUM_OBJECTIVES", "candidate_rewards", "gold_weights",
           "in_set_diversity", "num_prompts_of", "pool_metrics", "reward_table"]
