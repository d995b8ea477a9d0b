"""Trend statistics for the doctor (METRICS.md, "The doctor").

`trend` compares the first and last windows of a series, fits a slope with a bootstrap
interval, estimates the step-to-step noise and counts up and down steps. Windows are the first
and last ``max(min_window, frac·n)`` points. The noise σ is the std of first differences
divided by √2 (for independent noise around a smooth trend the difference of two neighbours
has variance 2σ²). A change "exceeds the noise" when the two window means differ by more than
``z`` standard errors, σ·√(1/w₁ + 1/w₂), and by more than 1e-4 of their scale. Everything is
deterministic (a fixed bootstrap seed).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

WINDOW_FRAC = 0.2
MIN_WINDOW = 3
N_BOOTSTRAP = 200
MAX_BOOTSTRAP_POINTS = 2000
"""Longer series are thinned evenly for the slope's bootstrap interval (not for the slope)."""
Z = 3.0
REL_TOL = 1e-4
"""Changes below this fraction of the series' scale never count (float rounding)."""


@dataclass(frozen=True)
class Trend:
    """Trend of one series; ``slope_*`` are per step (with a 95% bootstrap interval)."""

    n: int
    first_step: float
    last_step: float
    first_mean: float
    last_mean: float
    change: float
    slope: float
    slope_low: float
    slope_high: float
    noise: float
    exceeds_noise: bool
    ups: int
    downs: int

    @property
    def direction(self) -> str:
        """``up``/``down`` when the change exceeds the noise, else ``flat``."""
        if not self.exceeds_noise:
            return "flat"
        return "up" if self.change > 0 else "down"

    def as_dict(self) -> dict[str, float | int | bool | str]:
        """Rounded to 4 significant digits (for evidence and reports)."""
        out: dict[str, float | int | bool | str] = {
            k: float(f"{v:.4g}") if isinstance(v, float) else v
            for k, v in asdict(self).items()}
        return out | {"direction": self.direction}


def window_size(n: int, frac: float = WINDOW_FRAC, min_window: int = MIN_WINDOW) -> int:
    return max(1, min(n // 2 if n >= 2 else 1, max(min_window, int(frac * n))))


def noise_sigma(values: np.ndarray) -> float:
    """Step-to-step noise σ = std(first differences)/√2 (0 for fewer than 3 points)."""
    if len(values) < 3:
        return 0.0
    return float(np.std(np.diff(values)) / np.sqrt(2.0))


def slope_interval(steps: np.ndarray, values: np.ndarray, n_boot: int = N_BOOTSTRAP,
                   seed: int = 0) -> tuple[float, float, float]:
    """Least-squares slope and its 2.5/97.5% pairs-bootstrap interval."""
    if len(steps) < 3 or np.ptp(steps) == 0:
        return 0.0, 0.0, 0.0
    slope = float(np.polyfit(steps, values, 1)[0])
    if len(steps) > MAX_BOOTSTRAP_POINTS:  # evenly thinned: bounded memory on long runs
        keep = np.linspace(0, len(steps) - 1, MAX_BOOTSTRAP_POINTS).round().astype(int)
        steps, values = steps[keep], values[keep]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(steps), size=(n_boot, len(steps)))
    xs, ys = steps[idx], values[idx]
    xm, ym = xs.mean(1, keepdims=True), ys.mean(1, keepdims=True)
    var = ((xs - xm) ** 2).sum(1)
    ok = var > 0
    boots = ((xs - xm) * (ys - ym)).sum(1)[ok] / var[ok]
    if len(boots) == 0:
        return slope, slope, slope
    low, high = np.percentile(boots, [2.5, 97.5])
    return slope, float(low), float(high)


def trend(steps: np.ndarray, values: np.ndarray, frac: float = WINDOW_FRAC,
          min_window: int = MIN_WINDOW, z: float = Z) -> Trend:
    """The trend of a series (at least one point)."""
    n = len(values)
    w = window_size(n, frac, min_window)
    first, last = float(values[:w].mean()), float(values[-w:].mean())
    sigma = noise_sigma(values)
    se = sigma * np.sqrt(2.0 / w)
    change = last - first
    slope, low, high = slope_interval(steps, values)
    diffs = np.diff(values)
    return Trend(n=n, first_step=float(steps[0]), last_step=float(steps[-1]), first_mean=first,
                 last_mean=last, change=change, slope=slope, slope_low=low, slope_high=high,
                 noise=sigma, exceeds_noise=bool(
                     n >= 2 * w and abs(change) > z * se
                     and abs(change) > REL_TOL * max(abs(first), abs(last), 1e-12)),
                 ups=int((diffs > 0).sum()), downs=int((diffs < 0).sum()))


def robust_z(values: np.ndarray) -> np.ndarray:
    """(x − median) / (1.4826·MAD); zeros when the MAD is 0."""
    median = np.median(values)
    mad = 1.4826 * np.median(np.abs(values - median))
    if mad == 0:
        return np.zeros_like(values)
    return (values - median) / mad


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation (0 when either side is constant or shorter than 3)."""
    if len(a) < 3 or np.std(a) == 0 or np.std(b) == 0:
        return 0.0
    return float(np.corrcoef(a, b)[0, 1])


def aligned(s1: tuple[np.ndarray, np.ndarray], s2: tuple[np.ndarray, np.ndarray]
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The steps two series share, and both series' values there."""
    steps, i1, i2 = np.intersect1d(s1[0], s2[0], return_indices=True)
    return steps, s1[1][i1], s2[1][i2]
