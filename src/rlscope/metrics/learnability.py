"""The reward-contrast theory of learnability (COMPANIONS.md §5, "Theory"): pure functions.

A success needs the right action at D uncertain decisions, so its probability is
q = Π_t p_t (p^D when every decision has the same p). A group of K rollouts of one prompt
carries contrast (a mixed group: some successes, some failures) with probability
M(q, K) = 1 − q^K − (1 − q)^K. At a budget of B rollouts the expected successes are B·q and the
expected mixed groups (B/K)·M(q, K).

Regimes (the thresholds are a choice of the spec): ``cold`` when q·K < 1 (a group rarely sees
a success), ``saturated`` when (1 − q)·K < 1 (a group rarely sees a failure), ``contrastive``
otherwise (the band). Shells are decade bins of q; the sub-band tail is q < 1/K and the
deep-cold tail q < 0.1/K.

With a homogeneous p the squared norm of ∇ log q over the D target logits is D(1 − p)²; over
the whole softmax table of b actions per decision it is D(1 − p)² · b/(b − 1) when the wrong
actions share the remaining mass equally.
"""

from __future__ import annotations

import math

import torch

REGIMES = ("cold", "contrastive", "saturated")


def success_probability(p_D: torch.Tensor) -> torch.Tensor:
    """q = Π_d p_d over the last dimension (the D decisions of a path), ``[..., D] → [...]``."""
    return p_D.prod(-1)


def mixed_group_probability(q: torch.Tensor | float, group_size: int) -> torch.Tensor:
    """M(q, K) = 1 − q^K − (1 − q)^K: the probability that a group of K independent rollouts
    with success probability q holds both a success and a failure."""
    if group_size < 1:
        raise ValueError(f"group_size={group_size}: a group holds at least 1 rollout")
    q_t = torch.as_tensor(q, dtype=torch.float64)
    return 1.0 - q_t.pow(group_size) - (1.0 - q_t).pow(group_size)


def pass_at_k(q: torch.Tensor | float, k: int) -> torch.Tensor:
    """1 − (1 − q)^k: the probability that at least one of k rollouts succeeds."""
    return 1.0 - (1.0 - torch.as_tensor(q, dtype=torch.float64)).pow(k)


def expected_successes(q: float, budget: int) -> float:
    """B·q successes expected among B rollouts."""
    return budget * q


def expected_mixed_groups(q: float, budget: int, group_size: int) -> float:
    """(B/K)·M(q, K) mixed groups expected among B rollouts in groups of K."""
    return budget / group_size * float(mixed_group_probability(q, group_size))


def regime(q: float, group_size: int) -> str:
    """``cold`` (q·K < 1), ``saturated`` ((1 − q)·K < 1) or ``contrastive`` (the band)."""
    if q * group_size < 1:
        return "cold"
    if (1 - q) * group_size < 1:
        return "saturated"
    return "contrastive"


def shell(q: float) -> int:
    """The decade bin of q: ⌊log10 q⌋ (q in [1e-3, 1e-2) → −3); q = 1 is shell 0."""
    if not 0 < q <= 1:
        raise ValueError(f"q={q} must be in (0, 1]")
    return min(math.floor(math.log10(q)), 0)


def in_sub_band_tail(q: float, group_size: int) -> bool:
    """q < 1/K: below the contrastive band."""
    return q < 1 / group_size


def in_deep_cold_tail(q: float, group_size: int) -> bool:
    """q < 0.1/K: a decade below the band."""
    return q < 0.1 / group_size


def grad_log_q_sq_norm(p: float, depth: int, branching: int = 0) -> float:
    """‖∇ log q‖² for a homogeneous p over D = ``depth`` decisions: D(1 − p)² over the target
    logits (``branching`` 0), × b/(b − 1) over the full softmax table of b = ``branching``
    actions (wrong actions sharing 1 − p equally)."""
    base = depth * (1 - p) ** 2
    if branching == 0:
        return base
    if branching < 2:
        raise ValueError(f"branching={branching} must be >= 2 (or 0 for the target logits)")
    return base * branching / (branching - 1)
