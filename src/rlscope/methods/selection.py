"""Sample selection and length handling before the update (METHODS.md, "Selection").

- `mixed_groups` (dynamic sampling, DAPO arXiv:2503.14476): keep only groups whose reward std
  is above 1e-6. If no group survives, keep everything and report a fallback.
  `fill_mixed_groups` resamples until the kept groups fill the batch (capped generation rounds).
- `kondo`: keep each sample with probability σ((χ − λ)/η), χ its delight under the behaviour
  policy and λ solved so the mean probability is the keep ratio (`kondo_select`).
- overlong handling (DAPO): `overlong_mask` drops rows truncated at the length limit from the
  loss; `overlong_penalty_B` is the soft length penalty added to their rewards.

`SELECTIONS` and `OVERLONG` are the registries: each selection is called as
``SELECTIONS[name](batch, SelectionInputs) -> (keep_B or None, metrics)``; an overlong record
says whether it shapes rewards (`overlong_shaped`) or masks rows (`overlong_mask`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlscope.batch import RolloutBatch, concat_rollouts
from rlscope.methods.component import Component
from rlscope.methods.configs import OverlongConfig

MIXED_STD = 1e-6
KONDO_BISECTION_STEPS = 20
KONDO_SEED_OFFSET = 3_000_017


def mixed_groups_G(rewards_B: torch.Tensor, group_size: int) -> torch.Tensor:
    """Groups (contiguous rows) whose reward population std is above 1e-6, ``[G]`` bool."""
    return rewards_B.view(-1, group_size).std(-1, unbiased=False) > MIXED_STD


def mixed_groups(rewards_B: torch.Tensor, group_size: int
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Rows to keep, ``keep_B`` (bool), and ``group/`` metrics as 0-d tensors.

    ``mixed_rate``: fraction of groups with reward std > 1e-6 (before filtering);
    ``retained_rate``: fraction of rows kept; ``fallback``: 1 when no group was mixed and every
    row was kept.
    """
    mixed_G = mixed_groups_G(rewards_B, group_size)
    fallback = ~mixed_G.any()
    keep_G = mixed_G | fallback
    keep_B = keep_G.repeat_interleave(group_size)
    return keep_B, {
        "group/mixed_rate": mixed_G.float().mean(),
        "group/retained_rate": keep_B.float().mean(),
        "group/fallback": fallback.float(),
    }


def fill_mixed_groups(first: RolloutBatch, sample_more: Callable[[], RolloutBatch], rows: int,
                      group_size: int, max_rounds: int) -> tuple[RolloutBatch, int]:
    """DAPO's dynamic sampling: keep mixed groups and sample more until ``rows`` are filled.

    Returns ``(batch, rounds)``. ``batch`` holds exactly ``rows`` rows of mixed groups, in the
    order they were drawn; when the first round has no mixed group at all it is returned as is
    (the caller's fallback and out-of-regime rules apply). Raises RuntimeError, saying what to
    change, when ``max_rounds`` generation rounds cannot fill the batch.
    """
    def mixed_rows(batch: RolloutBatch) -> torch.Tensor:
        assert batch.rewards_B is not None
        return mixed_groups_G(batch.rewards_B, group_size).repeat_interleave(group_size)

    keep_B = mixed_rows(first)
    if not bool(keep_B.any()):
        return first, 1
    kept = [first.select(keep_B)]
    n_kept, rounds = kept[0].batch_size, 1
    while n_kept < rows and rounds < max_rounds:
        more = sample_more()
        rounds += 1
        keep_B = mixed_rows(more)
        kept.append(more.select(keep_B))
        n_kept += kept[-1].batch_size
    if n_kept < rows:
        raise RuntimeError(
            f"mixed-group resampling could not fill the batch: {n_kept} of {rows} rows after "
            f"{rounds} generation rounds; raise --max_fill_rounds, use a larger --group_size, "
            "or turn --fill_batch off")
    index_B = torch.arange(rows, device=first.completion_tokens_BT.device)
    return concat_rollouts(kept).select(index_B), rounds


def step_generator(seed: int, step: int, offset: int) -> torch.Generator:
    """A CPU generator for the draws of step ``step`` of run ``seed`` in the stream ``offset``:
    apart from the prompt and sampling stream (so it never perturbs rollouts) and needing no
    checkpoint state (a resumed run redraws the same numbers)."""
    # CPU generators keep only the low 32 bits of a seed: mix within them
    return torch.Generator().manual_seed((offset + seed * 1_000_003 + step) % 2**32)


def kondo_delight_B(rewards_B: torch.Tensor, logp_sampler_BT: torch.Tensor,
                    mask_BT: torch.Tensor, baseline_BT: torch.Tensor) -> torch.Tensor:
    """Per-sample delight under the behaviour policy, ``χ_B = max_t (r − b_t)·(−ℓ_μ,t)`` over the
    valid tokens (``mask_BT`` = 1).

    Shapes: ``rewards_B`` [B]; ``logp_sampler_BT``, ``mask_BT`` and ``baseline_BT`` [B, T]
    (a sequence baseline broadcast over tokens, or a per-token one). Every row needs a valid
    token (a sampled completion always has its first one).
    """
    delight_BT = (rewards_B[:, None] - baseline_BT) * (-logp_sampler_BT)
    return delight_BT.masked_fill(mask_BT == 0, float("-inf")).max(-1).values


def kondo_threshold(chi_B: torch.Tensor, keep_ratio: float, eta: float) -> torch.Tensor:
    """λ with mean_i σ((χ_i − λ)/η) = ``keep_ratio``, by exactly 20 bisection steps (0-d).

    The mean is decreasing in λ, and the bracket [min χ − η·logit(ρ), max χ − η·logit(ρ)]
    holds the root: at its ends every term is ≥ ρ, respectively ≤ ρ. λ is the midpoint of the
    last interval, so it is within (max χ − min χ)·2⁻²¹ of the root. Needs 0 < ρ < 1 and
    finite χ.
    """
    if not 0 < keep_ratio < 1:
        raise ValueError(f"kondo_threshold needs 0 < keep_ratio < 1, got {keep_ratio}")
    shift = eta * torch.logit(torch.tensor(keep_ratio, dtype=chi_B.dtype, device=chi_B.device))
    lo, hi = chi_B.min() - shift, chi_B.max() - shift
    for _ in range(KONDO_BISECTION_STEPS):
        mid = (lo + hi) / 2
        above = torch.sigmoid((chi_B - mid) / eta).mean() > keep_ratio
        lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
    return (lo + hi) / 2


def kondo_select(batch: RolloutBatch, keep_ratio: float, eta: float,
                 generator: torch.Generator) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Kondo screening: rows to keep, ``keep_B`` (bool), and ``select/`` metrics.

    χ = max over valid tokens of (r − b)·(−ℓ_μ) with ℓ_μ the stored behaviour log-probs and
    b the behaviour policy's baseline: E[r | x] (``expected_reward_B``) where the batch has it,
    else the per-token Σ_v μ(v | prefix)² recorded by the sampler (``sum_p2_sampler_BT``) at
    every valid position, as in the ``expected`` estimator. Each row is kept with
    probability p = σ((χ − λ)/η), λ from `kondo_threshold`, by one uniform draw from
    ``generator``; if no row is kept, the most probable one is. ``keep_ratio`` = 1 keeps every
    row and draws nothing (the method is then exactly its gate's, e.g. DG). Reads no learner.

    Source: the delight-gradient sandbox (Kondo screening of DG). Regime: ungrouped batches
    (it drops single samples); η > 0, 0 < keep_ratio ≤ 1.
    """
    assert batch.rewards_B is not None
    B, device = batch.batch_size, batch.rewards_B.device
    if keep_ratio >= 1.0:
        one = torch.ones((), device=device)
        return torch.ones(B, dtype=torch.bool, device=device), {
            "select/kept_frac": one, "select/gate_prob_mean": one}
    mask_BT = batch.completion_mask_BT
    if batch.expected_reward_B is not None:
        baseline_BT = batch.expected_reward_B[:, None].expand_as(mask_BT)
    elif batch.sum_p2_sampler_BT is not None:
        baseline_BT = batch.sum_p2_sampler_BT
    else:
        raise ValueError("kondo selection needs expected_reward_B or sum_p2_sampler_BT "
                         "(sample with with_sum_p2=True)")
    chi_B = kondo_delight_B(batch.rewards_B, batch.logp_sampler_BT, mask_BT, baseline_BT)
    lam = kondo_threshold(chi_B, keep_ratio, eta)
    prob_B = torch.sigmoid((chi_B - lam) / eta)
    keep_B = torch.rand(B, generator=generator).to(device) < prob_B
    fallback_B = torch.zeros_like(keep_B).scatter(0, prob_B.argmax().view(1), True)
    keep_B = torch.where(keep_B.any(), keep_B, fallback_B)
    return keep_B, {"select/kept_frac": keep_B.float().mean(),
                    "select/gate_prob_mean": prob_B.mean()}


def overlong_buffer(cfg: OverlongConfig, max_len: int) -> int:
    """L_buf in tokens: ``cfg.buffer``, or max(1, L_max // 4) when it is 0."""
    return cfg.buffer if cfg.buffer > 0 else max(1, max_len // 4)


def overlong_penalty_B(length_B: torch.Tensor, max_len: int, cfg: OverlongConfig
                       ) -> torch.Tensor:
    """DAPO's soft overlong penalty min(−(|y| − (L_max − L_buf))/L_buf · factor, 0), ``[B]``.

    0 up to L_max − L_buf tokens, then falling linearly to −factor at L_max. Source: Yu et al.
    arXiv:2503.14476 (overlong reward shaping). Regime: completions that can end early.
    """
    buf = overlong_buffer(cfg, max_len)
    return (-(length_B - (max_len - buf)) / buf * cfg.factor).clamp_max(0.0)


def overlong_shaped(batch: RolloutBatch, max_len: int, cfg: OverlongConfig) -> RolloutBatch:
    """``batch`` with `overlong_penalty_B` of its lengths added to ``rewards_B``
    (``raw_rewards_B`` stays unshaped)."""
    assert batch.rewards_B is not None
    penalty_B = overlong_penalty_B(batch.completion_mask_BT.sum(-1), max_len, cfg)
    return dataclasses.replace(batch, rewards_B=batch.rewards_B + penalty_B.to(
        batch.rewards_B.dtype))


def truncated_B(batch: RolloutBatch, max_len: int) -> torch.Tensor:
    """Rows that hit ``max_len`` tokens without a stop token (finish reason ``length``)."""
    return ~batch.finished_by_stop_B.bool() & (batch.completion_mask_BT.sum(-1) >= max_len)


def overlong_mask(batch: RolloutBatch, max_len: int
                  ) -> tuple[RolloutBatch, dict[str, torch.Tensor]]:
    """DAPO's overlong filtering: zero the loss mask of truncated rows (`truncated_B`).

    The rows stay in the batch (group baselines still see their rewards) but contribute no
    token to the loss or its token-mean denominator. Logs ``select/overlong_masked_frac``.
    Source: Yu et al. arXiv:2503.14476. Regime: completions that can end early.
    """
    cut_B = truncated_B(batch, max_len)
    mask_BT = batch.completion_mask_BT * (~cut_B)[:, None].to(batch.completion_mask_BT.dtype)
    return (dataclasses.replace(batch, completion_mask_BT=mask_BT),
            {"select/overlong_masked_frac": cut_B.float().mean()})


@dataclass(frozen=True)
class SelectionInputs:
    """What a selection may read besides the batch: the group size, Kondo's keep ratio and η
    (the delight gate's), and the run seed and loop step its draws derive from."""

    group_size: int
    keep_ratio: float
    eta: float
    seed: int
    step: int


SelectionOut = tuple[torch.Tensor | None, dict[str, torch.Tensor]]
"""Rows to keep, ``keep_B`` (bool; None keeps the batch as it is), and metrics."""


def keep_all(batch: RolloutBatch, x: SelectionInputs) -> SelectionOut:
    """No selection: every row is trained on."""
    return None, {}


def select_mixed_groups(batch: RolloutBatch, x: SelectionInputs) -> SelectionOut:
    """`mixed_groups` on the batch's rewards."""
    assert batch.rewards_B is not None
    return mixed_groups(batch.rewards_B, x.group_size)


def select_kondo(batch: RolloutBatch, x: SelectionInputs) -> SelectionOut:
    """`kondo_select` with the step's own generator (`step_generator`)."""
    return kondo_select(batch, x.keep_ratio, x.eta,
                        step_generator(x.seed, x.step, KONDO_SEED_OFFSET))


SELECTIONS: dict[str, Component[[RolloutBatch, SelectionInputs], SelectionOut]] = {
    "none": Component(keep_all, identity=True),
    "mixed_groups": Component(select_mixed_groups, grouped=True, drops_groups=True),
    "kondo": Component(select_kondo, ("keep_ratio",), ungrouped=True,
                       behaviour_sum_p2=True),
}


def no_overlong(batch: RolloutBatch, max_len: int) -> RolloutBatch:
    """No overlong handling: the batch as it is."""
    return batch


OVERLONG: dict[str, Component[..., object]] = {
    "none": Component(no_overlong, identity=True),
    "mask": Component(overlong_mask, masks_rows=True),
    "penalty": Component(overlong_shaped, ("buffer", "factor"), shapes_reward=True),
}
"""Overlong handling. The loop reads the flags: ``shapes_reward`` adds `overlong_penalty_B` to
the rewards (`overlong_shaped`), ``masks_rows`` drops truncated rows (`overlong_mask`)."""


def select_rows(batch: RolloutBatch, selection: str, overlong: OverlongConfig, max_len: int,
                x: SelectionInputs) -> tuple[RolloutBatch, dict[str, torch.Tensor], bool]:
    """The loop's select stage (METHODS.md, "Selection"): the `SELECTIONS` entry named
    ``selection`` (mixed groups, Kondo screening or none), then the overlong mask where the
    `OVERLONG` entry masks rows. Returns the kept rows, their metrics, and whether mixed-group
    selection fell back to keeping every row (``group/fallback``)."""
    keep_B, m = SELECTIONS[selection](batch, x)
    fallback = bool(m["group/fallback"]) if "group/fallback" in m else False
    if keep_B is not None:
        batch = batch.select(keep_B)
    if OVERLONG[overlong.name].masks_rows:
        batch, overlong_m = overlong_mask(batch, max_len)
        m |= overlong_m
    return batch, m, fallback


def top_up_mixed_groups(first: RolloutBatch, sample_more: Callable[[], RolloutBatch],
                        group_size: int, min_valid: float, max_rounds: int,
                        min_std: float = 1e-8) -> tuple[RolloutBatch, int]:
    """GPG's optional resampling (Chu et al. arXiv:2504.02546; AMAP-ML/GPG): while fewer than
    ``min_valid`` of the rows are in mixed groups (reward std > ``min_std``), draw another
    round and swap the first flat groups of the batch for mixed groups of that round, keeping
    the batch size and the order of the groups that stay. Stops after ``max_rounds``
    generation rounds in all, whatever the fraction (the advantage's α then rescales).
    Returns ``(batch, rounds)``."""
    def mixed_G(batch: RolloutBatch) -> torch.Tensor:
        assert batch.rewards_B is not None
        return batch.rewards_B.view(-1, group_size).std(-1, unbiased=False) > min_std

    batch, rounds = first, 1
    while float(mixed_G(batch).float().mean()) < min_valid and rounds < max_rounds:
        more = sample_more()
        rounds += 1
        flat_G, new_G = ~mixed_G(batch), mixed_G(more)
        n = min(int(flat_G.sum()), int(new_G.sum()))
        if n == 0:
            continue
        drop_G = flat_G & (flat_G.cumsum(0) <= n)
        take_G = new_G & (new_G.cumsum(0) <= n)
        batch = concat_rollouts([batch.select((~drop_G).repeat_interleave(group_size)),
                                 more.select(take_G.repeat_interleave(group_size))])
    return batch, rounds
