"""Tinker's built-in losses as pure functions (Tinker semantics: summed, never normalised).

Every function takes the learner's target-token log-probs ``logp_N`` (with grad) and the
datum inputs concatenated over all datums of a request (``N`` = total target tokens), and
returns ``(loss, metrics)``: a scalar summed over every token of every datum, and detached
metric tensors. Because each loss is a plain sum of per-token terms, splitting a batch into
chunks or micro-batches and adding the gradients gives the same update.

With ρ = exp(ℓ − ℓ_μ) (learner over sampler log-prob) and advantages A:

- ``cross_entropy``: −Σ w·ℓ, with arbitrary real weights w (negative ones included; this is
  how ``forward_backward_custom`` sends −∂L/∂ℓ); w = 1 when ``weights`` is absent.
- ``importance_sampling``: −Σ ρ·A.
- ``ppo``: −Σ min(ρ·A, clip(ρ, lo, hi)·A), absolute ratio bounds (default 0.8 / 1.2);
  Schulman et al. arXiv:1707.06347.
- ``cispo``: −Σ sg(clip(ρ, lo, hi))·A·ℓ (default 0 / 4); MiniMax-M1 arXiv:2506.13585.
- ``dro``: −Σ [ℓ·A − (β/2)(ℓ − ℓ_μ)²], ``beta`` required; Richemond et al. arXiv:2405.19107.
- ``gspo`` (GSPO-token, Zheng et al. arXiv:2507.18071, as Tinker defines it): per datum, the
  sequence log-ratio ``r = mean over M of sg(ℓ) − ℓ_μ`` over the positions M that
  ``sequence_ratio_mask`` marks (≠ 0); every token's ratio is ``s_t = exp(r + ℓ − sg(ℓ))``
  (the sequence ratio's value, the token's own gradient); then
  −Σ min(s_t·A, clip(s_t, lo, hi)·A), absolute bounds (default 0.8 / 1.2, as ``ppo``). A datum
  whose mask marks nothing has r = 0.
- ``stable_reinforce``: refused with a message (it needs sampling-time stability records,
  ``record_stability_info``, whose definition Tinker has not published).

The RL losses read ``target_tokens``, ``logprobs`` (the sampler's) and ``advantages`` and
ignore ``weights``: prompt positions carry A = 0, as the cookbook builds them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

Metrics = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ClipConfig:
    """Absolute bounds on the importance ratio ρ (not offsets from 1)."""

    clip_low_threshold: float
    """Lower ratio bound (e.g. 0.8)."""
    clip_high_threshold: float
    """Upper ratio bound (e.g. 1.2)."""


@dataclass(frozen=True)
class DroConfig:
    """Quadratic penalty of DRO."""

    beta: float
    """Weight β of the (ℓ − ℓ_μ)² penalty."""


def _check_same(name: str, logp_N: torch.Tensor, **tensors: torch.Tensor) -> None:
    if logp_N.dim() != 1:
        raise ValueError(f"{name}: logp_N must be 1-D, got shape {tuple(logp_N.shape)}")
    for key, t in tensors.items():
        if t.shape != logp_N.shape:
            raise ValueError(f"{name}: {key} has shape {tuple(t.shape)}, logp_N has "
                             f"{tuple(logp_N.shape)}")


def gspo(logp_N: torch.Tensor, sampler_logp_N: torch.Tensor, adv_N: torch.Tensor,
         ratio_mask_N: torch.Tensor, datum_N: torch.Tensor,
         cfg: ClipConfig) -> tuple[torch.Tensor, Metrics]:
    """GSPO-token: −Σ min(s_t·A, clip(s_t, lo, hi)·A) with s_t = exp(r_d + ℓ − sg(ℓ)), r_d the
    mean of sg(ℓ) − ℓ_μ over datum d's positions where ``ratio_mask_N`` ≠ 0 (0 if none);
    ``datum_N`` holds each position's datum index (0, 1, ...)."""
    _check_same("gspo", logp_N, sampler_logp_N=sampler_logp_N, adv_N=adv_N,
                ratio_mask_N=ratio_mask_N, datum_N=datum_N)
    n_datums = int(datum_N.max()) + 1 if datum_N.numel() else 0
    in_ratio_N = (ratio_mask_N != 0).to(logp_N.dtype)
    log_ratio_N = (logp_N.detach() - sampler_logp_N) * in_ratio_N
    index_N = datum_N.long()
    sums_D = torch.zeros(n_datums, dtype=logp_N.dtype, device=logp_N.device)
    counts_D = torch.zeros_like(sums_D)
    sums_D.index_add_(0, index_N, log_ratio_N)
    counts_D.index_add_(0, index_N, in_ratio_N)
    seq_log_ratio_D = torch.where(counts_D > 0, sums_D / counts_D.clamp_min(1),
                                  torch.zeros_like(sums_D))
    ratio_N = (seq_log_ratio_D[index_N] + logp_N - logp_N.detach()).exp()
    clipped_N = ratio_N.clamp(cfg.clip_low_threshold, cfg.clip_high_threshold)
    return _done(-torch.minimum(ratio_N * adv_N, clipped_N * adv_N).sum())


def _done(loss: torch.Tensor) -> tuple[torch.Tensor, Metrics]:
    return loss, {"loss:sum": loss.detach()}


def cross_entropy(logp_N: torch.Tensor, weights_N: torch.Tensor) -> tuple[torch.Tensor, Metrics]:
    """−Σ w·ℓ (weights may be any real numbers)."""
    _check_same("cross_entropy", logp_N, weights_N=weights_N)
    return _done(-(weights_N * logp_N).sum())


def importance_sampling(logp_N: torch.Tensor, sampler_logp_N: torch.Tensor,
                        adv_N: torch.Tensor) -> tuple[torch.Tensor, Metrics]:
    """−Σ ρ·A with ρ = exp(ℓ − ℓ_μ)."""
    _check_same("importance_sampling", logp_N, sampler_logp_N=sampler_logp_N, adv_N=adv_N)
    ratio_N = (logp_N - sampler_logp_N).exp()
    return _done(-(ratio_N * adv_N).sum())


def ppo(logp_N: torch.Tensor, sampler_logp_N: torch.Tensor, adv_N: torch.Tensor,
        cfg: ClipConfig) -> tuple[torch.Tensor, Metrics]:
    """−Σ min(ρ·A, clip(ρ, lo, hi)·A): the PPO clipped surrogate with absolute bounds."""
    _check_same("ppo", logp_N, sampler_logp_N=sampler_logp_N, adv_N=adv_N)
    ratio_N = (logp_N - sampler_logp_N).exp()
    clipped_N = ratio_N.clamp(cfg.clip_low_threshold, cfg.clip_high_threshold)
    return _done(-torch.minimum(ratio_N * adv_N, clipped_N * adv_N).sum())


def cispo(logp_N: torch.Tensor, sampler_logp_N: torch.Tensor, adv_N: torch.Tensor,
          cfg: ClipConfig) -> tuple[torch.Tensor, Metrics]:
    """−Σ sg(clip(ρ, lo, hi))·A·ℓ: a REINFORCE term weighted by the clipped, detached ratio."""
    _check_same("cispo", logp_N, sampler_logp_N=sampler_logp_N, adv_N=adv_N)
    weight_N = (logp_N.detach() - sampler_logp_N).exp().clamp(cfg.clip_low_threshold,
                                                               cfg.clip_high_threshold)
    return _done(-(weight_N * adv_N * logp_N).sum())


def dro(logp_N: torch.Tensor, sampler_logp_N: torch.Tensor, adv_N: torch.Tensor,
        cfg: DroConfig) -> tuple[torch.Tensor, Metrics]:
    """−Σ [ℓ·A − (β/2)(ℓ − ℓ_μ)²]."""
    _check_same("dro", logp_N, sampler_logp_N=sampler_logp_N, adv_N=adv_N)
    penalty_N = 0.5 * cfg.beta * (logp_N - sampler_logp_N).square()
    return _done(-(logp_N * adv_N - penalty_N).sum())


@dataclass(frozen=True)
class LossSpec:
    """What a loss reads: its required ``loss_fn_inputs`` and its allowed config keys."""

    inputs: tuple[str, ...]
    config_keys: tuple[str, ...]
    defaults: tuple[tuple[str, float], ...]
    """Config values used when the client sends none."""


LOSSES: dict[str, LossSpec] = {
    "cross_entropy": LossSpec(("target_tokens",), (), ()),
    "importance_sampling": LossSpec(("target_tokens", "logprobs", "advantages"), (), ()),
    "ppo": LossSpec(("target_tokens", "logprobs", "advantages"),
                    ("clip_low_threshold", "clip_high_threshold"),
                    (("clip_low_threshold", 0.8), ("clip_high_threshold", 1.2))),
    "cispo": LossSpec(("target_tokens", "logprobs", "advantages"),
                      ("clip_low_threshold", "clip_high_threshold"),
                      (("clip_low_threshold", 0.0), ("clip_high_threshold", 4.0))),
    "dro": LossSpec(("target_tokens", "logprobs", "advantages"), ("beta",), ()),
    "gspo": LossSpec(("target_tokens", "logprobs", "advantages", "sequence_ratio_mask"),
                     ("clip_low_threshold", "clip_high_threshold"),
                     (("clip_low_threshold", 0.8), ("clip_high_threshold", 1.2))),
}
"""The supported ``loss_fn`` names (stable_reinforce and custom are not: `REFUSED`)."""

REFUSED: dict[str, str] = {
    "stable_reinforce": (
        "loss_fn 'stable_reinforce' is not supported by rlscope serve: it needs the stability "
        "information Tinker's sampler records with record_stability_info=True, whose "
        "definition is not published; use ppo, cispo or gspo"),
    "custom": (
        "loss_fn 'custom' (server-side custom losses) is not supported by rlscope serve; "
        "forward_backward_custom works without it (the SDK computes the loss locally)"),
}
"""Loss names of the SDK the server refuses, with the reason sent to the client."""


def check_loss_request(loss_fn: str, config: Mapping[str, float | str],
                       input_names: set[str]) -> dict[str, float]:
    """Validate a loss name, its config and the datum input names; returns the numeric config
    with defaults filled in. Raises ValueError with a message meant for the client."""
    if loss_fn in REFUSED:
        raise ValueError(REFUSED[loss_fn])
    if loss_fn not in LOSSES:
        raise ValueError(f"unknown loss_fn {loss_fn!r}; this server supports "
                         f"{', '.join(LOSSES)}")
    spec = LOSSES[loss_fn]
    unknown = sorted(set(config) - set(spec.config_keys))
    if unknown:
        raise ValueError(f"loss_fn_config keys {unknown} are not valid for {loss_fn}; "
                         f"valid: {list(spec.config_keys) or 'none'}")
    values: dict[str, float] = dict(spec.defaults)
    for key, value in config.items():
        if isinstance(value, str):
            raise ValueError(f"loss_fn_config[{key!r}] must be a number, got {value!r}")
        values[key] = float(value)
    missing = [k for k in spec.config_keys if k not in values]
    if missing:
        raise ValueError(f"{loss_fn} needs loss_fn_config keys {missing}")
    absent = [k for k in spec.inputs if k not in input_names]
    if absent:
        raise ValueError(f"{loss_fn} needs loss_fn_inputs {list(spec.inputs)}; "
                         f"missing {absent}")
    if "clip_low_threshold" in values and \
            not values["clip_low_threshold"] <= values["clip_high_threshold"]:
        raise ValueError("clip_low_threshold must be <= clip_high_threshold")
    return values


def tinker_loss(loss_fn: str, logp_N: torch.Tensor, inputs: Mapping[str, torch.Tensor],
                config: Mapping[str, float]) -> tuple[torch.Tensor, Metrics]:
    """Dispatch to the loss named ``loss_fn`` (already validated by `check_loss_request`).

    ``inputs`` holds the concatenated ``[N]`` float tensors ``weights``, ``logprobs``,
    ``advantages`` and ``sequence_ratio_mask`` as the loss needs them, and (for ``gspo``)
    ``datum``, each position's datum index.
    """
    if loss_fn == "cross_entropy":
        weights_N = inputs.get("weights")
        return cross_entropy(logp_N, torch.ones_like(logp_N) if weights_N is None
                             else weights_N)
    sampler_N, adv_N = inputs["logprobs"], inputs["advantages"]
    rl: dict[str, Callable[[], tuple[torch.Tensor, Metrics]]] = {
        "importance_sampling": lambda: importance_sampling(logp_N, sampler_N, adv_N),
        "ppo": lambda: ppo(logp_N, sampler_N, adv_N, ClipConfig(
            config["clip_low_threshold"], config["clip_high_threshold"])),
        "cispo": lambda: cispo(logp_N, sampler_N, adv_N, ClipConfig(
            config["clip_low_threshold"], config["clip_high_threshold"])),
        "dro": lambda: dro(logp_N, sampler_N, adv_N, DroConfig(config["beta"])),
        "gspo": lambda: gspo(logp_N, sampler_N, adv_N, inputs["sequence_ratio_mask"],
                             inputs["datum"], ClipConfig(config["clip_low_threshold"],
                                                         config["clip_high_threshold"])),
    }
    if loss_fn not in rl:
        raise ValueError(f"unknown loss_fn {loss_fn!r}")
    return rl[loss_fn]()
