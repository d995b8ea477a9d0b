"""Identities that must hold across components and through the real update loop.

- On-policy, PPO-clip (any ε, with or without dual clip) and the capped-IS objective have the
  REINFORCE gradient; DG with η → ∞ is half of it.
- Presets are data: Dr. GRPO is GRPO with another advantage and aggregation.
- Gradient accumulation never changes the update (METHODS.md, "Training protocol"), checked at
  the unit level with ragged masks for every aggregation, and end to end through `train()`.
- Validation rejects configurations outside a method's regime with a message that says why.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from rlscope.batch import RolloutBatch
from rlscope.config import ConfigError, OptimConfig, RunConfig, TrainConfig, validate
from rlscope.learner import Denominators, LearnerInputs, forward_completion, micro_batch_loss
from rlscope.methods import (
    METHODS,
    MethodConfig,
    MethodSpec,
    canonical_method_name,
    resolve_method,
    validate_method,
)
from rlscope.methods.aggregation import AGGREGATIONS, aggregate, group_token_counts
from rlscope.methods.gates import GATES, GateInputs
from rlscope.methods.objectives import OBJECTIVES, PolicyTerms
from rlscope.methods.spec import (
    AdvantageConfig,
    GateConfig,
    KLConfig,
    ObjectiveConfig,
    ValueConfig,
)
from rlscope.policy import ModelConfig, TinyConfig, TinyTransformer, ValueHead
from rlscope.sampling import SamplingConfig
from rlscope.sampling.processors import SampledDistribution
from rlscope.tasks import TaskConfig
from rlscope.train import train

F64 = torch.float64


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Any:
    """Tiny models run fastest on one thread, and a loaded 2-core machine oversubscribes."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


MASK_3x4 = torch.tensor([[1.0, 1.0, 1.0, 1.0],
                         [1.0, 1.0, 0.0, 0.0],
                         [1.0, 1.0, 1.0, 0.0]], dtype=F64)


# --------------------------------------------------------------------------- on-policy


def _logit_grad(objective: str, cfg: ObjectiveConfig, gate: GateConfig, agg: str,
                seed: int = 0) -> torch.Tensor:
    """d loss / d logits of one objective on a fixed 3×4×5 batch, on-policy (ℓ_μ = sg(ℓ))."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 4, 5, generator=g, dtype=F64).requires_grad_()
    tokens = torch.randint(0, 5, (3, 4), generator=g)
    adv = torch.randn(3, 4, generator=g, dtype=F64) * MASK_3x4
    logp = logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
    weight, _ = GATES[gate.name](GateInputs(adv, logp.detach()), gate)
    loss_BT, _ = OBJECTIVES[objective](PolicyTerms(logp, logp.detach(), weight, MASK_3x4), cfg)
    aggregate(loss_BT, MASK_3x4, agg, float(MASK_3x4.sum()), 3.0, 4).backward()
    assert logits.grad is not None
    return logits.grad


NO_GATE = GateConfig("none")


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
@pytest.mark.parametrize(("eps_low", "eps_high", "dual"),
                         [(0.2, 0.2, 0.0), (0.2, 0.28, 0.0), (0.0, 0.0, 0.0), (0.5, 1.0, 3.0),
                          (0.1, 0.1, 1.5)])
def test_on_policy_ppo_clip_gradient_equals_reinforce(eps_low: float, eps_high: float,
                                                      dual: float, agg: str) -> None:
    ppo = ObjectiveConfig("ppo_clip", clip_low=eps_low, clip_high=eps_high, dual_clip=dual)
    grad_ppo = _logit_grad("ppo_clip", ppo, NO_GATE, agg)
    grad_pg = _logit_grad("score", ObjectiveConfig("score"), NO_GATE, agg)
    assert float(grad_pg.abs().max()) > 1e-3
    torch.testing.assert_close(grad_ppo, grad_pg, atol=1e-15, rtol=1e-13)


@pytest.mark.parametrize("cap", [10.0, 1.0, 0.5])
def test_on_policy_is_capped_gradient_equals_reinforce(cap: float) -> None:
    # ρ = 1 on-policy, so min(ρ, cap) = 1 whenever cap ≥ 1; a cap of 0.5 halves the gradient.
    grad_is = _logit_grad("is_capped", ObjectiveConfig("is_capped", cap=cap), NO_GATE,
                          "token_mean")
    grad_pg = _logit_grad("score", ObjectiveConfig("score"), NO_GATE, "token_mean")
    torch.testing.assert_close(grad_is, grad_pg * min(1.0, cap), atol=1e-15, rtol=1e-13)


def test_delight_with_huge_eta_is_half_reinforce() -> None:
    # g = σ(A·(−ℓ)/η) → σ(0) = 1/2 as η → ∞; at η = 1e12, |g − 1/2| ≲ |A·ℓ|/4e12.
    grad_dg = _logit_grad("score", ObjectiveConfig("score"), GateConfig("delight", eta=1e12),
                          "token_mean")
    grad_pg = _logit_grad("score", ObjectiveConfig("score"), NO_GATE, "token_mean")
    torch.testing.assert_close(grad_dg, 0.5 * grad_pg, atol=1e-15, rtol=1e-10)
    # η = 1 is different (the gate is not constant).
    grad_dg1 = _logit_grad("score", ObjectiveConfig("score"), GateConfig("delight", eta=1.0),
                           "token_mean")
    assert float((grad_dg1 - 0.5 * grad_pg).abs().max()) > 1e-4


# --------------------------------------------------------------------------- presets


def test_dr_grpo_differs_from_grpo_only_in_advantage_and_agg() -> None:
    grpo, dr = resolve_method("grpo"), resolve_method("dr_grpo")
    differing = {f.name for f in dataclasses.fields(MethodSpec)
                 if getattr(grpo, f.name) != getattr(dr, f.name)}
    assert differing - {"description", "source", "regime"} == {"advantage", "agg"}
    assert dataclasses.replace(grpo.advantage, name="group_center") == dr.advantage
    assert (grpo.advantage.name, grpo.agg) == ("group_zscore", "token_mean")
    assert (dr.advantage.name, dr.agg) == ("group_center", "seq_mean_token_sum")
    # The ablation through overrides gives the preset back (up to its docs).
    ablation = resolve_method("grpo", MethodConfig(advantage="group_center",
                                                   agg="seq_mean_token_sum"))
    assert dataclasses.replace(ablation, description=dr.description, source=dr.source,
                               regime=dr.regime) == dr


def test_canonical_names_are_case_insensitive_with_camelcase_aliases() -> None:
    assert canonical_method_name("DrGRPO") == "dr_grpo"
    assert canonical_method_name("dr-grpo") == "dr_grpo"
    assert canonical_method_name("GRPO") == "grpo"
    assert canonical_method_name("Reinforce") == "reinforce"
    assert resolve_method("DrGRPO") is METHODS["dr_grpo"]
    for name in METHODS:
        assert canonical_method_name(name.upper()) == name


# --------------------------------------------------------------------------- validation


def _cfg(method: str = "grpo", components: MethodConfig | None = None,
         **run: Any) -> TrainConfig:
    return TrainConfig(method=method, components=components or MethodConfig(),
                       run=RunConfig(**{"batch_size": 8, **run}),
                       task_options=TaskConfig(seq_len=4, eval_batches=1, eval_batch_size=4))


def test_validate_accepts_the_presets() -> None:
    """Presets without run requirements validate on the default task as they are (the others
    are checked in their regime in tests/test_train.py; the teacher presets need
    --teacher_path: tests/test_opd.py, tests/test_gkd.py)."""
    for name in (m for m in METHODS if not METHODS[m].requires
                 and not METHODS[m].needs_teacher):
        spec, _, derived = validate(_cfg(name))
        assert spec == METHODS[name]
        assert derived.group_size == (8 if spec.grouped else 1)


def test_validate_rejects_grouped_method_with_group_size_1() -> None:
    with pytest.raises(ConfigError, match=r"run.group_size=1: .*group_size must be > 1"):
        validate(_cfg("grpo", group_size=1))
    # A grouped advantage on an ungrouped preset is caught too.
    with pytest.raises(ConfigError, match="group_size must be > 1"):
        validate(_cfg("reinforce", MethodConfig(advantage="rloo")))


def test_validate_rejects_batch_not_divisible_by_group() -> None:
    with pytest.raises(ConfigError,
                       match=r"run.batch_size=8 is not divisible by run.group_size=3"):
        validate(_cfg("grpo", group_size=3))


def test_validate_rejects_unknown_method_listing_valid_names() -> None:
    with pytest.raises(ConfigError, match="unknown method 'fancy_po'; valid methods: ") as e:
        validate(_cfg("fancy_po"))
    for name in METHODS:
        assert name in str(e.value)
    with pytest.raises(ValueError, match=r"valid methods: .*dr_grpo"):
        canonical_method_name("nope")


def test_validate_rejects_negative_clip_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"method.clip_low=-0.1 must be >= 0"):
        validate(_cfg("grpo", MethodConfig(clip_low=-0.1)))
    with pytest.raises(ConfigError, match=r"method.clip_high=-0.2 must be >= 0"):
        validate(_cfg("grpo", MethodConfig(clip_high=-0.2)))


@pytest.mark.parametrize("eta", [0.0, -1.0])
def test_validate_rejects_nonpositive_eta(eta: float) -> None:
    with pytest.raises(ConfigError, match=rf"method.eta={eta} must be > 0"):
        validate(_cfg("dg", MethodConfig(eta=eta)))


def test_validate_method_lists_every_problem() -> None:
    spec = resolve_method("grpo", MethodConfig(clip_low=-1.0, eta=0.0, is_cap=0.0,
                                               kl_coef=-0.1, dual_clip=0.5))
    errors = validate_method(spec, group_size=1, batch_size=8)
    joined = "\n".join(errors)
    for fragment in ("group_size must be > 1", "clip_low", "eta", "is_cap", "kl_coef",
                     "dual_clip=0.5 must be > 1"):
        assert fragment in joined
    assert validate_method(METHODS["grpo"], group_size=8, batch_size=96) == []


# --------------------------------------------------------------------------- GA, unit level

B, P, T, V = 5, 3, 4, 5
LENGTHS = (4, 2, 3, 1, 4)


def _ragged_mask() -> torch.Tensor:
    return torch.tensor([[1.0] * n + [0.0] * (T - n) for n in LENGTHS], dtype=F64)


def _setup(agg: str) -> tuple[MethodSpec, TinyTransformer, ValueHead, RolloutBatch,
                              LearnerInputs]:
    """A hand-made ragged batch, off-policy enough that the PPO and dual clips bind."""
    torch.manual_seed(0)
    policy = TinyTransformer(TinyConfig(vocab_size=V, max_len=P + T)).to(F64).train()
    ref = TinyTransformer(TinyConfig(vocab_size=V, max_len=P + T)).to(F64).eval()
    value_head = ValueHead(policy.hidden_size).to(F64)
    torch.nn.init.normal_(value_head.linear.weight, std=0.1)
    g = torch.Generator().manual_seed(1)
    mask = _ragged_mask()
    completion = torch.randint(0, V, (B, T), generator=g)
    batch = RolloutBatch(
        prompt_tokens_BP=torch.randint(0, V, (B, P), generator=g), prompt_mask_BP=None,
        completion_tokens_BT=completion, completion_mask_BT=mask,
        logp_sampler_BT=torch.zeros(B, T, dtype=F64), logp_raw_BT=torch.zeros(B, T, dtype=F64),
        finished_by_stop_B=torch.zeros(B, dtype=torch.bool), group_id_B=torch.arange(B))
    plain = SampledDistribution(1.0, False)
    with torch.no_grad():
        logp = forward_completion(policy, batch, completion, plain).logp_BT.to(F64)
        ref_logp = forward_completion(ref, batch, completion, plain).logp_BT.to(F64)
    logp_old = (logp + 0.4 * torch.randn(B, T, generator=g, dtype=F64)) * mask
    batch = dataclasses.replace(batch, logp_sampler_BT=logp_old, logp_raw_BT=logp_old)
    inputs = LearnerInputs(
        adv_BT=torch.randn(B, T, generator=g, dtype=F64) * mask, mask_BT=mask,
        tokens_BT=completion, logp_old_BT=logp_old, ref_logp_BT=ref_logp * mask,
        old_values_BT=torch.randn(B, T, generator=g, dtype=F64) * 0.1 * mask,
        returns_BT=torch.randn(B, T, generator=g, dtype=F64) * mask,
        group_tokens_B=group_token_counts(mask, 1))  # prompt_mean: one row per group
    spec = MethodSpec(
        description="every loss term at once", source="test", regime="test",
        advantage=AdvantageConfig("gae"), gate=GateConfig("delight", eta=0.7),
        objective=ObjectiveConfig("ppo_clip", clip_low=0.1, clip_high=0.15, dual_clip=2.0),
        agg=agg, kl=KLConfig(coef=0.1, estimator="k3", target="ref"), entropy_coef=0.05,
        value=ValueConfig(coef=0.5, clip=0.05))
    return spec, policy, value_head, batch, inputs


def _accumulated(agg: str, micro: int, local_denominators: bool = False
                 ) -> tuple[list[torch.Tensor], float, dict[str, torch.Tensor]]:
    """Gradients of all parameters, the loss and the stats, accumulated over micro-batches."""
    spec, policy, value_head, batch, inputs = _setup(agg)
    params = [*policy.parameters(), *value_head.parameters()]
    den = Denominators.of(inputs, 0, B, T)
    total, stats = 0.0, []
    for s in range(0, B, micro):
        rows = slice(s, min(s + micro, B))
        sub = inputs.select(rows)
        if local_denominators:
            den = Denominators(n_tokens=sub.mask_BT.sum(), n_seqs=float(sub.batch_size),
                               max_len=T)
        res = micro_batch_loss(spec, policy, value_head, batch.select(rows), sub, den, 0.1,
                               SampledDistribution(1.0, False))
        res.loss.backward()
        total += float(res.loss.detach())
        stats.append(res.stats)
    merged = {k: torch.cat([s[k] for s in stats]) for k in stats[0]}
    assert all(p.grad is not None for p in params)
    return [p.grad.clone() for p in params if p.grad is not None], total, merged


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert len(a) == len(b)
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_micro_batch_gradients_sum_to_the_full_batch_gradient(agg: str) -> None:
    full, loss_full, stats = _accumulated(agg, B)
    # The batch does exercise the clips, or the identity would be weaker than it looks.
    valid = _ragged_mask().bool()
    assert float(stats["clipfrac_region"][valid].sum()) >= 1
    assert float(stats["clipfrac_dual"][valid].sum()) >= 1
    assert float(stats["value_clipfrac"][valid].sum()) >= 1
    assert max(float(g.abs().max()) for g in full) > 1e-3
    for micro in (1, 2):  # 2 → micro-batches of 2, 2, 1 rows
        grads, loss, _ = _accumulated(agg, micro)
        assert _max_diff(grads, full) < 1e-12, (agg, micro)
        assert abs(loss - loss_full) < 1e-6 * max(1.0, abs(loss_full))


def test_local_denominators_would_break_accumulation() -> None:
    # Negative control: per-micro-batch token counts change token_mean's update on ragged rows.
    full, _, _ = _accumulated("token_mean", B)
    local, _, _ = _accumulated("token_mean", 1, local_denominators=True)
    assert _max_diff(local, full) > 1e-4


def test_token_mean_and_seq_mean_token_mean_differ_on_ragged_rows() -> None:
    tok, _, _ = _accumulated("token_mean", B)
    seq, _, _ = _accumulated("seq_mean_token_mean", B)
    assert _max_diff(tok, seq) > 1e-4


# --------------------------------------------------------------------------- GA through train()

# Adam's first step is lr·g/(|g| + 1e-8): coordinates with |g| ≲ 1e-8 amplify fp64 round-off
# in g (~1e-17, from summation order) by up to lr/1e-8. lr = 1e-6 keeps that below 1e-13, so
# the 1e-12 bound below is meaningful; `optim/grad_norm` checks the gradient's scale, which
# Adam's update would hide.
GA_LR = 1e-6


def _train_once(tmp: Path, method: str, micro: int, components: MethodConfig,
                group_size: int = 0) -> tuple[dict[str, Any], dict[str, float]]:
    cfg = TrainConfig(
        method=method, components=components, model=ModelConfig(dtype="float64"),
        run=RunConfig(num_steps=1, batch_size=8, group_size=group_size, micro_batch_size=micro,
                      eval_every=0, progress=False, runs_dir=str(tmp), device="cpu", threads=1,
                      name=f"{method}_{components.agg}_mb{micro}", log_samples=0),
        task_options=TaskConfig(seq_len=4, eval_batches=1, eval_batch_size=4),
        # Stopping on SEP (id 2 for the binary alphabet) gives completions of varied lengths.
        sampling=SamplingConfig(stop_token_ids=(2,)),
        optim=OptimConfig(lr=GA_LR))
    result = train(cfg)
    assert result.status == "completed"
    payload = torch.load(result.run_dir / "checkpoints" / "step_1.pt", weights_only=True)
    return payload, result.metrics[0]


def _assert_same_step(tmp: Path, method: str, components: MethodConfig,
                      group_size: int = 0) -> dict[str, float]:
    one, m_one = _train_once(tmp, method, 1, components, group_size)
    whole, m_whole = _train_once(tmp, method, 0, components, group_size)
    for key in ("policy", "value_head"):
        if whole[key] is None:
            assert one[key] is None
            continue
        for name, w in whole[key].items():
            assert w.dtype == F64
            diff = float((one[key][name] - w).abs().max())
            assert diff < 1e-12, (key, name, diff)
    g1, g8 = m_one["optim/grad_norm"], m_whole["optim/grad_norm"]
    assert g8 > 0 and abs(g1 - g8) <= 1e-6 * g8
    # The batch was ragged, so the aggregations are not trivially equal.
    assert m_whole["length/min"] < m_whole["length/max"]
    return m_whole


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum",
                                 "seq_mean_token_sum_norm", "sum"])
def test_train_micro_batch_1_equals_full_batch(tmp_path: Path, agg: str) -> None:
    _assert_same_step(tmp_path, "reinforce",
                      MethodConfig(agg=agg, kl_coef=0.05, entropy_coef=0.01))


def test_train_grpo_micro_batch_1_equals_full_batch(tmp_path: Path) -> None:
    m = _assert_same_step(tmp_path, "grpo", MethodConfig(), group_size=4)
    assert "loss/kl" in m  # ppo_clip + k3 KL to the behaviour policy


def test_train_ppo_micro_batch_1_equals_full_batch(tmp_path: Path) -> None:
    m = _assert_same_step(tmp_path, "ppo", MethodConfig())
    assert "loss/value" in m  # value head trained and compared
