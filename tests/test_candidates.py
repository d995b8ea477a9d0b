"""Candidate sampling: candidate 0 is the behaviour token, the others follow the behaviour
distribution, rewards are dense and zero where nothing is scored."""

from __future__ import annotations

import torch

from rlscope.batch import RolloutBatch
from rlscope.policy.tiny import TinyConfig, TinyTransformer
from rlscope.sampling import SamplingConfig, generate
from rlscope.sampling.candidates import sample_candidates
from rlscope.tasks import TaskConfig, make_task


def _rollout(task_name: str = "token_reversal", rows: int = 8, **options: int
             ) -> tuple[TinyTransformer, RolloutBatch]:
    task = make_task(task_name, TaskConfig(vocab=3, seq_len=5, **options))
    torch.manual_seed(0)
    policy = TinyTransformer(TinyConfig(vocab_size=task.vocab_size, max_len=16)).eval()
    g = torch.Generator().manual_seed(0)
    prompts = task.sample_prompts(g, rows)
    seeds = torch.randint(0, 2**62, (rows,), generator=g)
    return policy, generate(policy, prompts, SamplingConfig(), seeds, task.completion_len)


def test_candidate_zero_is_the_behaviour_token_with_its_log_prob() -> None:
    policy, batch = _rollout()
    cands = sample_candidates(policy, batch, 6, torch.Generator().manual_seed(1))
    assert cands.candidates_BTK.shape == (8, 5, 6)
    assert torch.equal(cands.candidates_BTK[..., 0], batch.completion_tokens_BT)
    torch.testing.assert_close(cands.logp_old_BTK[..., 0], batch.logp_sampler_BT,
                               atol=1e-5, rtol=0)


def test_candidate_frequencies_follow_the_behaviour_distribution() -> None:
    """Chi-square over 4,000 candidates at one prefix: the draws come from π(· | prefix)."""
    policy, batch = _rollout(rows=1)
    with torch.no_grad():
        head = policy.head.weight
        head.mul_(4.0)  # a peaked distribution makes the test sharper
    K = 4001
    cands = sample_candidates(policy, batch, K, torch.Generator().manual_seed(2))
    tokens_BL, _ = batch.full_tokens()
    with torch.no_grad():
        logits = policy(tokens_BL)[0][0, batch.prompt_len - 1 + 2]
    probs = logits.softmax(-1)
    draws = cands.candidates_BTK[0, 2, 1:]
    counts = torch.bincount(draws, minlength=probs.numel()).double()
    expected = probs.double() * (K - 1)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 13.8  # 3 degrees of freedom, p = 0.003


def test_rewards_are_dense_and_zero_at_unscored_positions() -> None:
    policy, batch = _rollout("masked_reversal", score_len=2)
    cands = sample_candidates(policy, batch, 5, torch.Generator().manual_seed(3))
    assert batch.targets_BT is not None
    hits = (cands.candidates_BTK == batch.targets_BT[..., None]).float()
    assert torch.equal(cands.rewards_BTK[:, 3:], hits[:, 3:])
    assert cands.rewards_BTK[:, :3].abs().sum() == 0
    assert torch.equal(cands.behaviour_rewards_BT, cands.rewards_BTK[..., 0])


def test_candidates_are_reproducible_and_select_rows() -> None:
    policy, batch = _rollout()
    a = sample_candidates(policy, batch, 4, torch.Generator().manual_seed(5))
    b = sample_candidates(policy, batch, 4, torch.Generator().manual_seed(5))
    assert torch.equal(a.candidates_BTK, b.candidates_BTK)
    picked = a.select(torch.tensor([1, 3]))
    assert torch.equal(picked.candidates_BTK, a.candidates_BTK[[1, 3]])
    assert torch.equal(picked.rollout.completion_tokens_BT, batch.completion_tokens_BT[[1, 3]])
