"""Held-out evaluation: greedy decoding on the task's fixed evaluation set.

``eval/test_error`` and the task's own metrics are means over prompts; ``eval/entropy`` is the
mean per-step entropy of the raw policy along the greedy rollouts. An interactive task's
rollouts are greedy episodes from its held-out environment seeds (``env_seeds_B``).
"""

from __future__ import annotations

import torch

from rlscope.batch import PromptBatch
from rlscope.policy.base import Policy
from rlscope.sampling.episodes import generate_episodes
from rlscope.sampling.sampler import SamplingConfig, generate
from rlscope.tasks.base import Interactive, Task

GREEDY = SamplingConfig(temperature=0.0)


def heldout_batch(task: Task, seed: int) -> PromptBatch:
    """The task's held-out prompts of ``seed`` (``task.eval_prompts``) as one batch, attention
    masks and targets kept (every set of one task has the same prompt width)."""
    sets = task.eval_prompts(seed)

    def cat(name: str) -> torch.Tensor | None:
        values = [getattr(p, name) for p in sets]
        return None if any(v is None for v in values) else torch.cat(values)

    tokens_BP = cat("tokens_BP")
    assert tokens_BP is not None
    return PromptBatch(tokens_BP=tokens_BP, attention_mask_BP=cat("attention_mask_BP"),
                       targets_BT=cat("targets_BT"), score_mask_BT=cat("score_mask_BT"),
                       env_seeds_B=cat("env_seeds_B"))


@torch.no_grad()
def evaluate(policy: Policy, task: Task, prompt_sets: list[PromptBatch],
             max_new_tokens: int, stop_token_ids: tuple[int, ...] = (),
             decode_graphs: bool = True) -> dict[str, torch.Tensor]:
    """``{"eval/<name>": 0-d tensor}`` over every prompt of ``prompt_sets``
    (``decode_graphs``: see `SamplingConfig`)."""
    cfg = SamplingConfig(temperature=0.0, stop_token_ids=stop_token_ids,
                         decode_graphs=decode_graphs)
    sums: dict[str, torch.Tensor] = {}
    n_rows = 0
    ent_sum = ent_count = None
    for prompts in prompt_sets:
        seeds_B = torch.zeros(prompts.batch_size, dtype=torch.long,
                              device=prompts.tokens_BP.device)
        if isinstance(task, Interactive):  # greedy episodes from the held-out seeds
            assert prompts.env_seeds_B is not None
            rollout = generate_episodes(policy, task.environment_factory, prompts.env_seeds_B,
                                        task.episode_budget, cfg, seeds_B, with_entropy=True,
                                        pool=task.episode_pool)
        else:
            rollout = generate(policy, prompts, cfg, seeds_B, max_new_tokens,
                               with_entropy=True)
        for name, value_B in task.eval_metrics(rollout).items():
            sums[name] = sums.get(name, 0.0) + value_B.sum()
        n_rows += prompts.batch_size
        assert rollout.entropy_BT is not None
        e, c = rollout.entropy_BT.sum(), rollout.completion_mask_BT.sum()
        ent_sum = e if ent_sum is None else ent_sum + e
        ent_count = c if ent_count is None else ent_count + c
    out = {f"eval/{k}": v / n_rows for k, v in sums.items()}
    assert ent_sum is not None and ent_count is not None
    out["eval/entropy"] = ent_sum / ent_count.clamp_min(1.0)
    return out
