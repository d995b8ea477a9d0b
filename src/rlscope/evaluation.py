"""Held-out evaluation: greedy decoding on the task's fixed evaluation set.

``eval/test_error`` and the task's own metrics are means over prompts; ``eval/entropy`` is the
mean per-step entropy of the raw policy along the greedy rollouts. An interactive task's
rollouts are greedy episodes from its held-out environment seeds (``env_seeds_B``).
`sampled_episodes` plays the held-out episodes at a temperature instead (the success RL
maximises, where the greedy one is at its ceiling: code_repair in docs/recipes.md).
"""

from __future__ import annotations

import torch

from rlscope.batch import PromptBatch
from rlscope.envs.base import DONE_REASONS
from rlscope.methods.opd import opd_diagnostics
from rlscope.methods.teacher import Teacher
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


SAMPLED_EVAL_OFFSET = 1_000_003
"""First sampling seed of `sampled_episodes` (episode i samples with seed offset + i)."""


@torch.no_grad()
def sampled_episodes(policy: Policy, task: Interactive, env_seeds_B: torch.Tensor,
                     samples: int, temperature: float, chunk: int = 100
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Play each environment seed of ``env_seeds_B`` ``samples`` times at ``temperature``
    (0: greedy) and return ``(solved_N, turns_N)``, ``N = B × samples`` rows seed-major: 1.0
    where the episode ended 'solved', and its policy turns. Episode i samples with seed
    ``SAMPLED_EVAL_OFFSET + i``, so two policies (a warm start and an RL run from it) are
    compared on the same episodes and random streams; ``chunk`` episodes decode together."""
    if samples < 1 or temperature < 0 or chunk < 1:
        raise ValueError(f"sampled_episodes needs samples >= 1, temperature >= 0, chunk >= 1 "
                         f"(got {samples}, {temperature}, {chunk})")
    env_seeds_N = env_seeds_B.cpu().repeat_interleave(samples)
    device = next(policy.parameters()).device
    cfg = SamplingConfig(temperature=temperature, decode_graphs=False)
    solved, turns = [], []
    for lo in range(0, len(env_seeds_N), chunk):
        seeds_C = env_seeds_N[lo:lo + chunk]
        rows_C = torch.arange(lo, lo + len(seeds_C)) + SAMPLED_EVAL_OFFSET
        rollout = generate_episodes(policy, task.environment_factory, seeds_C.to(device),
                                    task.episode_budget, cfg, rows_C.to(device),
                                    pool=task.episode_pool)
        assert rollout.end_reason_B is not None and rollout.turns_B is not None
        solved.append((rollout.end_reason_B == DONE_REASONS.index("solved")).float().cpu())
        turns.append(rollout.turns_B.cpu())
    return torch.cat(solved), torch.cat(turns)


OPD_EVAL_OFFSET = 7_000_003
"""Stream offset of the OPD diagnostics' prompts and samples (apart from the training stream)."""


@torch.no_grad()
def opd_evaluation(policy: Policy, task: Task, teacher: Teacher, generator: torch.Generator,
                   batch_size: int, max_new_tokens: int, overlap_k: int, support_k: int,
                   support: str) -> dict[str, torch.Tensor]:
    """The OPD diagnostics of COMPANIONS.md §1 (`rlscope.methods.opd.opd_diagnostics`) on a
    fresh batch of ``batch_size`` student samples at temperature 1, its prompts and seeds
    drawn from ``generator`` (the evaluation stream: the training stream stays untouched),
    plus ``eval/sampled_reward`` (the task reward of those samples) and ``eval/token_error``
    (greedy token error against the targets on the same prompts)."""
    device = next(policy.parameters()).device  # type: ignore[attr-defined]
    prompts = task.sample_prompts(generator, batch_size)
    seeds_B = torch.randint(0, 2**62, (batch_size,), generator=generator).to(device)
    prompts = prompts.to(device)
    rollout = generate(policy, prompts, SamplingConfig(temperature=1.0), seeds_B,
                       max_new_tokens)
    tokens_BT, mask_BT = rollout.completion_tokens_BT, rollout.completion_mask_BT
    full_BL = torch.cat([rollout.prompt_tokens_BP, tokens_BT], 1)
    mask_BL = None if rollout.prompt_mask_BP is None \
        else torch.cat([rollout.prompt_mask_BP, torch.ones_like(tokens_BT)], 1)
    logits_BLV, _ = policy.forward(full_BL, mask_BL)
    P, T = rollout.prompt_len, tokens_BT.shape[1]
    student_BTV = logits_BLV[:, P - 1:P - 1 + T].float().log_softmax(-1)
    teacher_BTV = teacher.logp_BTV(rollout).to(student_BTV)
    out = opd_diagnostics(student_BTV, teacher_BTV, tokens_BT, mask_BT, overlap_k, support_k,
                          support)
    out["eval/sampled_reward"] = task.score(rollout).rewards_B.float().mean()
    greedy = generate(policy, prompts, GREEDY, seeds_B, max_new_tokens)
    assert prompts.targets_BT is not None
    targets_BT = prompts.targets_BT[:, :greedy.completion_tokens_BT.shape[1]]
    wrong_BT = (greedy.completion_tokens_BT[:, :targets_BT.shape[1]] != targets_BT).float()
    out["eval/token_error"] = wrong_BT.mean()
    return out
