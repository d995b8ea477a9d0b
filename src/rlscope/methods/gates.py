"""Influence gates: turn an advantage into the weight the objective uses (METHODS.md).

A gate is a pure function ``(adv_BT, logp_BT, cfg) -> (weight_BT, stats)`` where ``logp_BT``
is the current learner's log-prob of the sampled token, detached. ``stats`` holds per-token
detached tensors the metric schema reduces over valid tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlscope.methods.spec import GateConfig

GateOut = tuple[torch.Tensor, dict[str, torch.Tensor]]


def no_gate(adv_BT: torch.Tensor, logp_BT: torch.Tensor, cfg: GateConfig) -> GateOut:
    """w = A."""
    return adv_BT, {}


def delight(adv_BT: torch.Tensor, logp_BT: torch.Tensor, cfg: GateConfig) -> GateOut:
    """Delightful policy gradient: g = σ(A·(−ℓ)/η), w = g·A.

    Surprising successes (A > 0, low π(a)) pass; surprising failures are damped. As η → ∞,
    g → 1/2 and the update is REINFORCE / 2. Source: the delight-gradient sandbox (DG).
    Regime: η > 0; any advantage estimator.
    """
    gate_BT = torch.sigmoid(adv_BT * (-logp_BT) / cfg.eta)
    return gate_BT * adv_BT, {"gate_mean": gate_BT}


GATES: dict[str, Callable[[torch.Tensor, torch.Tensor, GateConfig], GateOut]] = {
    "none": no_gate,
    "delight": delight,
}
