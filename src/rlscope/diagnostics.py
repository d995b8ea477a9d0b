"""Entropy and gradient diagnostics of one update (METHODS.md, "Training protocol").

Both run only at evaluation steps and never touch what training reads: no random draws, no
parameter or ``.grad`` writes (gradients come from ``torch.autograd.grad``), so a run with
diagnostics on logs the same training metrics as one with them off.

- Entropy diagnostics, on the batch just trained: the policy's entropy at the action positions
  before the first and after the last inner epoch (``diag/batch_entropy_before|after|delta``);
  the covariance between π_before(a) and the change of the chosen token's logit
  (``diag/cov_pi_dlogit``, the quantity that drives entropy change under softmax policy
  gradients, Cui et al. 2505.22617); the entropy change on positive- and negative-advantage
  positions; and by tertiles of surprisal (−log π_before(a)) and of delight (A · surprisal).
- Gradient diagnostics, before the update: the cosine between the method's gradient and the
  cross-entropy-oracle gradient on the same batch (targets teacher-forced on the true prefix),
  and the method gradient's norm before and after clipping.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlscope.batch import RolloutBatch
from rlscope.learner import (
    Denominators,
    LearnerInputs,
    batch_statistic,
    forward_completion,
    micro_batch_loss,
)
from rlscope.methods.regularizers import entropy_from_logp
from rlscope.methods.spec import MethodSpec
from rlscope.metrics.estimators import masked_mean
from rlscope.policy.base import Policy
from rlscope.policy.value_head import ValueHead
from rlscope.sampling.processors import SampledDistribution


@dataclass(frozen=True)
class Snapshot:
    """The policy at the action positions of a batch: logits of the chosen tokens, log π of
    them, and the entropy of the sampling distribution, all ``[B, T]`` and detached."""

    chosen_logit_BT: torch.Tensor
    logp_BT: torch.Tensor
    entropy_BT: torch.Tensor


@torch.no_grad()
def snapshot(policy: Policy, batch: RolloutBatch, inputs: LearnerInputs,
             dist: SampledDistribution) -> Snapshot:
    """The policy's view of ``batch``'s action tokens (one no-grad forward)."""
    fwd = forward_completion(policy, batch, inputs.tokens_BT, dist)
    chosen_BT = fwd.logits_BTV.gather(-1, inputs.tokens_BT[..., None])[..., 0]
    return Snapshot(chosen_logit_BT=chosen_BT.float(), logp_BT=fwd.logp_BT,
                    entropy_BT=entropy_from_logp(fwd.logp_BTV))


def _tertile_means(key_BT: torch.Tensor, value_BT: torch.Tensor, mask_BT: torch.Tensor
                   ) -> list[torch.Tensor]:
    """Mean of ``value`` in the lower, middle and upper third of ``key`` over valid tokens."""
    valid = mask_BT.bool()
    keys, values = key_BT[valid], value_BT[valid]
    if keys.numel() < 3:
        return [values.mean() if values.numel() else torch.zeros(())] * 3
    order = keys.argsort()
    return [values[chunk].mean() for chunk in order.tensor_split(3)]


def entropy_diagnostics(before: Snapshot, after: Snapshot, inputs: LearnerInputs
                        ) -> dict[str, torch.Tensor]:
    """``diag/`` entropy metrics from snapshots taken before and after one update."""
    mask_BT = inputs.mask_BT
    delta_BT = after.entropy_BT - before.entropy_BT
    pi_BT = before.logp_BT.exp()
    dlogit_BT = after.chosen_logit_BT - before.chosen_logit_BT
    cov = masked_mean((pi_BT - masked_mean(pi_BT, mask_BT))
                      * (dlogit_BT - masked_mean(dlogit_BT, mask_BT)), mask_BT)
    adv_BT = inputs.adv_BT
    out = {"diag/batch_entropy_before": masked_mean(before.entropy_BT, mask_BT),
           "diag/batch_entropy_after": masked_mean(after.entropy_BT, mask_BT),
           "diag/batch_entropy_delta": masked_mean(delta_BT, mask_BT),
           "diag/cov_pi_dlogit": cov,
           "diag/entropy_delta_pos_adv": masked_mean(delta_BT, mask_BT * (adv_BT > 0)),
           "diag/entropy_delta_neg_adv": masked_mean(delta_BT, mask_BT * (adv_BT < 0))}
    surprisal_BT = -before.logp_BT
    for name, key_BT in (("surprisal", surprisal_BT), ("delight", adv_BT * surprisal_BT)):
        for i, value in enumerate(_tertile_means(key_BT, delta_BT, mask_BT), start=1):
            out[f"diag/entropy_delta_{name}_t{i}"] = value
    return out


def gradient_diagnostics(spec: MethodSpec, policy: Policy, value_head: ValueHead | None,
                         batch: RolloutBatch, inputs: LearnerInputs, beta: float,
                         dist: SampledDistribution, grad_clip: float,
                         entropy_coef: float | None = None) -> dict[str, torch.Tensor]:
    """Cosine of the method's and the CE oracle's gradients on ``batch`` (policy parameters),
    and the method gradient's norm before and after clipping. Needs the task's targets.
    ``entropy_coef``: the entropy bonus in force (None = the spec's fixed coefficient)."""
    params = [p for p in policy.parameters() if p.requires_grad]
    if spec.needs_batch_statistic:  # the selection of the update's first optimizer step
        inputs, _ = batch_statistic(spec, policy, batch, inputs, slice(0, batch.batch_size),
                                    dist)
    den = Denominators.of(inputs, 0, batch.batch_size, inputs.tokens_BT.shape[1])
    loss = micro_batch_loss(spec, policy, value_head, batch, inputs, den, beta, dist,
                            entropy_coef=entropy_coef).loss
    method_grads = torch.autograd.grad(loss, params, allow_unused=True)
    out: dict[str, torch.Tensor] = {}
    method_flat = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                             for g, p in zip(method_grads, params, strict=True)])
    norm = method_flat.norm()
    out["diag/grad_norm"] = norm
    out["diag/grad_norm_clipped"] = norm.clamp_max(grad_clip) if grad_clip > 0 else norm
    if batch.targets_BT is not None:
        # the oracle's gradient as the `ce` preset computes it: every completion position
        score_BT = torch.ones_like(batch.targets_BT, dtype=inputs.mask_BT.dtype)
        logp_BT = forward_completion(policy, batch, batch.targets_BT,
                                     dist.without_keep()).logp_BT
        ce = -(logp_BT * score_BT).sum() / score_BT.sum().clamp_min(1.0)
        ce_grads = torch.autograd.grad(ce, params, allow_unused=True)
        ce_flat = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                             for g, p in zip(ce_grads, params, strict=True)])
        out["diag/grad_cos_ce_oracle"] = torch.nn.functional.cosine_similarity(
            method_flat, ce_flat, dim=0)
    return {k: v.detach() for k, v in out.items()}
