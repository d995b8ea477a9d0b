"""The RLM tree step's update (COMPANIONS.md §4, "Credit propagation (exact)").

1. Per prompt, G trees with root rewards R_1..R_G; A_i = group z-score (``scale_rewards``) or
   group centring of R, 0 for the whole group when its std ≤ 1e-8 (`tree_advantages`).
2. A segment (`TreeSegment`) is the generated tokens of one turn, root or child; prompts and
   observations are its context, never trained. Every segment of tree i gets A_i.
3. Weights: root turn 1/n_root; child j of k with n_j turns 1/(k·n_j) per turn (0 without child
   training); they come with the segments.
4. Segment loss L_s = mean over its tokens of −[min(ρ_t A, clip(ρ_t, 1 ± ε)A) − β·k3_t], k3 to
   the reference, ℓ_μ from a no-grad learner forward before the update (`segment_objective`).
5. Step loss Σ_s w_s L_s / N_trees (`rlscope.methods.aggregation.segment_weighted`), gradients
   accumulated over micro-batches of segments in a seeded shuffled order, one optimizer step
   per inner epoch with the gradient norm clipped (`update_on_segments`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from rlscope.methods.advantages import AdvantageInputs, group_center, group_zscore
from rlscope.methods.aggregation import segment_weighted
from rlscope.methods.configs import AdvantageConfig, ObjectiveConfig
from rlscope.methods.regularizers import kl_estimate
from rlscope.methods.terms import clipped_surrogate, ratio
from rlscope.policy.base import Policy, head_dtype
from rlscope.policy.chunked import chunked_logp_entropy

LOGPROB_CHUNK = 1024
"""Positions per chunk of the head's log-probs (`token_logprobs`)."""


@dataclass(frozen=True)
class TreeSegment:
    """One generated turn of a tree: its context and generated ids, and its credit."""

    tree: int
    """Index of the tree in the step's batch (trees of a prompt are contiguous)."""
    child: int
    """-1 for a root turn, else the child's index in its tree."""
    turn: int
    """Turn index within its root or child rollout."""
    prompt_ids: tuple[int, ...]
    """The conversation before the turn, rendered (context: never trained)."""
    completion_ids: tuple[int, ...]
    """The generated ids (trained)."""
    advantage: float
    """A_i of its tree."""
    weight: float
    """Credit weight w_s."""


@dataclass(frozen=True)
class UpdateOptions:
    """The tree update's constants."""

    clip_low: float = 0.2
    """PPO ε_low: ratios are clipped to [1 − ε_low, 1 + ε_high]."""
    clip_high: float = 0.2
    """PPO ε_high."""
    kl_coef: float = 0.01
    """β of the k3 penalty to the reference."""
    micro_batch_size: int = 1
    """Segments per forward/backward."""
    inner_epochs: int = 1
    """Optimizer steps on the same segments (one per pass)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 = off)."""


def tree_advantages(rewards_B: torch.Tensor, group_size: int, scale_rewards: bool
                    ) -> torch.Tensor:
    """A_i of each tree ``[B]``: group z-score (``scale_rewards``) or group centring of the
    root rewards over contiguous groups of ``group_size`` trees; 0 for a group of std ≤ 1e-8
    (`rlscope.methods.advantages.group_zscore`, `group_center`)."""
    x = AdvantageInputs(rewards_B=rewards_B, mask_BT=torch.ones_like(rewards_B)[:, None],
                        group_size=group_size)
    if scale_rewards:
        return group_zscore(x, AdvantageConfig("group_zscore"))[:, 0]
    r_GK = rewards_B.view(-1, group_size)
    flat_G1 = r_GK.std(-1, unbiased=False, keepdim=True) <= 1e-8
    centred_GK = group_center(x, AdvantageConfig("group_center"))[:, 0].view(-1, group_size)
    return torch.where(flat_G1, torch.zeros_like(centred_GK), centred_GK).reshape(-1)


def segment_tensors(segments: Sequence[TreeSegment], pad_id: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``tokens_BL`` (context + generated ids, right-padded) and ``mask_BT`` ``[B, L − 1]``:
    1 where position t + 1 holds a generated token (the log-prob of token t + 1 is read at
    position t). Right padding is harmless in a causal model: no real token attends to it."""
    L = max(len(s.prompt_ids) + len(s.completion_ids) for s in segments)
    tokens_BL = torch.full((len(segments), L), pad_id, dtype=torch.long)
    mask_BL = torch.zeros(len(segments), L)
    for row, s in enumerate(segments):
        P, C = len(s.prompt_ids), len(s.completion_ids)
        tokens_BL[row, :P + C] = torch.tensor(s.prompt_ids + s.completion_ids)
        mask_BL[row, P:P + C] = 1.0
    return tokens_BL, mask_BL[:, 1:]


def token_logprobs(policy: Policy | nn.Module, tokens_BL: torch.Tensor,
                   mask_BT: torch.Tensor | None = None) -> torch.Tensor:
    """ℓ_t = log π(token t + 1 | tokens ≤ t) at temperature 1, ``[B, L − 1]``.

    With ``mask_BT`` and a policy that exposes its final hidden states and a plain linear
    head (`rlscope.policy.hf.HFPolicy`), only the masked positions are computed, `LOGPROB_CHUNK`
    at a time (`rlscope.policy.chunked.chunked_logp_entropy`), the others 0: a long context
    never materialises its [L, V] logits (8k positions × a 152k vocabulary are 5 GB)."""
    final_hidden = getattr(policy, "final_hidden", None)
    output_head = getattr(policy, "output_head", None)
    head = output_head() if mask_BT is not None and callable(output_head) else None
    if head is None or mask_BT is None or final_hidden is None:
        logits_BLV, _ = policy(tokens_BL)  # type: ignore[operator]
        logits_BTV = logits_BLV[:, :-1]
        logp_BTV = torch.log_softmax(
            logits_BTV.to(torch.promote_types(logits_BTV.dtype, torch.float32)), dim=-1)
        return logp_BTV.gather(-1, tokens_BL[:, 1:, None]).squeeze(-1)
    keep_BT = mask_BT > 0
    hidden_ND = final_hidden(tokens_BL)[:, :-1][keep_BT]
    W_VD, bias_V = head
    logp_N, _ = chunked_logp_entropy(hidden_ND, W_VD, bias_V, tokens_BL[:, 1:][keep_BT],
                                     1.0, LOGPROB_CHUNK, head_dtype(policy))
    return torch.zeros(keep_BT.shape, dtype=logp_N.dtype, device=logp_N.device
                       ).masked_scatter(keep_BT, logp_N)


def segment_objective(logp_BT: torch.Tensor, logp_old_BT: torch.Tensor,
                      logp_ref_BT: torch.Tensor, adv_B: torch.Tensor, clip_low: float,
                      clip_high: float, kl_coef: float
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss −[min(ρ_t A, clip(ρ_t, 1 − ε_low, 1 + ε_high)A) − β·k3_t] ``[B, T]`` with
    ρ_t = exp(ℓ_t − ℓ_μ,t), k3_t = exp(ℓ_ref − ℓ) − (ℓ_ref − ℓ) − 1 (Schulman 2020), A the
    segment's advantage broadcast over its tokens; and per-token stats ``ratio``, ``kl_ref_k3``,
    ``clipfrac_region`` (PPO: Schulman et al. 1707.06347; GRPO's k3 penalty: 2402.03300)."""
    rho_BT = ratio(logp_BT, logp_old_BT)
    adv_BT = adv_B[:, None].expand_as(logp_BT)
    surrogate_BT, clip_stats = clipped_surrogate(rho_BT, adv_BT, ObjectiveConfig(
        "ppo_clip", clip_low=clip_low, clip_high=clip_high))
    k3_BT = kl_estimate(logp_BT, logp_ref_BT, "k3")
    return surrogate_BT + kl_coef * k3_BT, {
        "ratio": rho_BT.detach(), "kl_ref_k3": k3_BT.detach(),
        "clipfrac_region": clip_stats["clipfrac_region"]}


def _chunks(order: Sequence[int], size: int) -> list[list[int]]:
    return [list(order[i:i + size]) for i in range(0, len(order), size)]


@torch.no_grad()
def _no_grad_logprobs(model: Policy | nn.Module, segments: Sequence[TreeSegment],
                      micro_batch_size: int) -> list[torch.Tensor]:
    """Each segment's ``[L − 1]`` log-probs under ``model`` (no grad), in micro-batches."""
    out: list[torch.Tensor] = []
    for rows in _chunks(range(len(segments)), micro_batch_size):
        chunk = [segments[i] for i in rows]
        tokens_BL, mask_BT = segment_tensors(chunk)
        device = _device(model)
        logp_BT = token_logprobs(model, tokens_BL.to(device), mask_BT.to(device))
        out += [logp_BT[row, :len(s.prompt_ids) + len(s.completion_ids) - 1]
                for row, s in enumerate(chunk)]
    return out


def _device(model: Policy | nn.Module) -> torch.device:
    for p in model.parameters():  # type: ignore[union-attr]
        return p.device
    return torch.device("cpu")


def _padded(rows: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=rows[0].dtype, device=rows[0].device)
    for i, row in enumerate(rows):
        out[i, :row.shape[0]] = row
    return out


def update_on_segments(policy: Policy | nn.Module, reference: Policy | nn.Module,
                       optimizer: torch.optim.Optimizer, params: Sequence[nn.Parameter],
                       segments: Sequence[TreeSegment], n_trees: int, opts: UpdateOptions,
                       order_generator: torch.Generator) -> dict[str, float]:
    """Update ``policy`` on the segments of ``n_trees`` trees (module docstring, steps 4–5).

    Segments of weight 0 contribute nothing and are not run. Metrics (token means over the
    trained segments' tokens on the first pass, before any update; ``loss/total`` the step loss
    of the first pass): ``loss/total``, ``rlm/segment_loss_mean`` (mean of L_s over the
    trained segments), ``policy/ratio_mean``, ``policy/kl_ref_k3``, ``policy/clipfrac_region``,
    ``optim/grad_norm`` (before clipping, last pass).
    """
    trained = [s for s in segments if s.weight != 0.0]
    if not trained:
        return {"loss/total": 0.0, "rlm/segment_loss_mean": 0.0, "policy/ratio_mean": 1.0,
                "policy/kl_ref_k3": 0.0, "policy/clipfrac_region": 0.0, "optim/grad_norm": 0.0}
    device = _device(policy)
    module = cast(nn.Module, policy)
    training = module.training
    module.eval()  # ℓ_μ and ℓ_ref without dropout (LoRA's, when --lora_dropout > 0)
    logp_old = _no_grad_logprobs(policy, trained, opts.micro_batch_size)
    logp_ref = _no_grad_logprobs(reference, trained, opts.micro_batch_size)
    module.train()
    sums = {"loss": 0.0, "segment_loss": 0.0, "ratio": 0.0, "kl_ref_k3": 0.0,
            "clipfrac_region": 0.0, "tokens": 0.0}
    grad_norm = torch.zeros(())
    for epoch in range(opts.inner_epochs):
        order = torch.randperm(len(trained), generator=order_generator).tolist()
        optimizer.zero_grad(set_to_none=True)
        for rows in _chunks(order, opts.micro_batch_size):
            chunk = [trained[i] for i in rows]
            tokens_BL, mask_BT = segment_tensors(chunk)
            tokens_BL, mask_BT = tokens_BL.to(device), mask_BT.to(device)
            logp_BT = token_logprobs(policy, tokens_BL, mask_BT)
            width = logp_BT.shape[1]
            loss_BT, stats = segment_objective(
                logp_BT, _padded([logp_old[i] for i in rows], width),
                _padded([logp_ref[i] for i in rows], width),
                torch.tensor([s.advantage for s in chunk], device=device, dtype=logp_BT.dtype),
                opts.clip_low, opts.clip_high, opts.kl_coef)
            weight_B = torch.tensor([s.weight for s in chunk], device=device,
                                    dtype=logp_BT.dtype)
            loss = segment_weighted(loss_BT, mask_BT, weight_B, n_trees)
            loss.backward()
            if epoch == 0:
                masked_BT = loss_BT.detach() * mask_BT
                sums["loss"] += float(loss.detach())
                sums["segment_loss"] += float(
                    (masked_BT.sum(-1) / mask_BT.sum(-1).clamp_min(1.0)).sum())
                sums["tokens"] += float(mask_BT.sum())
                for name in ("ratio", "kl_ref_k3", "clipfrac_region"):
                    sums[name] += float((stats[name] * mask_BT).sum())
        grad_norm = torch.nn.utils.clip_grad_norm_(
            list(params), opts.grad_clip if opts.grad_clip > 0 else float("inf"))
        optimizer.step()
    module.train(training)
    tokens = max(sums["tokens"], 1.0)
    return {"loss/total": sums["loss"], "rlm/segment_loss_mean": sums["segment_loss"]
            / len(trained), "policy/ratio_mean": sums["ratio"] / tokens,
            "policy/kl_ref_k3": sums["kl_ref_k3"] / tokens,
            "policy/clipfrac_region": sums["clipfrac_region"] / tokens,
            "optim/grad_norm": float(grad_norm)}
