"""On-policy identities between objectives (STYLE.md rule 8: "an identity").

Gradients are taken w.r.t. the **logits** of a tiny fp64 softmax policy, ℓ = log_softmax(z)[a],
with the behaviour log-probs set to ℓ_μ = sg(ℓ) (on-policy, ρ = 1) and the loss aggregated with
the mask. Results:

* Reduce to REINFORCE (`score`) on-policy, token by token, for any per-token advantage:
  `is_capped` and `traj_is_capped` (weight min(1, cap) = 1), `ppo_clip` (ρ = 1 is inside the
  clip range, d(ρA)/dℓ = A), `cispo` (sg(min(1, ε_max)) = 1), `aspo` (w = 1 for both signs),
  `sapo` (slope (4/τ)·σ'(0)·τ = 1), `r2vpo` (penalty gradient 2λ(ρ − 1)ρ = 0 at ρ = 1) and
  `dro` (penalty gradient β(ℓ − ℓ_μ) = 0 at ℓ = ℓ_μ). Loss *values* differ (sapo: −2A/τ).
* `gspo` does NOT reduce token by token. Its ratio s_i = exp(mean_t m_t(ℓ_t − ℓ_μ,t)) couples the
  tokens of a sequence: d s_i/dℓ_k = s_i·m_k/|y_i|, so under any aggregation whose token weight
  c_i is constant within a sequence (all of METHODS.md's), token k receives
  −c_i·Σ_t m_t A_t/|y_i| = −c_i·Ā_i, the **sequence-mean** advantage, where REINFORCE gives
  −c_i·A_k. Hence gspo = REINFORCE exactly when A is constant per sequence (the GRPO/GSPO
  setting) and = REINFORCE with A replaced by Ā_i otherwise. (The 1/|y_i| of each token's
  individual contribution is undone by the |y_i| tokens that each send it.)
* `traj_is_capped` = `is_capped` on single-token sequences (bandits) also off-policy.
* Not policy-gradient identities, so not tested here: `log_growth` (its 1/π(a) weight on
  successes never reduces to REINFORCE, on-policy or not) and `pmd_mean` (a regression on the
  log-ratio; its on-policy gradient is −2τ(r − E[r|x]) on every token, a REINFORCE gradient with
  advantage 2τ(r − b) only in that special case).
* The TPO family fits a target instead of weighting log-probs: on-policy, d loss/d s_i =
  softmax(s)_i − q_i per group, which is zero when the skill is uniform (tests/test_tpo.py) and
  otherwise not a REINFORCE gradient; `group_pg` is REINFORCE with the sequence weight
  G·skill_i/η and no ratio. The candidate objectives (`tpo_token`, `grpo_token`) act on K
  candidates per prefix, not on the sampled token alone, so they have no REINFORCE counterpart.
"""

from __future__ import annotations

import pytest
import torch

from rlscope.methods.objectives import OBJECTIVES, PolicyTerms
from rlscope.methods.spec import ObjectiveConfig

F64 = torch.float64
TOL = {"atol": 1e-12, "rtol": 1e-10}
B, T, V = 3, 4, 5
MASK_BT = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 1, 1, 0]], dtype=F64)


def _policy(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits_BTV = torch.randn(B, T, V, generator=g, dtype=F64)
    actions_BT = torch.randint(0, V, (B, T), generator=g)
    return logits_BTV, actions_BT


def _token_mean(loss_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    return (loss_BT * mask_BT).sum() / mask_BT.sum()


def _seq_mean_token_mean(loss_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    return ((loss_BT * mask_BT).sum(-1) / mask_BT.sum(-1).clamp_min(1.0)).mean()


AGGS = {"token_mean": _token_mean, "seq_mean_token_mean": _seq_mean_token_mean}


def _grad(name: str, adv_BT: torch.Tensor, agg: str = "token_mean",
          cfg: ObjectiveConfig | None = None, logp_old_BT: torch.Tensor | None = None,
          mask_BT: torch.Tensor = MASK_BT, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(aggregated loss, d loss / d logits); on-policy unless ``logp_old_BT`` is given."""
    logits_BTV, actions_BT = _policy(seed)
    logits_BTV = logits_BTV[:, : mask_BT.shape[1]].clone().requires_grad_()
    actions_BT = actions_BT[:, : mask_BT.shape[1]]
    logp_BT = torch.log_softmax(logits_BTV, -1).gather(-1, actions_BT[..., None])[..., 0]
    old_BT = logp_BT.detach() if logp_old_BT is None else logp_old_BT
    x = PolicyTerms(logp_BT, old_BT, adv_BT, mask_BT)
    loss_BT, _ = OBJECTIVES[name](x, cfg or ObjectiveConfig(name))
    loss = AGGS[agg](loss_BT, mask_BT)
    loss.backward()
    assert logits_BTV.grad is not None
    return loss.detach(), logits_BTV.grad


def _token_adv() -> torch.Tensor:
    return torch.tensor([[1.5, -0.5, 0.25, -2.0], [-1.0, 0.75, 3.0, 3.0],
                         [0.0, 2.0, -1.25, 1.0]], dtype=F64)


def _seq_adv() -> torch.Tensor:
    return torch.tensor([1.5, -0.75, 0.5], dtype=F64)[:, None].expand(B, T).contiguous()


REDUCING = ["is_capped", "traj_is_capped", "ppo_clip", "cispo", "aspo", "sapo", "r2vpo", "dro"]


@pytest.mark.parametrize("agg", list(AGGS))
@pytest.mark.parametrize("name", REDUCING)
def test_on_policy_gradient_equals_reinforce(name: str, agg: str) -> None:
    # Non-default configs so that a parameter that wrongly entered the on-policy gradient shows.
    cfg = ObjectiveConfig(name, clip_low=0.1, clip_high=0.3, cap=3.0, cispo_max=2.0,
                          r2vpo_lambda=2.5, sapo_tau_pos=0.7, sapo_tau_neg=1.6, dro_beta=0.9)
    adv = _token_adv()
    _, g_ref = _grad("score", adv, agg)
    _, g = _grad(name, adv, agg, cfg)
    torch.testing.assert_close(g, g_ref, **TOL)
    assert g_ref.abs().max() > 1e-3  # non-trivial comparison


@pytest.mark.parametrize("agg", list(AGGS))
def test_gspo_on_policy_equals_reinforce_with_sequence_advantage(agg: str) -> None:
    _, g_ref = _grad("score", _seq_adv(), agg)
    _, g = _grad("gspo", _seq_adv(), agg)
    torch.testing.assert_close(g, g_ref, **TOL)


@pytest.mark.parametrize("agg", list(AGGS))
def test_gspo_on_policy_per_token_advantage_gives_sequence_mean_advantage(agg: str) -> None:
    adv = _token_adv()
    adv_mean_B = (adv * MASK_BT).sum(-1) / MASK_BT.sum(-1)
    _, g = _grad("gspo", adv, agg)
    _, g_mean = _grad("score", adv_mean_B[:, None].expand(B, T).contiguous(), agg)
    torch.testing.assert_close(g, g_mean, **TOL)
    _, g_token = _grad("score", adv, agg)
    # Rows 0 and 2 have non-constant valid advantages, so the per-token gradient differs there.
    assert (g - g_token).abs().amax(dim=(1, 2))[[0, 2]].min() > 1e-3


def test_traj_pg_equals_pg_on_bandits_off_policy() -> None:
    # One token per sequence: the sequence ratio is the token ratio, capped alike (ρ from 0.3 to
    # ~22, cap 3 binds on some rows).
    mask = torch.ones(B, 1, dtype=F64)
    adv = torch.tensor([[1.0], [-2.0], [0.5]], dtype=F64)
    logits_BTV, actions_BT = _policy()
    logp_BT = torch.log_softmax(logits_BTV[:, :1], -1).gather(-1, actions_BT[:, :1, None])[..., 0]
    old = logp_BT - torch.tensor([[-1.2], [3.1], [0.8]], dtype=F64)
    cfg = ObjectiveConfig("is_capped", cap=3.0)
    loss_pg, g_pg = _grad("is_capped", adv, cfg=cfg, logp_old_BT=old, mask_BT=mask)
    loss_tr, g_tr = _grad("traj_is_capped", adv, cfg=cfg, logp_old_BT=old, mask_BT=mask)
    torch.testing.assert_close(loss_tr, loss_pg, **TOL)
    torch.testing.assert_close(g_tr, g_pg, **TOL)


def test_traj_pg_differs_from_pg_on_sequences_off_policy() -> None:
    # Sanity: with several tokens the product ratio is not the per-token ratio.
    logits_BTV, actions_BT = _policy()
    logp_BT = torch.log_softmax(logits_BTV, -1).gather(-1, actions_BT[..., None])[..., 0]
    old = logp_BT.detach() + 0.3
    _, g_pg = _grad("is_capped", _token_adv(), logp_old_BT=old)
    _, g_tr = _grad("traj_is_capped", _token_adv(), logp_old_BT=old)
    assert (g_pg - g_tr).abs().max() > 1e-3
