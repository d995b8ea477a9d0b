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


def _beyond_rounding(change: float, before: float, after: float) -> bool:
    """Whether a change from ``before`` to ``after`` is more than REL_TOL of their scale."""
    return abs(change) > REL_TOL * max(abs(before), abs(after), 1e-12)


def _significant_z(change: float, before: float, after: float, se: float,
                   z: float) -> float | None:
    """The change in standard errors ``se`` (inf for se 0) when it is beyond rounding and
    exceeds ``z``, else None."""
    if not _beyond_rounding(change, before, after):
        return None
    zs = abs(change) / se if se > 0 else float("inf")
    return zs if zs > z else None


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
                     and _beyond_rounding(change, first, last)),
                 ups=int((diffs > 0).sum()), downs=int((diffs < 0).sum()))


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


# --------------------------------------------------------------------------- events
#
# Detectors that say *when* something starts and *how much* it changes (issue 16, "Events").
# Each takes a series (steps, values) sorted by step and returns the step where its event
# starts, or None when the series has no such event beyond its step-to-step noise. All are
# O(n) (prefix sums), deterministic and torch-free.

SPIKE_Z = 6.0
"""Robust z-score above which a point is a spike."""
MIN_SEGMENT = 3
"""Fewest points on either side of a change point or onset."""


@dataclass(frozen=True)
class Spikes:
    """Points whose robust z-score (median/MAD) exceeds ``z``."""

    steps: tuple[float, ...]
    max_z: float
    frac: float
    """Fraction of points that are spikes."""

    @property
    def first_step(self) -> float | None:
        return self.steps[0] if self.steps else None


def rolling_median(values: np.ndarray, window: int) -> np.ndarray:
    """Centred rolling median over ``window`` points (the ends padded with the end values)."""
    if window <= 1 or len(values) < 3:
        return values.astype(float)
    half = window // 2
    padded = np.pad(values.astype(float), half, mode="edge")
    return np.median(np.lib.stride_tricks.sliding_window_view(padded, 2 * half + 1), axis=1)


SPIKE_WINDOW = 7
SPIKE_WINDOW_MAX = 15
"""The neighbourhood (points) a spike is measured against, so that a trend is not a spike: a
third of the series, at least 7 (a surge lasting a few steps still stands out) and at most 15
(a wider median would stop following the trend of a long run)."""


def spikes(steps: np.ndarray, values: np.ndarray, z: float = SPIKE_Z,
           direction: str = "up", window: int | None = None,
           min_ratio: float = 0.0) -> Spikes:
    """Spikes by robust z-score against the neighbourhood: the residual from a centred rolling
    median over ``window`` points (default n/3 within [7, 15], odd), divided by the
    step-to-step noise σ = 1.4826·MAD(first differences)/√2, above ``z`` (``direction``
    "up"), below −z ("down") or either ("both"). Detrending first means the high start of a
    decaying loss is not a spike. Residuals with MAD 0 have spikes where they leave 0 at all
    (any departure from a constant is infinitely many MADs). ``min_ratio`` > 0 also requires
    |x| ≥ min_ratio × |neighbourhood median| (a spike of a positive loss at least that many
    times its neighbours)."""
    if len(values) == 0:
        return Spikes((), 0.0, 0.0)
    if window is None:
        window = min(max(SPIKE_WINDOW, (len(values) // 3) | 1), SPIKE_WINDOW_MAX)
    med = rolling_median(values, window)
    dev = values - med
    diffs = np.diff(values)
    # σ from first differences (robustly: a spike moves two of them), not from the residuals
    # themselves, which are exactly 0 wherever the median sits on a point of a monotone curve.
    mad = 1.4826 * float(np.median(np.abs(diffs - np.median(diffs)))) / np.sqrt(2.0) \
        if len(diffs) >= 2 else 0.0
    if mad > 0:
        rz = dev / mad
    else:
        scale = max(float(np.median(np.abs(values))), 1e-12) * 1e-6
        rz = np.where(np.abs(dev) > scale, np.copysign(np.inf, dev), 0.0)
    signed = {"up": rz, "down": -rz, "both": np.abs(rz)}[direction]
    hit = signed > z
    if min_ratio > 0:
        hit &= np.abs(values) >= min_ratio * np.abs(med)
    pool = signed[hit] if hit.any() else signed  # the largest spike kept, where any is
    finite = pool[np.isfinite(pool)]
    max_z = float(pool.max()) if len(pool) else 0.0
    if not np.isfinite(max_z):
        max_z = float(finite.max()) if len(finite) else 0.0
    return Spikes(tuple(float(s) for s in steps[hit]), max_z, float(hit.mean()))


@dataclass(frozen=True)
class ChangePoint:
    """A sustained shift of the mean: before → after from ``step`` on."""

    step: float
    index: int
    before: float
    after: float
    z: float
    """|after − before| in standard errors of the difference (noise from first differences)."""

    @property
    def factor(self) -> float:
        return self.after / self.before if self.before != 0 else float("inf")


def change_point(steps: np.ndarray, values: np.ndarray, z: float = Z,
                 min_segment: int = MIN_SEGMENT) -> ChangePoint | None:
    """The single split into two constant segments with the least squared error (binary
    segmentation's first split), kept when the two means differ by more than ``z`` standard
    errors of the step-to-step noise and by more than REL_TOL of their scale. The step
    returned is the first of the second segment."""
    n = len(values)
    if n < 2 * min_segment:
        return None
    c1 = np.cumsum(values)
    c2 = np.cumsum(values ** 2)
    k = np.arange(min_segment, n - min_segment + 1)  # sizes of the first segment
    s1, q1 = c1[k - 1], c2[k - 1]
    s2, q2 = c1[-1] - s1, c2[-1] - q1
    sse = (q1 - s1 ** 2 / k) + (q2 - s2 ** 2 / (n - k))
    best = int(np.argmin(sse))
    i = int(k[best])
    before, after = float(values[:i].mean()), float(values[i:].mean())
    sigma = noise_sigma(values)
    # Noise from differences within each segment: the jump itself does not inflate it.
    sigma = float(np.sqrt((noise_sigma(values[:i]) ** 2 * i + noise_sigma(values[i:]) ** 2
                           * (n - i)) / n)) if min(i, n - i) >= 3 else sigma
    se = sigma * np.sqrt(1.0 / i + 1.0 / (n - i))
    zs = _significant_z(after - before, before, after, se, z)
    if zs is None:
        return None
    return ChangePoint(float(steps[i]), i, before, after, float(zs))


@dataclass(frozen=True)
class Onset:
    """A series flat at ``level`` until ``step``, then moving linearly at ``slope`` per step."""

    step: float
    index: int
    level: float
    slope: float
    z: float
    """The total change after the onset in noise standard errors."""


def _hinge_sse(x: np.ndarray, y: np.ndarray, min_segment: int) -> tuple[np.ndarray, np.ndarray,
                                                                          np.ndarray, np.ndarray]:
    """For every candidate knee index i (x[i] = τ): SSE of y ≈ a + b·max(0, x − τ) and its
    (a, b). Suffix sums make it O(n)."""
    n = len(x)
    idx = np.arange(min_segment - 1, n - min_segment)
    tau = x[idx]
    # suffix sums over j ≥ i
    rs = lambda a: np.cumsum(a[::-1])[::-1]  # noqa: E731
    cnt = np.arange(n, 0, -1, dtype=float)
    sx, sxx, sy, sxy = rs(x), rs(x * x), rs(y), rs(x * y)
    c, s1, s2, sty = cnt[idx], sx[idx], sxx[idx], sxy[idx]
    syi = sy[idx]
    h1 = s1 - tau * c  # Σ h
    h2 = s2 - 2 * tau * s1 + tau ** 2 * c  # Σ h²
    hy = sty - tau * syi  # Σ h·y
    ny, ty, tyy = float(n), float(y.sum()), float((y * y).sum())
    det = ny * h2 - h1 ** 2
    ok = det > 1e-12
    det = np.where(ok, det, 1.0)
    b = np.where(ok, (ny * hy - h1 * ty) / det, 0.0)
    a = np.where(ok, (ty - b * h1) / ny, ty / ny)
    sse = tyy - 2 * a * ty - 2 * b * hy + ny * a ** 2 + 2 * a * b * h1 + b ** 2 * h2
    sse = np.where(ok, sse, np.inf)
    return idx, sse, a, b


def onset(steps: np.ndarray, values: np.ndarray, z: float = Z,
          min_segment: int = MIN_SEGMENT) -> Onset | None:
    """Where a flat series starts to move: the knee τ of the least-squares hinge
    y = a + b·max(0, t − τ) over the points (τ at a logged step). Kept when the change after
    the knee, b·(t_last − τ), exceeds ``z`` noise standard errors (σ·√(2/w), w the last
    window) and a straight line (knee at the first step) does not fit as well."""
    n = len(values)
    if n < 2 * min_segment:
        return None
    idx, sse, a, b = _hinge_sse(steps, values, min_segment)
    best = int(np.argmin(sse))
    i, level, slope = int(idx[best]), float(a[best]), float(b[best])
    change = slope * float(steps[-1] - steps[i])
    sigma = noise_sigma(values)
    w = window_size(n)
    se = sigma * np.sqrt(2.0 / w)
    zs = _significant_z(change, level, level + change, se, z)
    if zs is None:
        return None
    return Onset(float(steps[i]), i, level, slope, float(zs))


@dataclass(frozen=True)
class Growth:
    """A positive series that grows (or shrinks) by ``factor`` from ``onset_step`` on."""

    onset_step: float
    factor: float
    """Mean of the last window over the mean before the onset (geometric means)."""
    before: float
    after: float


def growth(steps: np.ndarray, values: np.ndarray, min_factor: float = 10.0,
           z: float = Z) -> Growth | None:
    """Growth by orders of magnitude: the onset of the trend of log10|x| (hinge knee), and
    the factor between the geometric mean before it and that of the last window. None when
    the factor (or its inverse, for a shrinking series) is below ``min_factor``."""
    if len(values) < 2 * MIN_SEGMENT:
        return None
    logs = np.log10(np.maximum(np.abs(values), 1e-30))
    o = onset(steps, logs, z=z)
    if o is None:
        return None
    w = window_size(len(values))
    before_log = float(logs[: max(o.index, 1)].mean())
    after_log = float(logs[-w:].mean())
    factor = float(10 ** (after_log - before_log))
    if max(factor, 1 / max(factor, 1e-300)) < min_factor:
        return None
    return Growth(o.step, factor, float(10 ** before_log), float(10 ** after_log))


@dataclass(frozen=True)
class PeakFall:
    """A series that rose to a peak and then fell (smoothed with a centred moving mean)."""

    peak_step: float
    peak: float
    start: float
    last: float
    fall_frac: float
    """(peak − last)/|peak|: how much of the peak value was lost."""
    gain_lost: float
    """(peak − last)/(peak − start): how much of the rise was given back."""


def smooth(values: np.ndarray, w: int) -> np.ndarray:
    """Centred moving mean over ``w`` points (shorter at the ends)."""
    if w <= 1 or len(values) < 2:
        return values.astype(float)
    c = np.concatenate([[0.0], np.cumsum(values)])
    half = w // 2
    lo = np.clip(np.arange(len(values)) - half, 0, len(values))
    hi = np.clip(np.arange(len(values)) + (w - half), 0, len(values))
    return (c[hi] - c[lo]) / (hi - lo)


def peak_then_fall(steps: np.ndarray, values: np.ndarray, z: float = Z,
                   min_fall: float = 0.1) -> PeakFall | None:
    """A rise to a peak then a fall. The peak is the maximum of the series smoothed over a
    third of a window (at least 3 points), at least a window (w points) from the end and 2
    points from the start; the rise (peak − the points before it, at most a window) and the
    fall (peak − last window) must each exceed ``z`` standard errors of the noise, and the fall
    must be at least ``min_fall`` of the rise.
    Higher is taken as better; negate a lower-is-better series."""
    n = len(values)
    w = window_size(n)
    if n < 3 * max(w, MIN_SEGMENT):
        return None
    sm = smooth(values, max(MIN_SEGMENT, w // 3))
    inner = sm[: n - w]
    p = int(np.argmax(inner))
    if p < 2:
        return None
    peak = float(sm[p])
    # The start is the points before the peak (at most a window): an early peak must not be
    # averaged into its own baseline.
    w0 = min(w, p)
    start, last = float(values[:w0].mean()), float(values[-w:].mean())
    sigma = noise_sigma(values)
    rise, fall = peak - start, peak - last
    if rise <= z * sigma * np.sqrt(1.0 / w0 + 1.0 / w) or fall <= z * sigma * np.sqrt(2.0 / w) \
            or fall < min_fall * rise:
        return None
    return PeakFall(float(steps[p]), peak, start, last,
                    fall / abs(peak) if peak != 0 else float("inf"), fall / rise)


@dataclass(frozen=True)
class Plateau:
    """The series stays at ``level`` (slope within noise) from ``start_step`` to ``end_step``."""

    start_step: float
    end_step: float
    level: float
    frac: float
    """Fraction of the logged points in the plateau."""
    moved_before: bool
    """Whether the series moved beyond noise before the plateau (a rise/fall that stopped)."""


def plateau(steps: np.ndarray, values: np.ndarray, z: float = Z,
            min_frac: float = 0.3, min_points: int = 10) -> Plateau | None:
    """A trailing plateau: the knee of the hinge fitted backwards (y moves until τ, then stays
    flat to the end), or the whole run when nothing moves. Kept when the flat part holds at
    least ``min_frac`` of the points (and ``min_points``), its own first and last windows agree
    within ``z`` standard errors and its slope over its length stays within that too."""
    n = len(values)
    if n < max(min_points, 2 * MIN_SEGMENT):
        return None
    # Reverse time: the trailing flat part becomes a leading flat part, the hinge finds its end.
    rev_steps = -steps[::-1]
    o = onset(rev_steps, values[::-1], z=z)
    start = 0 if o is None else n - 1 - o.index
    flat_steps, flat = steps[start:], values[start:]
    if len(flat) < max(min_points, min_frac * n):
        return None
    tr = trend(flat_steps, flat, z=z)
    sigma = noise_sigma(flat)
    span = float(flat_steps[-1] - flat_steps[0])
    if tr.exceeds_noise or abs(tr.slope) * span > z * sigma * np.sqrt(2.0 / window_size(
            len(flat))) + REL_TOL * abs(float(flat.mean())):
        return None
    return Plateau(float(flat_steps[0]), float(flat_steps[-1]), float(flat.mean()),
                   len(flat) / n, o is not None)


def mean_se(values: np.ndarray) -> tuple[float, float]:
    """Mean and its standard error std/√n (0 for one point)."""
    n = len(values)
    if n == 0:
        return 0.0, 0.0
    return float(values.mean()), float(values.std() / np.sqrt(n)) if n > 1 else 0.0
