"""chain_arithmetic and format_answer (TASKS.md, "Toy tasks") on hand-made completions: targets,
checkpoint rewards, dense token rewards, eval metrics, validation and the held-out sets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlscope.batch import RolloutBatch
from rlscope.tasks import TASKS, TaskConfig, make_task
from rlscope.tasks.chains import ChainArithmeticTask, FormatAnswerTask, checkpoint_reward

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _rollout(content: list[int], targets: list[int], completions: list[list[int]],
             sep: int) -> RolloutBatch:
    """Rows sharing one prompt (content, SEP) and one target; completions may stop early."""
    B, T = len(completions), len(targets)
    tokens_BT = torch.zeros(B, T, dtype=torch.long)
    mask_BT = torch.zeros(B, T)
    for i, c in enumerate(completions):
        tokens_BT[i, :len(c)] = torch.tensor(c)
        mask_BT[i, :len(c)] = 1.0
    return RolloutBatch(
        prompt_tokens_BP=torch.tensor([[*content, sep]] * B), prompt_mask_BP=None,
        completion_tokens_BT=tokens_BT, completion_mask_BT=mask_BT,
        logp_sampler_BT=torch.zeros(B, T), logp_raw_BT=torch.zeros(B, T),
        finished_by_stop_B=torch.zeros(B, dtype=torch.bool), group_id_B=torch.arange(B),
        targets_BT=torch.tensor([targets] * B))


def test_checkpoint_reward_hand_computed() -> None:
    match_BT = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    got = checkpoint_reward(match_BT, slice(0, 1), slice(1, 3))
    assert got.tolist() == pytest.approx([1.0, 1 / 3, 1 / 3, 0.0])


# chain_arithmetic, V = 5, seq_len = 3 (SEP = 5): content [3, 4, 1] → targets [3, 4, 7 mod 5 = 2]
ARITH_CONTENT, ARITH_TARGET = [3, 4, 1], [3, 4, 2]
ARITH_CASES = [  # completion, reward, per-position match
    ([3, 4, 2], 1.0, [1, 1, 1]),    # right
    ([3, 4, 1], 1 / 3, [1, 1, 0]),  # prefix copied, answer wrong
    ([3, 0, 2], 1 / 3, [1, 0, 1]),  # prefix broken, answer right
    ([0, 0, 0], 0.0, [0, 0, 0]),    # wrong everywhere
    ([3, 4, 5], 1 / 3, [1, 1, 0]),  # SEP as the answer: legal, never correct
    ([5, 4, 2], 1 / 3, [0, 1, 1]),  # SEP in the prefix
    ([3, 4], 1 / 3, [1, 1, 0]),     # stopped before the answer: missing = wrong
]


def test_chain_arithmetic_rewards_and_eval_metrics() -> None:
    task = ChainArithmeticTask(TaskConfig(vocab=5, seq_len=3))
    assert (task.sep, task.vocab_size, task.prompt_len, task.completion_len) == (5, 6, 4, 3)
    assert task.has_labels
    batch = _rollout(ARITH_CONTENT, ARITH_TARGET, [c for c, _, _ in ARITH_CASES], sep=5)
    scores = task.score(batch)
    rewards = [r for _, r, _ in ARITH_CASES]
    assert scores.rewards_B.tolist() == pytest.approx(rewards)
    assert scores.token_rewards_BT is not None
    assert scores.token_rewards_BT.tolist() == [[float(m) for m in ms] for _, _, ms in ARITH_CASES]
    metrics = task.eval_metrics(batch)
    assert set(metrics) == {"test_error", "chain_reward"}
    assert metrics["test_error"].tolist() == [0.0, 1, 1, 1, 1, 1, 1]
    assert metrics["chain_reward"].tolist() == pytest.approx(rewards)
    assert task.expected_reward(torch.zeros(7, 3)) is None


def test_chain_arithmetic_targets_copy_prefix_then_sum_mod_v() -> None:
    task = ChainArithmeticTask(TaskConfig(vocab=5, seq_len=4))
    p = task.sample_prompts(torch.Generator().manual_seed(0), 64)
    assert p.tokens_BP.shape == (64, 5) and p.targets_BT is not None
    assert (p.tokens_BP[:, -1] == 5).all() and (p.tokens_BP[:, :-1] < 5).all()
    for x, y in zip(p.tokens_BP.tolist(), p.targets_BT.tolist(), strict=True):
        assert y == [x[0], x[1], x[2], (x[0] + x[1] + x[2]) % 5]
    # the reference answer scores 1
    ref = _rollout(p.tokens_BP[0, :-1].tolist(), p.targets_BT[0].tolist(),
                   [p.targets_BT[0].tolist()], sep=5)
    assert task.score(ref).rewards_B.tolist() == [1.0]
    # seq_len 2: copy one token, answer it mod V (itself)
    p2 = ChainArithmeticTask(TaskConfig(vocab=3, seq_len=2)).sample_prompts(
        torch.Generator().manual_seed(1), 16)
    assert p2.targets_BT is not None
    assert torch.equal(p2.targets_BT, p2.tokens_BP[:, [0, 0]])


# format_answer, V = 5, seq_len = 4 (SEP = 5, ANSWER = 6): content [3, 4, 1, 2] → [6, 2, 1, 2]
FMT_CONTENT, FMT_TARGET = [3, 4, 1, 2], [6, 2, 1, 2]
FMT_CASES = [  # completion, reward, per-position match
    ([6, 2, 1, 2], 1.0, [1, 1, 1, 1]),    # right
    ([6, 2, 0, 2], 2 / 3, [1, 1, 0, 1]),  # format and answer ok, copy broken
    ([6, 0, 1, 2], 1 / 3, [1, 0, 1, 1]),  # format only
    ([2, 2, 1, 2], 1 / 3, [0, 1, 1, 1]),  # answer without the tag
    ([5, 2, 1, 2], 1 / 3, [0, 1, 1, 1]),  # SEP instead of the tag
    ([6, 6, 6, 6], 1 / 3, [1, 0, 0, 0]),  # the tag is right only at position 0
    ([0, 0, 0, 0], 0.0, [0, 0, 0, 0]),    # wrong everywhere
    ([6], 1 / 3, [1, 0, 0, 0]),           # stopped after the tag
]


def test_format_answer_rewards_and_eval_metrics() -> None:
    task = FormatAnswerTask(TaskConfig(vocab=5, seq_len=4))
    assert (task.sep, task.answer, task.vocab_size) == (5, 6, 7)
    assert (task.prompt_len, task.completion_len) == (5, 4) and task.has_labels
    batch = _rollout(FMT_CONTENT, FMT_TARGET, [c for c, _, _ in FMT_CASES], sep=5)
    scores = task.score(batch)
    rewards = [r for _, r, _ in FMT_CASES]
    assert scores.rewards_B.tolist() == pytest.approx(rewards)
    assert scores.token_rewards_BT is not None
    assert scores.token_rewards_BT.tolist() == [[float(m) for m in ms] for _, _, ms in FMT_CASES]
    metrics = task.eval_metrics(batch)
    assert set(metrics) == {"test_error", "chain_reward"}
    assert metrics["test_error"].tolist() == [0.0] + [1.0] * 7
    assert metrics["chain_reward"].tolist() == pytest.approx(rewards)
    assert task.expected_reward(torch.zeros(8, 4)) is None


@pytest.mark.parametrize("seq_len", [2, 5])
def test_format_answer_targets(seq_len: int) -> None:
    task = FormatAnswerTask(TaskConfig(vocab=4, seq_len=seq_len))
    p = task.sample_prompts(torch.Generator().manual_seed(0), 64)
    assert p.targets_BT is not None and p.targets_BT.shape == (64, seq_len)
    assert (p.tokens_BP[:, -1] == 4).all() and (p.tokens_BP[:, :-1] < 4).all()
    for x, y in zip(p.tokens_BP.tolist(), p.targets_BT.tolist(), strict=True):
        assert y == [5, (x[0] + x[1]) % 4, *x[2:seq_len]]
    assert int(p.targets_BT.max()) < task.vocab_size


@pytest.mark.parametrize("cls", [ChainArithmeticTask, FormatAnswerTask])
def test_validation(cls: type[ChainArithmeticTask] | type[FormatAnswerTask]) -> None:
    assert cls(TaskConfig(seq_len=2)).validate() == []
    assert cls(TaskConfig()).validate() == []
    errors = cls(TaskConfig(seq_len=1)).validate()
    assert any("seq_len >= 2" in e and cls.name in e for e in errors)
    errors = cls(TaskConfig(binary_reward=True)).validate()
    assert any("--no_binary_reward" in e for e in errors)
    assert any("vocab" in e for e in cls(TaskConfig(vocab=1)).validate())


@pytest.mark.parametrize("name", ["chain_arithmetic", "format_answer"])
def test_registered_and_eval_sets_deterministic_per_seed(name: str) -> None:
    task = make_task(name, TaskConfig(vocab=3, seq_len=4, eval_batches=2, eval_batch_size=20))
    assert name in task.describe()
    a, b, other = task.eval_prompts(0), task.eval_prompts(0), task.eval_prompts(1)
    assert len(a) == 2 and all(p.batch_size == 20 for p in a)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x.tokens_BP, y.tokens_BP)
        assert x.targets_BT is not None and y.targets_BT is not None
        assert torch.equal(x.targets_BT, y.targets_BT)
    assert not torch.equal(a[0].tokens_BP, other[0].tokens_BP)
    assert not torch.equal(a[0].tokens_BP, a[1].tokens_BP)


def test_docs_cover_every_task() -> None:
    text = (DOCS / "tasks.md").read_text()
    for name in TASKS:
        assert f"`{name}`" in text, f"docs/tasks.md has no section for {name}"
        assert f"--task {name} --method dg --num_steps 300" in text
