"""The byte-level text tasks: arithmetic's verifier and rewards, length_target's rewards, by
hand; prompt layout; validation; the loop runs them with their own stop token."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlscope.batch import RolloutBatch
from rlscope.config import RunConfig, TrainConfig, validate
from rlscope.metrics.schema import unregistered
from rlscope.metrics.sinks import read_jsonl
from rlscope.tasks import TaskConfig, make_task
from rlscope.tasks.arithmetic import LEVELS, evaluate_expression, parse_answer
from rlscope.tasks.length_target import INSTRUCTIONS, length_reward
from rlscope.tasks.text import STOP_ID
from rlscope.train import train


def rollout(task_name: str, prompts: list[str], completions: list[bytes],
            cfg: TaskConfig | None = None) -> RolloutBatch:
    """A rollout batch with these prompts and completion bytes (mask through the first
    newline, or the whole row), padded with the stop token."""
    task = make_task(task_name, cfg or TaskConfig())
    from rlscope.tasks.text import fixed_left_padded
    p = fixed_left_padded([list(s.encode()) for s in prompts], task.prompt_len)
    T = max(len(c) for c in completions)
    tokens_BT = torch.full((len(completions), T), STOP_ID, dtype=torch.long)
    mask_BT = torch.zeros(len(completions), T)
    for i, c in enumerate(completions):
        tokens_BT[i, :len(c)] = torch.tensor(list(c), dtype=torch.long)
        n = c.index(b"\n") + 1 if b"\n" in c else len(c)
        mask_BT[i, :n] = 1
    B = len(completions)
    return RolloutBatch(
        prompt_tokens_BP=p.tokens_BP, prompt_mask_BP=p.attention_mask_BP,
        completion_tokens_BT=tokens_BT, completion_mask_BT=mask_BT,
        logp_sampler_BT=torch.zeros(B, T), logp_raw_BT=torch.zeros(B, T),
        finished_by_stop_B=torch.tensor([b"\n" in c for c in completions]),
        group_id_B=torch.arange(B))


@pytest.mark.parametrize(("text", "value"), [
    ("42", 42), ("0", 0), ("-7", -7), ("198", 198), ("9" * 18, int("9" * 18)),
    ("", None), ("-", None), ("+5", None), (" 5", None), ("5 ", None), ("007", None),
    ("-0", None), ("1e5", None), ("٣", None), ("１２", None), ("4.0", None), ("4\ufffd", None),
    ("9" * 19, None), ("9" * 10_000, None), ("12-", None), ("--3", None), ("0x1f", None),
])
def test_parse_answer_accepts_only_canonical_integers(text: str, value: int | None) -> None:
    assert parse_answer(text) == value


def test_evaluate_expression() -> None:
    assert evaluate_expression("17+25=") == 42
    assert evaluate_expression("10-999=") == -989
    assert evaluate_expression("99-78-76+56=") == 1
    assert evaluate_expression("1+1") is None and evaluate_expression("a=") is None


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_levels_bound_prompts_and_answers(difficulty: int) -> None:
    task = make_task("arithmetic", TaskConfig(difficulty=difficulty))
    level = LEVELS[difficulty]
    lo, hi = level.answer_bounds()
    problems = task.sample_problems(torch.Generator().manual_seed(difficulty), 2000)
    for prompt, answer in problems:
        assert len(prompt) <= task.prompt_len and prompt.endswith("=")
        assert evaluate_expression(prompt) == answer and lo <= answer <= hi
        assert len(str(answer)) + 1 <= task.completion_len
    assert (task.prompt_len, task.completion_len) == {1: (6, 4), 2: (8, 5), 3: (12, 5)}[
        difficulty]
    ops = {c for p, _ in problems for c in p if c in "+-"}
    assert ops == set(level.ops)


def test_prompts_are_left_padded_bytes_with_mask_and_targets() -> None:
    task = make_task("arithmetic", TaskConfig())
    batch = task.sample_prompts(torch.Generator().manual_seed(0), 64)
    assert batch.attention_mask_BP is not None and batch.targets_BT is not None
    assert batch.tokens_BP.shape == (64, 6) and batch.targets_BT.shape == (64, 4)
    for i in range(64):
        m = batch.attention_mask_BP[i].bool()
        assert (batch.tokens_BP[i, ~m] == 0).all() and m[-1]  # left padding, NUL
        text = bytes(batch.tokens_BP[i, m].tolist()).decode()
        target = bytes(batch.targets_BT[i].tolist()).decode()
        assert target.split("\n")[0] == str(evaluate_expression(text))


def test_arithmetic_rewards_by_hand() -> None:
    prompts = ["17+25=", "17+25=", "17+25=", "17+25=", "1+2=", "1+2=", "1+2=", "0+0="]
    completions = [b"42\n", b"43\n", b"42", b"+42\n", b"3\nxx", b"\xff\xfe\n", b"\n", b"0\n"]
    batch = rollout("arithmetic", prompts, completions)
    task = make_task("arithmetic", TaskConfig())
    assert task.score(batch).rewards_B.tolist() == [1, 0, 0, 0, 1, 0, 0, 1]
    shaped = make_task("arithmetic", TaskConfig(format_reward=0.1))
    assert shaped.score(batch).rewards_B.tolist() == pytest.approx(
        [1, 0.1, 0, 0, 1, 0, 0, 1])
    metrics = task.eval_metrics(batch)
    assert metrics["test_error"].tolist() == [0, 1, 1, 1, 0, 1, 1, 0]
    assert metrics["format_error"].tolist() == [0, 0, 1, 1, 0, 1, 1, 0]


def test_arithmetic_score_never_raises_on_random_ids() -> None:
    task = make_task("arithmetic", TaskConfig(difficulty=3, format_reward=0.1))
    g = torch.Generator().manual_seed(0)
    prompts = task.sample_prompts(g, 256)
    tokens_BT = torch.randint(0, 256, (256, 5), generator=g)
    tokens_BT[:64, 0] = STOP_ID  # empty answers
    batch = RolloutBatch(
        prompt_tokens_BP=prompts.tokens_BP, prompt_mask_BP=prompts.attention_mask_BP,
        completion_tokens_BT=tokens_BT, completion_mask_BT=torch.ones(256, 5),
        logp_sampler_BT=torch.zeros(256, 5), logp_raw_BT=torch.zeros(256, 5),
        finished_by_stop_B=torch.zeros(256, dtype=torch.bool), group_id_B=torch.arange(256))
    rewards_B = task.score(batch).rewards_B
    assert rewards_B.shape == (256,) and ((rewards_B >= 0) & (rewards_B <= 1)).all()


def test_arithmetic_validation() -> None:
    assert make_task("arithmetic", TaskConfig()).validate() == []
    assert any("difficulty" in e for e in make_task(
        "arithmetic", TaskConfig(difficulty=4)).validate())
    assert any("format_reward" in e for e in make_task(
        "arithmetic", TaskConfig(format_reward=1.0)).validate())
    assert any("seq_len" in e for e in make_task(
        "arithmetic", TaskConfig(seq_len=3)).validate())


def test_length_reward_by_hand() -> None:
    assert length_reward(0, None) == 2.0
    assert length_reward(8, None) == 1.5
    assert length_reward(32, None) == 0.0
    assert length_reward(48, None) == -1.0
    assert [length_reward(n, (3, 5)) for n in (2, 3, 5, 6)] == [0.0, 1.0, 1.0, 0.0]


def test_length_target_scores_words_before_the_stop() -> None:
    prompts = [INSTRUCTIONS[0]] * 4
    completions = [b"\n", b"the sea is blue\n more words", b"  a  b \n", b"one two three"]
    batch = rollout("length_target", prompts, completions)
    task = make_task("length_target", TaskConfig())
    assert task.score(batch).rewards_B.tolist() == [2.0, 2 - 4 / 16, 2 - 2 / 16, 2 - 3 / 16]
    metrics = task.eval_metrics(batch)
    assert metrics["words"].tolist() == [0, 4, 2, 3]
    assert metrics["test_error"].tolist() == pytest.approx([0, 1 - 1.75 / 2, 1 - 1.875 / 2,
                                                            1 - 1.8125 / 2])
    band = make_task("length_target", TaskConfig(band_min_words=2, band_max_words=3))
    assert band.score(batch).rewards_B.tolist() == [0.0, 0.0, 1.0, 1.0]


def test_length_target_validation() -> None:
    assert make_task("length_target", TaskConfig()).validate() == []
    for bad in (TaskConfig(length_limit=0), TaskConfig(band_min_words=4, band_max_words=2),
                TaskConfig(band_min_words=2), TaskConfig(difficulty=2),
                TaskConfig(reward_noise=0.1, reward_noise_mode="label_flip")):
        assert make_task("length_target", bad).validate(), bad


def test_text_tasks_bring_their_stop_token() -> None:
    _, _, d = validate(TrainConfig(task="arithmetic"))
    assert d.stop_token_ids == (STOP_ID,) and d.max_new_tokens == 4
    _, _, d = validate(TrainConfig(task="token_reversal"))
    assert d.stop_token_ids == ()


@pytest.mark.parametrize("name", ["arithmetic", "length_target"])
def test_grpo_runs_on_text_tasks(name: str, tmp_path: Path) -> None:
    limit = 16 if name == "length_target" else 64
    result = train(TrainConfig(
        task=name, task_options=TaskConfig(eval_batches=1, eval_batch_size=32,
                                           length_limit=limit),
        run=RunConfig(num_steps=3, batch_size=32, eval_every=0, progress=False, device="cpu",
                      runs_dir=str(tmp_path), threads=1)))
    assert result.status == "completed" and len(result.metrics) == 3
    assert all(torch.isfinite(torch.tensor(v)) for row in result.metrics for v in row.values())
    assert 0 <= result.final_eval["eval/test_error"] <= 1
    evals = read_jsonl(result.run_dir / "eval.jsonl")
    extra = {"arithmetic": "eval/format_error", "length_target": "eval/words"}[name]
    assert extra in evals[0] and unregistered(evals[0]) == []
    assert result.metrics[-1]["length/mean"] <= make_task(
        name, TaskConfig(length_limit=limit)).completion_len
