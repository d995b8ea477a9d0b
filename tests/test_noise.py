"""Reward noise (TASKS.md, "Reward noise"): each mode's effect on hand-made rows, corruption
rates on a large batch, reproducibility, and the validation of noise options."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from rlscope.config import ConfigError, RunConfig, TrainConfig, validate
from rlscope.tasks import TaskConfig
from rlscope.tasks.noise import (
    NOISE_MODES,
    apply_reward_noise,
    exposes_expected_reward,
    noise_generator,
    validate_noise,
)
from rlscope.train import RunResult, train

DOCS = Path(__file__).resolve().parents[1] / "docs"
Z_999 = 3.2905  # two-sided 99.9% normal quantile


def _noise(mode: str, p: float = 1.0, vocab: int = 3) -> TaskConfig:
    return TaskConfig(vocab=vocab, reward_noise=p, reward_noise_mode=mode)


# Sequence rows over V = 3 (SEP = 3), every prompt [2, 1, 0, SEP]; ``correct`` is given.
PROMPT = [2, 1, 0, 3]
ROWS = [  # completion, mask, reward, correct
    ([0, 1, 2], [1, 1, 1], 1.0, True),    # 0 right (contains 0)
    ([0, 1, 1], [1, 1, 1], 2 / 3, False),  # 1 wrong, contains 0
    ([2, 1, 1], [1, 1, 1], 1 / 3, False),  # 2 wrong, first output = first input
    ([1, 3, 2], [1, 1, 1], 1 / 3, False),  # 3 wrong, contains SEP
    ([1, 1, 1], [1, 1, 1], 1 / 3, False),  # 4 wrong, none of the features
    ([1, 1, 0], [1, 1, 0], 0.0, False),    # 5 wrong; its 0 is padding after a stop
    ([2, 3, 1], [1, 1, 1], 0.0, False),    # 6 wrong, echoes the first input and has SEP
    ([2, 0, 3], [1, 1, 1], 1.0, True),     # 7 counted correct: immune to false positives
]
ELIGIBLE = {  # rows a hit changes, per mode
    "label_flip": set(range(8)),
    "random_reward": set(range(8)),
    "false_positive_action0": {1},
    "spurious_feature": {2, 6},
    "false_positive_rare_token": {3, 6},
}


def _rows() -> tuple[torch.Tensor, ...]:
    tokens_BT = torch.tensor([c for c, _, _, _ in ROWS])
    mask_BT = torch.tensor([m for _, m, _, _ in ROWS], dtype=torch.float32)
    rewards_B = torch.tensor([r for _, _, r, _ in ROWS], dtype=torch.float64)
    correct_B = torch.tensor([c for _, _, _, c in ROWS])
    return rewards_B, tokens_BT, mask_BT, torch.tensor([PROMPT] * len(ROWS)), correct_B


def test_modes_are_the_documented_ones() -> None:
    assert set(NOISE_MODES) == set(ELIGIBLE)
    text = (DOCS / "tasks.md").read_text()
    for mode in ("none", *NOISE_MODES):
        assert f"`{mode}`" in text


@pytest.mark.parametrize("mode", list(ELIGIBLE))
def test_each_mode_on_hand_made_sequence_rows(mode: str) -> None:
    rewards_B, tokens_BT, mask_BT, prompt_BP, correct_B = _rows()
    g = torch.Generator().manual_seed(0)
    noisy_B, corrupted_B = apply_reward_noise(rewards_B, tokens_BT, mask_BT, prompt_BP,
                                              correct_B, _noise(mode), "sequence", g)
    assert noisy_B.dtype == torch.float64 and corrupted_B.dtype == torch.bool
    assert set(torch.nonzero(corrupted_B).flatten().tolist()) == ELIGIBLE[mode]
    for i, (r, new) in enumerate(zip(rewards_B.tolist(), noisy_B.tolist(), strict=True)):
        if i not in ELIGIBLE[mode]:
            assert new == r
        elif mode == "label_flip":
            assert new == pytest.approx(1.0 - r)
        elif mode == "random_reward":
            assert 0.0 <= new < 1.0
        else:
            assert new == 1.0


@pytest.mark.parametrize("mode", ["false_positive_action0", "spurious_feature"])
def test_bandit_wrong_action0_gets_one(mode: str) -> None:
    actions_B1 = torch.tensor([[0], [0], [2], [1]])
    correct_B = torch.tensor([False, True, False, True])
    rewards_B = correct_B.float()
    features_BP = torch.rand(4, 64)  # bandit prompts are features; no mode reads them
    noisy_B, corrupted_B = apply_reward_noise(
        rewards_B, actions_B1, torch.ones(4, 1), features_BP, correct_B, _noise(mode),
        "bandit", torch.Generator().manual_seed(0))
    assert noisy_B.tolist() == [1.0, 1.0, 0.0, 1.0]
    assert corrupted_B.tolist() == [True, False, False, False]


def _large_batch(n: int = 20_000) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(123)
    tokens_BT = torch.randint(0, 4, (n, 5), generator=g)  # V = 3: tokens 0..2 and SEP 3
    mask_BT = (torch.rand(n, 5, generator=g) < 0.9).float()
    prompt_BP = torch.cat([torch.randint(0, 3, (n, 5), generator=g),
                           torch.full((n, 1), 3)], 1)
    correct_B = torch.rand(n, generator=g) < 0.3
    rewards_B = torch.where(correct_B, 1.0, torch.rand(n, generator=g))
    return rewards_B, tokens_BT, mask_BT, prompt_BP, correct_B


def _eligible(mode: str, tokens_BT: torch.Tensor, mask_BT: torch.Tensor,
              prompt_BP: torch.Tensor, correct_B: torch.Tensor) -> torch.Tensor:
    """Eligibility written out per row, independently of the implementation."""
    out = []
    for toks, m, prompt, ok in zip(tokens_BT.tolist(), mask_BT.tolist(), prompt_BP.tolist(),
                                   correct_B.tolist(), strict=True):
        generated = [t for t, keep in zip(toks, m, strict=True) if keep]
        out.append({
            "label_flip": True,
            "random_reward": True,
            "false_positive_action0": not ok and 0 in generated,
            "spurious_feature": not ok and m[0] == 1 and toks[0] == prompt[0],
            "false_positive_rare_token": not ok and 3 in generated,
        }[mode])
    return torch.tensor(out)


@pytest.mark.parametrize("mode", list(ELIGIBLE))
def test_corruption_rate_within_binomial_band(mode: str) -> None:
    p = 0.3
    rewards_B, tokens_BT, mask_BT, prompt_BP, correct_B = _large_batch()
    noisy_B, corrupted_B = apply_reward_noise(
        rewards_B, tokens_BT, mask_BT, prompt_BP, correct_B, _noise(mode, p), "sequence",
        torch.Generator().manual_seed(7))
    eligible_B = _eligible(mode, tokens_BT, mask_BT, prompt_BP, correct_B)
    n = int(eligible_B.sum())
    assert n > 2_000  # every mode has many eligible rows in this batch
    k = int(corrupted_B[eligible_B].sum())
    assert abs(k - n * p) <= Z_999 * math.sqrt(n * p * (1 - p)), (mode, k, n)
    assert not corrupted_B[~eligible_B].any()
    assert torch.equal(noisy_B[~corrupted_B], rewards_B[~corrupted_B])


def test_reproducible_with_the_same_generator_seed() -> None:
    rewards_B, tokens_BT, mask_BT, prompt_BP, correct_B = _large_batch(2_000)

    def run(mode: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        return apply_reward_noise(rewards_B, tokens_BT, mask_BT, prompt_BP, correct_B,
                                  _noise(mode, 0.5), "sequence",
                                  torch.Generator().manual_seed(seed))

    for mode in ELIGIBLE:
        a, b = run(mode, 3), run(mode, 3)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert not torch.equal(a[1], run(mode, 4)[1])
    # one seed hits the same rows under every mode
    assert torch.equal(run("label_flip", 3)[1], run("random_reward", 3)[1])
    assert torch.equal(run("false_positive_rare_token", 3)[1],
                       run("label_flip", 3)[1] & run("false_positive_rare_token", 3)[1])


def test_noise_generator_is_per_seed_and_step() -> None:
    def draw(seed: int, step: int) -> torch.Tensor:
        return torch.rand(4, generator=noise_generator(seed, step))

    assert torch.equal(draw(0, 5), draw(0, 5))
    assert not torch.equal(draw(0, 5), draw(0, 6))
    assert not torch.equal(draw(0, 5), draw(1, 5))


def test_clean_rewards_pass_through_without_drawing() -> None:
    rewards_B, tokens_BT, mask_BT, prompt_BP, correct_B = _rows()
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    noisy_B, corrupted_B = apply_reward_noise(rewards_B, tokens_BT, mask_BT, prompt_BP,
                                              correct_B, TaskConfig(), "sequence", g)
    assert torch.equal(noisy_B, rewards_B) and not corrupted_B.any()
    assert torch.equal(g.get_state(), state)


def test_exposes_expected_reward_only_without_noise() -> None:
    assert exposes_expected_reward(TaskConfig())
    assert not exposes_expected_reward(_noise("label_flip", 0.1))
    assert not exposes_expected_reward(_noise("random_reward", 1.0))


@pytest.mark.parametrize("family", ["sequence", "bandit"])
def test_valid_combinations(family: str) -> None:
    assert validate_noise(TaskConfig(), family) == []
    for mode, spec in NOISE_MODES.items():
        if family in spec.families:
            assert validate_noise(_noise(mode, 0.2), family) == []
            assert validate_noise(_noise(mode, 1.0), family) == []


@pytest.mark.parametrize(
    ("cfg", "family", "says"),
    [
        (_noise("none", 0.2), "sequence", "set --reward_noise_mode to one of label_flip"),
        (_noise("label_flip", 0.0), "sequence", "--reward_noise in (0, 1]"),
        (_noise("false_positive_rare_token", 0.2), "bandit", "exists only for sequence tasks"),
        (_noise("label_flip", 1.5), "sequence", "must lie in [0, 1]"),
        (_noise("label_flip", -0.1), "sequence", "must lie in [0, 1]"),
        (_noise("label_flip", math.nan), "sequence", "must lie in [0, 1]"),
        (_noise("flip", 0.2), "sequence", "'flip' is unknown"),
        (_noise("label_flip", 0.2), "text", "unknown task family"),
    ],
)
def test_invalid_combinations_rejected(cfg: TaskConfig, family: str, says: str) -> None:
    errors = validate_noise(cfg, family)
    assert any(says in e for e in errors), errors
    rewards_B, tokens_BT, mask_BT, prompt_BP, correct_B = _rows()
    with pytest.raises(ValueError, match="invalid reward noise"):
        apply_reward_noise(rewards_B, tokens_BT, mask_BT, prompt_BP, correct_B, cfg, family,
                           torch.Generator())


def test_mismatched_shapes_rejected() -> None:
    rewards_B, tokens_BT, mask_BT, prompt_BP, correct_B = _rows()
    with pytest.raises(ValueError, match="completion_tokens_BT"):
        apply_reward_noise(rewards_B, tokens_BT[:3], mask_BT, prompt_BP, correct_B,
                           _noise("label_flip"), "sequence", torch.Generator())


def test_training_loop_applies_noise_to_training_rewards_only(tmp_path: Path) -> None:
    """Through `train()`: about p of the rows are hit, rewards differ from the clean ones
    exactly there, the first evaluation equals a clean run's (same init, noise-free eval)."""
    run = RunConfig(num_steps=6, batch_size=64, eval_every=5, progress=False, device="cpu",
                    runs_dir=str(tmp_path))
    options = TaskConfig(seq_len=4, eval_batches=1, eval_batch_size=32)
    clean = train(TrainConfig(method="dg", task_options=options, run=run))
    noisy = train(TrainConfig(
        method="dg", run=run,
        task_options=dataclasses.replace(options, reward_noise=0.3,
                                         reward_noise_mode="label_flip")))
    rates = [row["reward/noise_rate"] for row in noisy.metrics]
    mean_rate = sum(rates) / len(rates)
    # 6 × 64 Bernoulli(0.3) draws: sd 0.023, a 99.9% band is ±0.08
    assert abs(mean_rate - 0.3) < 0.08
    assert all(row["reward/noise_rate"] == 0.0 for row in clean.metrics)
    def eval_values(result: RunResult) -> dict[str, float]:
        return {k: v for k, v in result.evals[0].items() if k.startswith("eval/")}

    assert eval_values(noisy) == eval_values(clean)
    first = noisy.metrics[0]
    # label_flip maps r to 1 − r on hit rows: the mean moves towards 1 − mean
    assert first["reward/mean"] != first["reward/raw_mean"]


def test_invalid_noise_is_rejected_before_training(tmp_path: Path) -> None:
    cfg = TrainConfig(method="dg", task_options=TaskConfig(reward_noise=0.2),
                      run=RunConfig(runs_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match="reward_noise_mode"):
        validate(cfg)
