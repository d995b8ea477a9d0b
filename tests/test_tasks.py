"""Reversal tasks (TASKS.md, "Toy tasks") on hand-made completions: rewards, eval metrics,
expected reward, and the held-out evaluation sets."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from rlscope.batch import RolloutBatch
from rlscope.config import OptimConfig, RunConfig, TrainConfig
from rlscope.envs.config import EnvConfig
from rlscope.learner import forward_completion
from rlscope.policy.tiny import TinyConfig, TinyTransformer
from rlscope.sampling import SamplingConfig, generate
from rlscope.sampling.processors import SampledDistribution
from rlscope.tasks import TASKS, TaskConfig, make_task
from rlscope.tasks.reversal import ChainReversalTask, MaskedReversalTask, ReversalTask
from rlscope.train import train


def _rollout(targets: list[int], completions: list[list[int]], vocab: int) -> RolloutBatch:
    """A rollout batch whose rows all share one target; completions may be shorter than it."""
    B, T = len(completions), max(len(c) for c in completions)
    tokens_BT = torch.zeros(B, T, dtype=torch.long)
    mask_BT = torch.zeros(B, T)
    for i, c in enumerate(completions):
        tokens_BT[i, :len(c)] = torch.tensor(c)
        mask_BT[i, :len(c)] = 1.0
    content = list(reversed(targets))
    prompt_BP = torch.tensor([[*content, vocab]] * B)
    return RolloutBatch(
        prompt_tokens_BP=prompt_BP, prompt_mask_BP=None, completion_tokens_BT=tokens_BT,
        completion_mask_BT=mask_BT, logp_sampler_BT=torch.zeros(B, T),
        logp_raw_BT=torch.zeros(B, T), finished_by_stop_B=torch.zeros(B, dtype=torch.bool),
        group_id_B=torch.arange(B), targets_BT=torch.tensor([targets] * B))


# token_reversal, seq_len 4 over V = 3 (SEP = 3); content [0, 1, 2, 1] → target [1, 2, 1, 0].
TARGET = [1, 2, 1, 0]
CASES = [  # completion, fractional reward, binary reward
    ([1, 2, 1, 0], 1.0, 1.0),   # right
    ([0, 0, 0, 1], 0.0, 0.0),   # wrong everywhere
    ([1, 2, 0, 0], 0.75, 0.0),  # partially right
    ([1, 3, 1, 0], 0.75, 0.0),  # SEP is legal but never correct
    ([3, 3, 3, 3], 0.0, 0.0),   # all SEP
    ([1, 2], 0.5, 0.0),         # stopped early: pad positions after the stop count as wrong
]


def test_completion_narrower_than_target_counts_missing_positions_wrong() -> None:
    task = ReversalTask(TaskConfig(vocab=3, seq_len=4))
    batch = _rollout(TARGET, [[1, 2], [1, 0]], vocab=3)  # every row stopped after 2 tokens
    assert batch.completion_tokens_BT.shape == (2, 2)
    assert task.score(batch).rewards_B.tolist() == [0.5, 0.25]
    assert task.eval_metrics(batch)["test_error"].tolist() == [0.5, 0.75]


@pytest.mark.parametrize("binary", [False, True])
def test_token_reversal_rewards(binary: bool) -> None:
    task = ReversalTask(TaskConfig(vocab=3, seq_len=4, binary_reward=binary))
    assert task.sep == 3 and task.vocab_size == 4
    batch = _rollout(TARGET, [c for c, _, _ in CASES], vocab=3)
    scores = task.score(batch)
    expected = [b if binary else f for _, f, b in CASES]
    assert scores.rewards_B.tolist() == expected
    # dense per-token rewards: the match indicator on every (scored) position
    assert scores.token_rewards_BT is not None
    assert scores.token_rewards_BT[2].tolist() == [1.0, 1.0, 0.0, 1.0]
    assert scores.token_rewards_BT[3].tolist() == [1.0, 0.0, 1.0, 1.0]
    assert scores.token_rewards_BT[5].tolist() == [1.0, 1.0, 0.0, 0.0]
    errors = task.eval_metrics(batch)
    assert set(errors) == {"test_error"}
    assert errors["test_error"].tolist() == [1.0 - r for r in expected]


def test_prompts_are_content_then_sep_with_reversed_targets() -> None:
    task = ReversalTask(TaskConfig(vocab=5, seq_len=6))
    p = task.sample_prompts(torch.Generator().manual_seed(0), 7)
    assert p.tokens_BP.shape == (7, 7) and p.targets_BT is not None
    assert (p.tokens_BP[:, -1] == 5).all()
    assert (p.tokens_BP[:, :-1] < 5).all()
    assert torch.equal(p.targets_BT, p.tokens_BP[:, :-1].flip(1))
    # the reference answer scores 1
    batch = _rollout(p.targets_BT[0].tolist(), [p.targets_BT[0].tolist()], vocab=5)
    assert task.score(batch).rewards_B.tolist() == [1.0]


# masked_reversal, seq_len 4, score_len 2: only positions 2 and 3 are scored.
@pytest.mark.parametrize("binary", [False, True])
def test_masked_reversal_scores_only_the_suffix(binary: bool) -> None:
    task = MaskedReversalTask(TaskConfig(vocab=3, seq_len=4, score_len=2, binary_reward=binary))
    assert task.score_mask_T.tolist() == [0.0, 0.0, 1.0, 1.0]
    completions = [
        [0, 0, 1, 0],  # prefix wrong, suffix right
        [1, 2, 0, 0],  # prefix right, suffix half right
        [1, 2, 1, 0],  # all right
        [0, 0, 0, 1],  # all wrong
        [1, 0, 1, 3],  # prefix half right, suffix half right (SEP)
    ]
    scores = task.score(_rollout(TARGET, completions, vocab=3))
    frac = [1.0, 0.5, 1.0, 0.0, 0.5]
    expected = [float(r == 1.0) for r in frac] if binary else frac
    assert scores.rewards_B.tolist() == expected
    assert scores.token_rewards_BT is not None
    assert scores.token_rewards_BT[0].tolist() == [0.0, 0.0, 1.0, 1.0]
    assert scores.token_rewards_BT[1].tolist() == [0.0, 0.0, 0.0, 1.0]
    metrics = task.eval_metrics(_rollout(TARGET, completions, vocab=3))
    assert set(metrics) == {"test_error", "test_error_unscored"}
    assert metrics["test_error"].tolist() == [1.0 - r for r in expected]
    assert metrics["test_error_unscored"].tolist() == [1.0, 0.0, 0.0, 1.0, 0.5]
    p = task.sample_prompts(torch.Generator().manual_seed(0), 3)
    assert p.score_mask_BT is not None
    assert p.score_mask_BT.tolist() == [[0.0, 0.0, 1.0, 1.0]] * 3


def test_masked_reversal_full_score_len_has_zero_unscored_error() -> None:
    task = MaskedReversalTask(TaskConfig(vocab=3, seq_len=4, score_len=4))
    metrics = task.eval_metrics(_rollout(TARGET, [[0, 0, 0, 0]], vocab=3))
    assert metrics["test_error"].tolist() == [0.75]
    assert metrics["test_error_unscored"].tolist() == [0.0]


def test_masked_reversal_validates_score_len() -> None:
    assert MaskedReversalTask(TaskConfig(seq_len=4, score_len=4)).validate() == []
    for bad in (0, 5):
        errors = MaskedReversalTask(TaskConfig(seq_len=4, score_len=bad)).validate()
        assert any("score_len" in e for e in errors)


@pytest.mark.parametrize(
    ("seq_len", "wrong_at", "expected"),
    [
        # even seq_len 4: halves [0, 1] and [2, 3]
        (4, [], 1.0),
        (4, [1], 1 / 3),     # first half broken; second half exact
        (4, [2], 1 / 3),     # second half broken; first half exact
        (4, [0, 3], 0.0),    # both halves broken
        # odd seq_len 5: split at 5 // 2 = 2, halves [0, 1] and [2, 3, 4]
        (5, [], 1.0),
        (5, [2], 1 / 3),     # position 2 belongs to the second half
        (5, [1], 1 / 3),
        (5, [4], 1 / 3),
        (5, [1, 2], 0.0),
    ],
)
def test_chain_reversal_checkpoints(seq_len: int, wrong_at: list[int], expected: float) -> None:
    task = ChainReversalTask(TaskConfig(vocab=2, seq_len=seq_len))
    target = [i % 2 for i in range(seq_len)]
    completion = [1 - t if i in wrong_at else t for i, t in enumerate(target)]
    batch = _rollout(target, [completion], vocab=2)
    reward = task.score(batch).rewards_B.item()
    assert reward == pytest.approx(expected, abs=1e-7)
    metrics = task.eval_metrics(batch)
    assert metrics["chain_reward"].item() == pytest.approx(expected, abs=1e-7)
    assert metrics["test_error"].item() == (0.0 if not wrong_at else 1.0)


def test_chain_reversal_validation() -> None:
    assert ChainReversalTask(TaskConfig(seq_len=2)).validate() == []
    assert any("seq_len" in e for e in ChainReversalTask(TaskConfig(seq_len=1)).validate())
    errors = ChainReversalTask(TaskConfig(seq_len=4, binary_reward=True)).validate()
    assert any("binary_reward" in e for e in errors)


def test_expected_reward_is_product_of_target_probabilities() -> None:
    probs_BT = torch.tensor([[0.5, 0.8, 0.9, 1.0], [0.1, 0.2, 0.3, 0.4]], dtype=torch.float64)
    task = ReversalTask(TaskConfig(vocab=3, seq_len=4, binary_reward=True))
    got = task.expected_reward(probs_BT.log())
    assert got is not None
    assert got.tolist() == pytest.approx([0.36, 0.0024], rel=1e-12)
    # masked: product over the scored suffix only
    masked = MaskedReversalTask(TaskConfig(vocab=3, seq_len=4, score_len=2, binary_reward=True))
    got = masked.expected_reward(probs_BT.log())
    assert got is not None
    assert got.tolist() == pytest.approx([0.9, 0.12], rel=1e-12)
    # fractional reward: not exposed
    assert ReversalTask(TaskConfig(vocab=3, seq_len=4)).expected_reward(probs_BT.log()) is None


def test_expected_reward_matches_monte_carlo() -> None:
    """Sampling each position independently with the given target probabilities, the exact-match
    rate converges to the product."""
    task = ReversalTask(TaskConfig(vocab=2, seq_len=3, binary_reward=True))
    p_T = torch.tensor([0.9, 0.7, 0.6])
    exact = task.expected_reward(p_T.log()[None])
    assert exact is not None and math.isclose(exact.item(), 0.378, rel_tol=1e-6)
    g = torch.Generator().manual_seed(0)
    hits_NT = torch.rand(200_000, 3, generator=g) < p_T
    assert hits_NT.all(-1).float().mean().item() == pytest.approx(0.378, abs=0.005)


# The token tasks draw their held-out set from the seed; digits_bandit's is the fixed test
# split (tests/test_digits_bandit.py); code_unit_tests' is its fixed held-out specs, which every
# seed draws from, with no targets (tests/test_code_task.py); unique_path's is every prompt
# once (its exact metrics are means over prompts; tests/test_learnability.py).
INTERACTIVE = ("guess_number", "twenty_questions", "calculator_tool", "code_repair")
"""The multi-turn environments: their held-out set is a set of environment seeds."""


@pytest.mark.parametrize("name", [n for n in TASKS
                                  if n not in ("digits_bandit", "code_unit_tests", "unique_path",
                                               *INTERACTIVE)])
def test_eval_sets_deterministic_per_seed_and_distinct_from_training(name: str) -> None:
    task = make_task(name, TaskConfig(eval_batches=3, eval_batch_size=50))
    a, b, other = task.eval_prompts(0), task.eval_prompts(0), task.eval_prompts(1)
    assert len(a) == 3 and all(p.batch_size == 50 for p in a)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x.tokens_BP, y.tokens_BP)
        assert x.targets_BT is not None and y.targets_BT is not None
        assert torch.equal(x.targets_BT, y.targets_BT)
    assert not torch.equal(torch.cat([p.tokens_BP for p in a]),
                           torch.cat([p.tokens_BP for p in other]))
    # the three batches of one set are not copies of each other
    assert not torch.equal(a[0].tokens_BP, a[1].tokens_BP)
    # training prompts come from a generator seeded with the run seed, as in train()
    train_g = torch.Generator().manual_seed(0)
    for _ in range(3):
        train_p = task.sample_prompts(train_g, 50)
        for p in a:
            assert not torch.equal(train_p.tokens_BP, p.tokens_BP)
    # drawing training prompts does not move the held-out set
    assert torch.equal(task.eval_prompts(0)[0].tokens_BP, a[0].tokens_BP)


@pytest.mark.parametrize("name", INTERACTIVE)
def test_interactive_eval_sets_are_environment_seeds_fixed_per_seed(name: str) -> None:
    """An interactive task's hidden state lives in its environment seeds (the initial
    observation may be the same text for every episode): the held-out seeds are the same for
    one run seed, differ for another, and are disjoint from the training stream's."""
    task = make_task(name, TaskConfig(eval_batches=3, eval_batch_size=50))
    a, b, other = task.eval_prompts(0), task.eval_prompts(0), task.eval_prompts(1)
    assert len(a) == 3 and all(p.batch_size == 50 for p in a)
    seeds = [p.env_seeds_B for p in a]
    assert all(s is not None for s in seeds)
    held_out = torch.cat([s for s in seeds if s is not None])
    for x, y in zip(a, b, strict=True):
        assert x.env_seeds_B is not None and y.env_seeds_B is not None
        assert torch.equal(x.tokens_BP, y.tokens_BP) and torch.equal(x.env_seeds_B, y.env_seeds_B)
    assert not torch.equal(held_out, torch.cat([p.env_seeds_B for p in other
                                                if p.env_seeds_B is not None]))
    train_p = task.sample_prompts(torch.Generator().manual_seed(0), 50)
    assert train_p.env_seeds_B is not None
    assert not set(train_p.env_seeds_B.tolist()) & set(held_out.tolist())
    assert torch.equal(task.eval_prompts(0)[0].env_seeds_B, seeds[0])


def test_make_task_unknown_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="token_reversal") as info:
        make_task("nope")
    for name in TASKS:
        assert name in str(info.value)


def test_reversal_validation() -> None:
    assert ReversalTask(TaskConfig()).validate() == []
    assert any("vocab" in e for e in ReversalTask(TaskConfig(vocab=1)).validate())
    assert any("seq_len" in e for e in ReversalTask(TaskConfig(seq_len=0)).validate())
    assert any("eval_batch" in e for e in ReversalTask(TaskConfig(eval_batches=0)).validate())


def test_binary_expected_reward_matches_monte_carlo() -> None:
    """Exact P(exact match) from one teacher-forced pass equals the mean binary reward of
    4,000 sampled completions of the same prompt (within 4 standard errors)."""
    task = make_task("token_reversal", TaskConfig(vocab=2, seq_len=2, binary_reward=True))
    torch.manual_seed(0)
    policy = TinyTransformer(TinyConfig(vocab_size=task.vocab_size, max_len=8)).eval()
    prompts = task.sample_prompts(torch.Generator().manual_seed(1), 1).repeat_interleave(4000)
    seeds_B = torch.arange(4000)
    rollout = generate(policy, prompts, SamplingConfig(), seeds_B, task.completion_len)
    rewards_B = task.score(rollout).rewards_B
    with torch.no_grad():
        assert rollout.targets_BT is not None
        first = rollout.select(torch.tensor([0]))
        logp_BT = forward_completion(policy, first, rollout.targets_BT[:1],
                                     SampledDistribution(1.0, replay_keep=False)).logp_BT
    exact = float(task.expected_reward(logp_BT)[0])
    mc = float(rewards_B.mean())
    se = (exact * (1 - exact) / 4000) ** 0.5
    assert 0.02 < exact < 0.98
    assert abs(mc - exact) < 4 * se


def test_grpo_on_a_trivially_easy_task_stops_out_of_regime(tmp_path: Path) -> None:
    """Copy one bit: GRPO solves it within a few dozen steps, after which every group of 8 is
    all-correct; 10 consecutive fallback batches end the run as out_of_regime."""
    result = train(TrainConfig(
        method="grpo", task_options=TaskConfig(vocab=2, seq_len=1, binary_reward=True,
                                               eval_batches=1, eval_batch_size=16),
        optim=OptimConfig(lr=3e-3),
        run=RunConfig(num_steps=300, batch_size=32, eval_every=0, progress=False,
                      device="cpu", runs_dir=str(tmp_path))))
    assert result.status == "out_of_regime"
    tail = result.metrics[-9:]
    assert all(row["group/fallback"] == 1.0 and row["group/mixed_rate"] == 0.0 for row in tail)
    assert len(result.metrics) < 300
    assert json.loads((result.run_dir / "status.json").read_text())["status"] == "out_of_regime"


@pytest.mark.parametrize("name", list(TASKS))
def test_task_options_are_task_config_fields(name: str) -> None:
    """Every option a task lists is a flag of `TaskConfig` (the environments' options are the
    fields of its nested `EnvConfig`, flattened on the command line like the others)."""
    fields = {f.name for f in dataclasses.fields(TaskConfig)} - {"env"} | {
        f.name for f in dataclasses.fields(EnvConfig)}
    options = make_task(name, TaskConfig()).options
    assert options and set(options) <= fields
