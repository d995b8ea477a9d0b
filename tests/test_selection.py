"""Selection (METHODS.md, "Selection"): `mixed_groups`, `kondo` screening and overlong
masking / shaping."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from rlscope.batch import RolloutBatch
from rlscope.config import ConfigError, RunConfig, TrainConfig, validate
from rlscope.methods import METHODS, MethodConfig
from rlscope.methods.selection import (
    SELECTIONS,
    fill_mixed_groups,
    kondo_delight_B,
    kondo_select,
    kondo_threshold,
    mixed_groups,
    overlong_mask,
    overlong_penalty_B,
    overlong_shaped,
)
from rlscope.methods.spec import OverlongConfig
from rlscope.sampling import SamplingConfig
from rlscope.tasks import TaskConfig
from rlscope.train import train


def _floats(stats: dict[str, torch.Tensor]) -> dict[str, float]:
    return {k: float(v) for k, v in stats.items()}


def test_keeps_only_mixed_groups() -> None:
    # Groups of 2: (1, 0) mixed, (1, 1) uniform, (0, 0) uniform, (0.5, 0.25) mixed.
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.5, 0.25])
    keep, stats = mixed_groups(rewards, 2)
    assert keep.tolist() == [True, True, False, False, False, False, True, True]
    assert _floats(stats) == {"group/mixed_rate": 2 / 4, "group/retained_rate": 4 / 8,
                              "group/fallback": 0.0}


def test_all_uniform_falls_back_to_keeping_everything() -> None:
    keep, stats = mixed_groups(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]), 3)
    assert keep.tolist() == [True] * 6
    assert _floats(stats) == {"group/mixed_rate": 0.0, "group/retained_rate": 1.0,
                              "group/fallback": 1.0}


def test_all_mixed_keeps_everything_without_fallback() -> None:
    keep, stats = mixed_groups(torch.tensor([1.0, 0.0, 0.0, 1.0]), 2)
    assert keep.tolist() == [True] * 4
    assert _floats(stats) == {"group/mixed_rate": 1.0, "group/retained_rate": 1.0,
                              "group/fallback": 0.0}


def test_std_threshold_is_1e_6() -> None:
    # Population std of (0, 1e-6) is 5e-7 ≤ 1e-6 → uniform; of (0, 4e-6) is 2e-6 → mixed.
    rewards = torch.tensor([0.0, 1e-6, 0.0, 4e-6], dtype=torch.float64)
    keep, stats = mixed_groups(rewards, 2)
    assert keep.tolist() == [False, False, True, True]
    assert float(stats["group/mixed_rate"]) == 0.5


def test_grouped_presets_select_mixed_groups_by_default() -> None:
    """Every preset that compares the rollouts of a group; the candidate presets (tpo_token,
    grpo_token) compare next-token candidates instead, so a group of equal rollout rewards
    still carries signal and they keep every rollout (docs/architecture.md)."""
    assert tuple(SELECTIONS) == ("none", "mixed_groups", "kondo")
    grouped = {name for name, spec in METHODS.items()
               if spec.grouped and not spec.needs_candidates}
    assert {"grpo", "dr_grpo", "dapo", "tpo", "tpo_no_anchor", "group_pg"} <= grouped
    assert all(METHODS[n].selection == "none" for n in ("tpo_token", "grpo_token"))
    # gpg's α = B/(B − M) replaces filtering (METHODS_2026.md §6): it must not select
    assert METHODS["gpg"].selection == "none"
    # traj_group_pg (COMPANIONS.md §5) trains on every group: flat groups have zero centred
    # advantage anyway, and the learnability experiments measure the mixed rate, not filter on it
    assert METHODS["traj_group_pg"].selection == "none"
    # the set step's presets (COMPANIONS.md §2, VPO) have no group selection
    set_presets = {name for name, spec in METHODS.items() if spec.step == "set"}
    assert set_presets == {"vpo_grpo", "scalar_grpo", "multi_rlvr"}
    assert all(METHODS[n].selection == "none" for n in set_presets)
    # rlm_grpo (COMPANIONS.md §4): "no group selection"; its tree step trains every tree
    assert METHODS["rlm_grpo"].selection == "none"
    for name in grouped - {"gpg", "traj_group_pg", "rlm_grpo"} - set_presets:
        assert METHODS[name].selection == "mixed_groups", name


def test_fill_batch_resamples_until_mixed_groups_fill_it(tmp_path: Path) -> None:
    """With --fill_batch every trained row belongs to a mixed group, the batch is full, and the
    extra rounds are logged; without it the batch shrinks to the mixed groups."""
    def run(fill: bool) -> list[dict[str, float]]:
        return train(TrainConfig(
            method="grpo", task_options=TaskConfig(seq_len=2, vocab=2, binary_reward=True,
                                                   eval_batches=1, eval_batch_size=8),
            run=RunConfig(num_steps=3, batch_size=32, group_size=4, fill_batch=fill,
                          max_fill_rounds=20, eval_every=0, progress=False, device="cpu",
                          runs_dir=str(tmp_path), name=f"fill{fill}"))).metrics

    filled, plain = run(True), run(False)
    assert all(row["group/mixed_rate"] == 1.0 and row["group/retained_rate"] == 1.0
               for row in filled)
    assert any(row["group/fill_rounds"] > 1 for row in filled)
    assert any(row["group/retained_rate"] < 1.0 for row in plain)


def test_fill_batch_that_cannot_fill_says_what_to_change() -> None:
    g = torch.Generator().manual_seed(0)

    def one_mixed_group() -> RolloutBatch:
        rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
        return _rollout(rewards, g)

    with pytest.raises(RuntimeError, match="max_fill_rounds"):
        # one mixed group of 4 rows per round: 3 rounds give 12 of the 16 rows
        fill_mixed_groups(one_mixed_group(), one_mixed_group, rows=16, group_size=4, max_rounds=3)


def _rollout(rewards_B: torch.Tensor, g: torch.Generator) -> RolloutBatch:
    B = rewards_B.shape[0]
    return RolloutBatch(
        prompt_tokens_BP=torch.randint(0, 2, (B, 3), generator=g), prompt_mask_BP=None,
        completion_tokens_BT=torch.randint(0, 2, (B, 2), generator=g),
        completion_mask_BT=torch.ones(B, 2), logp_sampler_BT=torch.zeros(B, 2),
        logp_raw_BT=torch.zeros(B, 2), finished_by_stop_B=torch.zeros(B, dtype=torch.bool),
        group_id_B=torch.arange(B) // 4, rewards_B=rewards_B)


def test_fill_batch_keeps_exactly_the_mixed_groups_in_order() -> None:
    g = torch.Generator().manual_seed(0)
    first = _rollout(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]), g)
    more = _rollout(torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0]), g)
    batch, rounds = fill_mixed_groups(first, lambda: more, rows=8, group_size=4, max_rounds=2)
    assert rounds == 2
    assert torch.equal(batch.rewards_B, torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0]))
    assert torch.equal(batch.completion_tokens_BT[:4], first.completion_tokens_BT[:4])
    assert torch.equal(batch.completion_tokens_BT[4:], more.completion_tokens_BT[4:])
    assert batch.group_id_B.unique().numel() == 2


# ----------------------------------------------------------------------------------- kondo

LN3 = math.log(3.0)


def _kondo_batch(rewards: list[float], logp: list[list[float]], **fields: Any) -> RolloutBatch:
    B, T = len(rewards), len(logp[0])
    return RolloutBatch(
        prompt_tokens_BP=torch.zeros(B, 2, dtype=torch.long), prompt_mask_BP=None,
        completion_tokens_BT=torch.zeros(B, T, dtype=torch.long),
        completion_mask_BT=torch.ones(B, T, dtype=torch.float64),
        logp_sampler_BT=torch.tensor(logp, dtype=torch.float64),
        logp_raw_BT=torch.tensor(logp, dtype=torch.float64),
        finished_by_stop_B=torch.zeros(B, dtype=torch.bool), group_id_B=torch.arange(B),
        rewards_B=torch.tensor(rewards, dtype=torch.float64), **fields)


def test_kondo_threshold_hand_computed() -> None:
    # χ = (0, 2 ln 3), η = 1, ρ = 0.5: λ = ln 3 gives σ(−ln 3) + σ(ln 3) = 1/4 + 3/4 = 2·0.5.
    # The bracket [0, 2 ln 3] halves 20 times: λ, the last interval's midpoint, lies within
    # half its width, 2 ln 3 · 2^-21 ≈ 1.05e-6, of ln 3 (here the root is the first midpoint
    # and an end of every later interval, so the bound is met with equality, up to rounding).
    chi = torch.tensor([0.0, 2 * LN3], dtype=torch.float64)
    lam = kondo_threshold(chi, 0.5, 1.0)
    assert abs(float(lam) - LN3) <= 2 * LN3 * 2**-21 * (1 + 1e-9)
    probs = torch.sigmoid(chi - lam)
    torch.testing.assert_close(probs, torch.tensor([0.25, 0.75], dtype=torch.float64),
                               atol=1e-6, rtol=0)


def test_kondo_threshold_takes_exactly_20_bisection_steps() -> None:
    # χ = (0, 1, 3), ρ = 0.3, η = 0.5: plain-Python bisection over
    # [min χ − η·logit ρ, max χ − η·logit ρ]; 19 or 21 steps would land ~1e-6 away.
    chi, rho, eta = [0.0, 1.0, 3.0], 0.3, 0.5
    shift = eta * math.log(rho / (1 - rho))
    lo, hi = min(chi) - shift, max(chi) - shift
    for _ in range(20):
        mid = (lo + hi) / 2
        mean = sum(1 / (1 + math.exp(-(c - mid) / eta)) for c in chi) / len(chi)
        lo, hi = (mid, hi) if mean > rho else (lo, mid)
    lam = kondo_threshold(torch.tensor(chi, dtype=torch.float64), rho, eta)
    assert float(lam) == pytest.approx((lo + hi) / 2, abs=1e-12)
    mean = float(torch.sigmoid((torch.tensor(chi, dtype=torch.float64) - lam) / eta).mean())
    assert mean == pytest.approx(rho, abs=1e-5)


def test_kondo_delight_is_the_max_over_valid_tokens() -> None:
    # row 0: (r − b) = 0 → χ = 0. row 1: (1 − 0)·max(−ln(1/9), −ln(1/2)) = 2 ln 3.
    # row 2: (0 − 0.5)·(ln 2, ln 4, masked 100) → max(−0.5 ln 2, −ln 2) = −0.5 ln 2.
    logp = torch.tensor([[-1.0, -2.0, -1.0], [-2 * LN3, -math.log(2.0), -0.1],
                         [-math.log(2.0), -math.log(4.0), -100.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]],
                        dtype=torch.float64)
    baseline = torch.tensor([0.5, 0.0, 0.5], dtype=torch.float64)[:, None].expand(3, 3)
    chi = kondo_delight_B(torch.tensor([0.5, 1.0, 0.0], dtype=torch.float64), logp, mask,
                          baseline)
    torch.testing.assert_close(chi, torch.tensor([0.0, 2 * LN3, -0.5 * math.log(2.0)],
                                                 dtype=torch.float64))


def test_kondo_select_hand_computed_with_expected_reward() -> None:
    # Same rows as test_kondo_threshold: χ = (0, 2 ln 3) → keep probabilities (1/4, 3/4); each
    # row is kept iff its uniform from the given generator is below its probability.
    batch = _kondo_batch([0.5, 1.0], [[-1.0, -2.0], [-2 * LN3, -math.log(2.0)]],
                         expected_reward_B=torch.tensor([0.5, 0.0], dtype=torch.float64))
    for seed in range(5):
        keep, stats = kondo_select(batch, 0.5, 1.0, torch.Generator().manual_seed(seed))
        u = torch.rand(2, generator=torch.Generator().manual_seed(seed))
        expected = (u < torch.tensor([0.25, 0.75])).tolist()
        if not any(expected):
            expected = [False, True]  # at least one: the most probable row
        assert keep.tolist() == expected
        assert float(stats["select/kept_frac"]) == sum(expected) / 2
        assert float(stats["select/gate_prob_mean"]) == pytest.approx(0.5, abs=1e-6)


def test_kondo_baseline_is_the_behaviour_sum_p2_at_every_position() -> None:
    # No E[r | x]: b_t = Σμ² at every valid position, scored or not (as `expected`, and the
    # reference's _pg_core); score mask (0, 1).
    # row A: r = 0.5, Σμ² = (0.5, 0.9), ℓ_μ = (ln ½, ln ¼): (0.5 − 0.5)·ln 2 = 0 and
    #   (0.5 − 0.9)·ln 4 = −0.555 → χ_A = 0 (0.347 if position 0 were not baselined).
    # row B: r = 0.4, Σμ² = (0.2, 0.2), ℓ_μ = (ln ½, ln ½): 0.2·ln 2 at both → χ_B = 0.139.
    # η = 1e-3 makes the gate a hard threshold between them: only B is kept (with the
    # baseline zeroed off the score mask only A would be).
    ln2 = math.log(2.0)
    batch = _kondo_batch(
        [0.5, 0.4], [[-ln2, -2 * ln2], [-ln2, -ln2]],
        sum_p2_sampler_BT=torch.tensor([[0.5, 0.9], [0.2, 0.2]], dtype=torch.float64),
        score_mask_BT=torch.tensor([[0.0, 1.0], [0.0, 1.0]], dtype=torch.float64))
    keep, stats = kondo_select(batch, 0.5, 1e-3, torch.Generator().manual_seed(0))
    assert keep.tolist() == [False, True]
    assert float(stats["select/gate_prob_mean"]) == pytest.approx(0.5, abs=1e-6)
    with pytest.raises(ValueError, match="sum_p2_sampler_BT"):
        kondo_select(_kondo_batch([0.5], [[-1.0]]), 0.5, 1.0, torch.Generator())


def test_kondo_keeps_at_least_the_most_probable_row() -> None:
    # ρ = 1e-6: every probability is ~1e-6, so no uniform falls below one; the row with the
    # largest χ (row 2: 1·ln 8) is kept alone.
    batch = _kondo_batch([1.0, 1.0, 1.0, 0.0],
                         [[-math.log(2.0)], [-math.log(4.0)], [-math.log(8.0)], [-5.0]],
                         expected_reward_B=torch.zeros(4, dtype=torch.float64))
    keep, stats = kondo_select(batch, 1e-6, 1.0, torch.Generator().manual_seed(0))
    assert keep.tolist() == [False, False, True, False]
    assert float(stats["select/kept_frac"]) == 0.25


def test_kondo_keep_ratio_one_keeps_everything_without_drawing() -> None:
    batch = _kondo_batch([0.5, 1.0], [[-1.0], [-2.0]])  # no baseline needed: nothing computed
    g = torch.Generator().manual_seed(3)
    before = g.get_state()
    keep, stats = kondo_select(batch, 1.0, 1.0, g)
    assert keep.tolist() == [True, True]
    assert torch.equal(g.get_state(), before)
    assert _floats(stats) == {"select/kept_frac": 1.0, "select/gate_prob_mean": 1.0}


def _small_run(tmp_path: Path, method: str, name: str, components: MethodConfig | None = None,
               sampling: SamplingConfig | None = None, **run: Any) -> TrainConfig:
    return TrainConfig(
        method=method, task_options=TaskConfig(seq_len=4, eval_batches=1, eval_batch_size=16),
        components=components or MethodConfig(), sampling=sampling or SamplingConfig(),
        run=RunConfig(**{"num_steps": 4, "batch_size": 16, "eval_every": 2, "progress": False,
                         "device": "cpu", "runs_dir": str(tmp_path), "name": name, **run}))


def _untimed(rows: list[dict[str, float]], drop: tuple[str, ...] = ()) -> list[dict[str, float]]:
    return [{k: v for k, v in row.items()
             if not k.startswith(("time/", "throughput/", "perf/", *drop))} for row in rows]


def _params(result: Any) -> dict[str, torch.Tensor]:
    folder = result.run_dir / "checkpoints"
    payload = torch.load(folder / (folder / "latest.pt").read_text(), weights_only=True)
    return payload["policy"]


def test_kondo_with_keep_ratio_one_is_dg_bit_for_bit(tmp_path: Path) -> None:
    dg = train(_small_run(tmp_path, "dg", "dg"))
    kondo = train(_small_run(tmp_path, "kondo", "kondo", MethodConfig(keep_ratio=1.0)))
    assert _untimed(kondo.metrics, ("select/",)) == _untimed(dg.metrics)
    assert _untimed(kondo.evals) == _untimed(dg.evals)
    assert all(r["select/kept_frac"] == 1.0 for r in kondo.metrics)
    for name, value in _params(dg).items():
        assert torch.equal(_params(kondo)[name], value), name


def test_kondo_run_keeps_about_the_ratio_and_is_reproducible(tmp_path: Path) -> None:
    """Keep draws come from a stream of (seed, step): the same run twice, or resumed halfway,
    gives the same metrics; the step's first rollouts equal dg's (the sampling stream is not
    touched)."""
    a = train(_small_run(tmp_path, "kondo", "a", num_steps=6, checkpoint_every=3))
    b = train(_small_run(tmp_path, "kondo", "b", num_steps=3))
    b = train(_small_run(tmp_path, "kondo", "b", num_steps=6, resume=str(b.run_dir)))
    assert _untimed(a.metrics[3:]) == _untimed(b.metrics)
    kept = [r["select/kept_frac"] for r in a.metrics]
    # 16 rows: kept fractions are multiples of 1/16, at least one row, not all every step
    assert all(1 / 16 <= k <= 1.0 and (k * 16) == round(k * 16) for k in kept)
    assert sum(kept) / len(kept) < 0.9
    assert all(r["select/gate_prob_mean"] == pytest.approx(0.5, abs=1e-5) for r in a.metrics)
    dg = train(_small_run(tmp_path, "dg", "dg", num_steps=1))
    assert a.metrics[0]["reward/mean"] == dg.metrics[0]["reward/mean"]


@pytest.mark.parametrize("ratio", [0.0, -0.5, 1.5])
def test_keep_ratio_outside_unit_interval_is_rejected(tmp_path: Path, ratio: float) -> None:
    with pytest.raises(ConfigError, match=rf"keep_ratio={ratio} must lie in \(0, 1\]"):
        validate(_small_run(tmp_path, "kondo", "x", MethodConfig(keep_ratio=ratio)))


def test_kondo_rejects_groups(tmp_path: Path) -> None:
    for cfg in (_small_run(tmp_path, "kondo", "x", group_size=4),
                _small_run(tmp_path, "grpo", "x", MethodConfig(selection="kondo"))):
        with pytest.raises(ConfigError, match=r"kondo.*break groups"):
            validate(cfg)


# -------------------------------------------------------------------------------- overlong


def test_overlong_penalty_hand_computed() -> None:
    # L_max = 8, default L_buf = 8 // 4 = 2, factor 1: penalty = min(−(|y| − 6)/2, 0)
    # |y| = 5, 6, 7, 8 → 0, 0, −0.5, −1.
    lengths = torch.tensor([5.0, 6.0, 7.0, 8.0])
    torch.testing.assert_close(overlong_penalty_B(lengths, 8, OverlongConfig("penalty")),
                               torch.tensor([0.0, 0.0, -0.5, -1.0]))
    # L_buf = 4, factor 0.5: min(−(|y| − 4)/4 · 0.5, 0) → −0.125, −0.25, −0.375, −0.5.
    torch.testing.assert_close(
        overlong_penalty_B(lengths, 8, OverlongConfig("penalty", buffer=4, factor=0.5)),
        torch.tensor([-0.125, -0.25, -0.375, -0.5]))
    # L_max = 2: L_buf = max(1, 2 // 4) = 1 → |y| = 1, 2 → 0, −1.
    torch.testing.assert_close(
        overlong_penalty_B(torch.tensor([1.0, 2.0]), 2, OverlongConfig("penalty")),
        torch.tensor([0.0, -1.0]))


def _length_batch(lengths: list[int], stopped: list[bool], T: int) -> RolloutBatch:
    B = len(lengths)
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lengths])
    return RolloutBatch(
        prompt_tokens_BP=torch.zeros(B, 2, dtype=torch.long), prompt_mask_BP=None,
        completion_tokens_BT=torch.zeros(B, T, dtype=torch.long), completion_mask_BT=mask,
        logp_sampler_BT=-mask, logp_raw_BT=-mask, finished_by_stop_B=torch.tensor(stopped),
        group_id_B=torch.arange(B), rewards_B=torch.tensor([1.0, 0.5, 0.25]),
        raw_rewards_B=torch.tensor([1.0, 0.5, 0.25]))


def test_overlong_shaping_changes_rewards_not_raw_rewards() -> None:
    # L_max = 4, L_buf = 1: lengths 4, 4, 2 → penalties −1, −1, 0 (by length, stop or not).
    batch = _length_batch([4, 4, 2], [True, False, True], 4)
    shaped = overlong_shaped(batch, 4, OverlongConfig("penalty"))
    assert shaped.rewards_B is not None and shaped.raw_rewards_B is not None
    assert shaped.rewards_B.tolist() == [0.0, -0.5, 0.25]
    assert shaped.raw_rewards_B.tolist() == [1.0, 0.5, 0.25]


def test_overlong_mask_drops_only_rows_truncated_without_a_stop() -> None:
    # row 0 stopped on its 4th token (kept), row 1 hit 4 tokens without a stop (masked),
    # row 2 stopped after 2 tokens (kept).
    batch = _length_batch([4, 4, 2], [True, False, True], 4)
    masked, stats = overlong_mask(batch, 4)
    assert masked.completion_mask_BT.tolist() == [[1.0] * 4, [0.0] * 4, [1.0, 1.0, 0.0, 0.0]]
    assert float(stats["select/overlong_masked_frac"]) == pytest.approx(1 / 3)
    assert torch.equal(masked.completion_tokens_BT, batch.completion_tokens_BT)


STOPS = SamplingConfig(stop_token_ids=(2,))  # SEP (id V = 2) ends a completion early


def test_dapo_overlong_shaping_is_off_on_fixed_length_tasks(tmp_path: Path) -> None:
    """On token_reversal without stop tokens every completion has L_max tokens: dapo's
    overlong penalty is a no-op, bit for bit the run with --overlong none."""
    spec, _, derived = validate(_small_run(tmp_path, "dapo", "x", group_size=4))
    assert spec.overlong.name == "penalty" and derived.overlong == "none"
    _, _, derived = validate(_small_run(tmp_path, "dapo", "x", sampling=STOPS, group_size=4))
    assert derived.overlong == "penalty"
    preset = train(_small_run(tmp_path, "dapo", "preset", group_size=4))
    off = train(_small_run(tmp_path, "dapo", "off", MethodConfig(overlong="none"),
                           group_size=4))
    assert _untimed(preset.metrics) == _untimed(off.metrics)
    assert all("reward/overlong_penalty_mean" not in r for r in preset.metrics)


@pytest.mark.parametrize("mode", ["mask", "penalty"])
def test_explicit_overlong_on_fixed_length_task_is_rejected(tmp_path: Path, mode: str) -> None:
    with pytest.raises(ConfigError, match=rf"overlong='{mode}'.*no --stop_token_ids.*every "
                       r"completion of task 'token_reversal' has exactly that length"):
        validate(_small_run(tmp_path, "dg", "x", MethodConfig(overlong=mode)))
    with pytest.raises(ConfigError, match="overlong_buffer=5 must be <= max_new_tokens=4"):
        validate(_small_run(tmp_path, "dg", "x", MethodConfig(overlong=mode, overlong_buffer=5),
                            sampling=STOPS))


def test_dapo_with_stop_tokens_shapes_rewards(tmp_path: Path) -> None:
    # L_max = 4, L_buf = 1: rows of 4 tokens lose 1, shorter rows nothing; no noise, so
    # reward/mean = reward/raw_mean + the mean penalty = raw_mean − (rows of length 4) / 16.
    result = train(_small_run(tmp_path, "dapo", "dapo", sampling=STOPS, group_size=4))
    for r in result.metrics:
        assert r["reward/mean"] == pytest.approx(
            r["reward/raw_mean"] + r["reward/overlong_penalty_mean"], abs=1e-6)
        assert -1.0 <= r["reward/overlong_penalty_mean"] <= 0.0
    assert any(r["reward/overlong_penalty_mean"] < 0 for r in result.metrics)
    assert any(r["length/min"] < 4 for r in result.metrics)


def test_overlong_mask_drops_exactly_the_truncated_rows(tmp_path: Path) -> None:
    # Rows without a stop ran to max_new_tokens (finish reason length): the masked fraction
    # is the clip ratio.
    result = train(_small_run(tmp_path, "dg", "mask", MethodConfig(overlong="mask"),
                              sampling=STOPS))
    for r in result.metrics:
        assert r["select/overlong_masked_frac"] == pytest.approx(r["length/clip_ratio"])
        assert all(math.isfinite(v) for v in r.values())
    assert any(0 < r["select/overlong_masked_frac"] < 1 for r in result.metrics)
