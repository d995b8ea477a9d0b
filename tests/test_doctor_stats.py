"""The doctor's trend statistics on hand-made series, with the arithmetic in comments.

No torch: these are pure numpy functions (the doctor never imports torch).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlscope.doctor.stats import (
    aligned,
    correlation,
    noise_sigma,
    slope_interval,
    trend,
    window_size,
)


def test_window_size_by_hand():
    # max(1, min(n // 2, max(3, int(0.2 n))))
    assert window_size(60) == 12  # min(30, max(3, 12))
    assert window_size(20) == 4  # min(10, max(3, 4))
    assert window_size(10) == 3  # min(5, max(3, 2))
    assert window_size(5) == 2  # min(2, max(3, 1)): never more than half the series
    assert window_size(1) == 1


def test_trend_of_a_pure_linear_ramp():
    # values = 3 + 0.5·s on steps 0..19 (n = 20, window w = 4).
    steps = np.arange(20, dtype=float)
    values = 3.0 + 0.5 * steps
    tr = trend(steps, values)
    assert tr.n == 20
    assert (tr.first_step, tr.last_step) == (0.0, 19.0)
    # first window: 3 + 0.5·mean(0, 1, 2, 3) = 3 + 0.5·1.5 = 3.75
    assert tr.first_mean == pytest.approx(3.75)
    # last window: 3 + 0.5·mean(16, 17, 18, 19) = 3 + 0.5·17.5 = 11.75
    assert tr.last_mean == pytest.approx(11.75)
    assert tr.change == pytest.approx(8.0)
    # least squares recovers the slope exactly; every bootstrap resample of an exact line
    # has the same slope, so the interval collapses onto it (up to rounding).
    assert tr.slope == pytest.approx(0.5, abs=1e-12)
    assert tr.slope_low - 1e-9 <= 0.5 <= tr.slope_high + 1e-9
    assert tr.slope_high - tr.slope_low < 1e-9
    # every first difference is 0.5, so their std (the noise) is 0
    assert tr.noise == pytest.approx(0.0, abs=1e-12)
    # |change| = 8 > 3·0 standard errors and > 1e-4·11.75
    assert tr.exceeds_noise is True
    assert tr.direction == "up"
    # 19 differences, all positive
    assert (tr.ups, tr.downs) == (19, 0)


def test_trend_of_a_falling_ramp_is_down():
    steps = np.arange(10, dtype=float)
    tr = trend(steps, 10.0 - 2.0 * steps)
    # w = 3: first mean 10 − 2·1 = 8, last mean 10 − 2·8 = −6
    assert (tr.first_mean, tr.last_mean) == (pytest.approx(8.0), pytest.approx(-6.0))
    assert tr.slope == pytest.approx(-2.0)
    assert tr.direction == "down"
    assert (tr.ups, tr.downs) == (0, 9)


def test_trend_of_pure_noise_does_not_exceed_the_noise():
    # 5 + 0.1·N(0, 1), 60 steps, seed 0: the windows (w = 12) differ by about
    # 0.1·√(2/12) ≈ 0.041 (one standard error); the bar is 3 standard errors.
    rng = np.random.default_rng(0)
    steps = np.arange(60, dtype=float)
    values = 5.0 + 0.1 * rng.standard_normal(60)
    tr = trend(steps, values)
    assert tr.exceeds_noise is False
    assert tr.direction == "flat"
    # σ is estimated from first differences: std(diff)/√2 ≈ 0.1
    assert 0.07 < tr.noise < 0.13
    # with no trend the slope interval contains 0
    assert tr.slope_low < 0.0 < tr.slope_high
    # independent noise: ups and downs near 59/2 each, and they add to 59 (no ties)
    assert tr.ups + tr.downs == 59
    assert abs(tr.ups - tr.downs) < 20


def test_trend_of_a_noisy_ramp_has_an_interval_around_the_slope():
    rng = np.random.default_rng(1)
    steps = np.arange(60, dtype=float)
    values = 0.05 * steps + 0.1 * rng.standard_normal(60)
    tr = trend(steps, values)
    assert tr.slope_low < 0.05 < tr.slope_high
    assert tr.slope_low > 0.0
    assert tr.direction == "up"


def test_trend_of_a_constant_series_is_flat():
    steps = np.arange(30, dtype=float)
    tr = trend(steps, np.full(30, 0.1))
    assert tr.noise == 0.0
    assert tr.change == 0.0
    assert tr.exceeds_noise is False
    assert tr.direction == "flat"
    assert (tr.slope, tr.slope_low, tr.slope_high) == pytest.approx((0.0, 0.0, 0.0), abs=1e-12)
    assert (tr.ups, tr.downs) == (0, 0)


def test_trend_of_one_or_two_points_does_not_crash():
    one = trend(np.array([5.0]), np.array([2.0]))
    assert (one.first_mean, one.last_mean, one.noise, one.exceeds_noise) == (2.0, 2.0, 0.0, False)
    assert (one.slope, one.ups, one.downs) == (0.0, 0, 0)
    two = trend(np.array([0.0, 1.0]), np.array([1.0, 3.0]))
    # w = 1: first 1, last 3; fewer than 3 points, so noise 0 and no slope fit
    assert (two.change, two.noise, two.slope, two.ups) == (2.0, 0.0, 0.0, 1)


def test_trend_as_dict_rounds_and_names_the_direction():
    steps = np.arange(20, dtype=float)
    d = trend(steps, 3.0 + 0.5 * steps).as_dict()
    assert d["direction"] == "up"
    assert d["first_mean"] == 3.75
    assert d["n"] == 20


def test_noise_sigma_by_hand():
    # [1, 3, 2, 5]: differences [2, −1, 3], mean 4/3, deviations [2/3, −7/3, 5/3],
    # population variance (4 + 49 + 25)/9/3 = 26/9, std √26/3; σ = √26/3/√2 = √13/3 ≈ 1.2019
    assert noise_sigma(np.array([1.0, 3.0, 2.0, 5.0])) == pytest.approx(math.sqrt(13) / 3)
    # alternating ±1: differences ±2 alternate, std 2, σ = 2/√2 = √2
    assert noise_sigma(np.array([1.0, -1.0, 1.0, -1.0, 1.0])) == pytest.approx(math.sqrt(2))
    # fewer than three points: 0
    assert noise_sigma(np.array([1.0, 9.0])) == 0.0


def test_slope_interval_degenerate_steps():
    # all points at one step: no slope
    assert slope_interval(np.zeros(5), np.arange(5.0)) == (0.0, 0.0, 0.0)
    assert slope_interval(np.arange(2.0), np.arange(2.0)) == (0.0, 0.0, 0.0)


def test_correlation_by_hand():
    # a = [1, 2, 3], b = [2, 4, 7]: deviations [−1, 0, 1] and [−7/3, −1/3, 8/3];
    # Σ products = 7/3 + 8/3 = 5, Σa'² = 2, Σb'² = 114/9, r = 5/√(2·114/9) = 15/√228
    assert correlation(np.array([1.0, 2.0, 3.0]), np.array([2.0, 4.0, 7.0])) == \
        pytest.approx(15 / math.sqrt(228))
    assert correlation(np.arange(5.0), -3 * np.arange(5.0)) == pytest.approx(-1.0)
    # a constant side or fewer than 3 points: 0, not nan
    assert correlation(np.arange(5.0), np.full(5, 2.0)) == 0.0
    assert correlation(np.array([1.0, 2.0]), np.array([2.0, 1.0])) == 0.0


def test_aligned_keeps_shared_steps():
    s1 = (np.array([0.0, 1.0, 2.0, 3.0]), np.array([10.0, 11.0, 12.0, 13.0]))
    s2 = (np.array([1.0, 3.0, 5.0]), np.array([0.1, 0.3, 0.5]))
    steps, v1, v2 = aligned(s1, s2)
    # shared steps 1 and 3
    assert steps.tolist() == [1.0, 3.0]
    assert v1.tolist() == [11.0, 13.0]
    assert v2.tolist() == [0.1, 0.3]


# --------------------------------------------------------------------------- event detectors
# Planted series with known onset / peak / plateau steps; each detector must find the step
# within ±1 and stay quiet on a series without the event.

from rlscope.doctor.stats import (  # noqa: E402
    change_point,
    growth,
    mean_se,
    onset,
    peak_then_fall,
    plateau,
    spikes,
)

S100 = np.arange(100, dtype=float)


def _noise(seed: int, scale: float) -> np.ndarray:
    return scale * np.random.default_rng(seed).standard_normal(100)


@pytest.mark.parametrize("k", [15, 40, 77])
def test_change_point_finds_a_planted_mean_shift(k: int) -> None:
    v = np.where(S100 < k, 1.0, 1.5) + _noise(k, 0.1)
    cp = change_point(S100, v)
    assert cp is not None and abs(cp.step - k) <= 1
    assert cp.before == pytest.approx(1.0, abs=0.05) and cp.after == pytest.approx(1.5, abs=0.05)


def test_change_point_stays_quiet_on_noise() -> None:
    assert change_point(S100, 1.0 + _noise(3, 0.1)) is None


@pytest.mark.parametrize("k", [20, 50, 70])
def test_onset_finds_where_a_flat_series_starts_to_rise(k: int) -> None:
    v = 0.5 + 0.02 * np.maximum(0.0, S100 - k) + _noise(k, 0.05)
    o = onset(S100, v)
    assert o is not None and abs(o.step - k) <= 1
    assert o.slope == pytest.approx(0.02, rel=0.2)


def test_onset_stays_quiet_on_noise() -> None:
    assert onset(S100, 0.5 + _noise(4, 0.05)) is None


def test_growth_reports_onset_and_factor_of_orders_of_magnitude() -> None:
    # 1e-4 until step 50, then ×10 every 10 steps: ~1e-4 → ~3e0 in the last window
    v = 1e-4 * 10 ** (np.maximum(0.0, S100 - 50) / 10) * np.exp(_noise(5, 0.2))
    g = growth(S100, v)
    assert g is not None and abs(g.onset_step - 50) <= 1
    # last window (20 points, steps 80–99) geometric mean 1e-4·10^4.45
    assert 1e3 < g.factor < 1e5
    assert g.before == pytest.approx(1e-4, rel=0.2)


def test_growth_ignores_a_series_that_only_doubles() -> None:
    v = 1e-3 * (1 + np.maximum(0.0, S100 - 50) / 50) * np.exp(_noise(6, 0.05))
    assert growth(S100, v) is None


def test_peak_then_fall_reports_the_peak_step_and_fall_fraction() -> None:
    # rises 0.1 → 0.7 at step 60, then falls by a third of its peak value to ~0.47 at the end
    v = np.where(S100 < 60, 0.1 + 0.01 * S100, 0.7 - 0.3 * (S100 - 60) / 39) + _noise(7, 0.02)
    pf = peak_then_fall(S100, v)
    assert pf is not None and abs(pf.peak_step - 60) <= 1
    assert pf.peak == pytest.approx(0.7, abs=0.03)
    # last window (steps 80–99) mean ≈ 0.7 − 0.3·29.5/39 ≈ 0.473: fell by ≈ 32% of the peak
    assert pf.fall_frac == pytest.approx(0.32, abs=0.04)


def test_peak_then_fall_is_silent_on_a_monotone_rise_and_on_noise() -> None:
    assert peak_then_fall(S100, 0.01 * S100 + _noise(8, 0.02)) is None
    assert peak_then_fall(S100, 0.5 + _noise(9, 0.02)) is None


def test_plateau_after_a_rise_starts_where_the_rise_stops() -> None:
    v = np.where(S100 < 30, 0.02 * S100, 0.6) + _noise(10, 0.02)
    p = plateau(S100, v)
    assert p is not None and abs(p.start_step - 30) <= 1
    assert p.end_step == 99.0 and p.moved_before is True
    assert p.level == pytest.approx(0.6, abs=0.01) and p.frac == pytest.approx(0.7, abs=0.02)


def test_plateau_over_the_whole_run_and_none_on_a_ramp() -> None:
    p = plateau(S100, 0.5 + _noise(11, 0.02))
    assert p is not None and (p.start_step, p.frac, p.moved_before) == (0.0, 1.0, False)
    assert plateau(S100, 0.01 * S100 + _noise(12, 0.02)) is None


def test_spikes_by_robust_z_find_the_planted_points() -> None:
    v = _noise(13, 1.0)
    v[[20, 70]] = 15.0
    sp = spikes(S100, v)
    assert sp.steps == (20.0, 70.0) and sp.first_step == 20.0
    assert sp.max_z > 10 and sp.frac == pytest.approx(0.02)
    assert spikes(S100, _noise(14, 1.0)).steps == ()
    down = spikes(S100, -np.abs(v), direction="down")
    assert 20.0 in down.steps and 70.0 in down.steps


def test_mean_se() -> None:
    assert mean_se(np.array([1.0, 3.0])) == (2.0, pytest.approx(1.0 / np.sqrt(2)))
    assert mean_se(np.array([5.0])) == (5.0, 0.0)


def test_spikes_are_measured_against_the_neighbourhood_not_a_trend() -> None:
    """A loss decaying from 0.04 to 0.006 has no spike at its start; one point 8× its
    neighbours does."""
    steps = np.arange(40.0)
    rng = np.random.default_rng(15)
    loss = 0.006 + 0.035 * np.exp(-steps / 5) + 0.0005 * rng.standard_normal(40)
    assert spikes(steps, loss).steps == ()
    loss[20] = 0.06
    assert spikes(steps, loss).steps == (20.0,)


def test_a_surge_of_a_few_steps_is_a_spike_on_a_short_series() -> None:
    """Value loss 0.035 → 0.30 over steps 1–5 and back (PPO at lr 1e-2, 30 steps): the
    neighbourhood (n/3 = 11 points) is wide enough for the surge to stand out."""
    steps = np.arange(30.0)
    loss = 0.03 + 0.002 * np.random.default_rng(16).standard_normal(30)
    loss[1:6] = [0.15, 0.30, 0.25, 0.18, 0.15]
    sp = spikes(steps, loss, min_ratio=2.0)
    assert {2.0, 3.0} <= set(sp.steps) and sp.first_step is not None and sp.first_step <= 2.0
