"""KL warm-up, adaptive entropy control and the ``full`` KL estimator through the learner and
the training loop (METHODS.md, "KL and entropy regularisers", "Validation")."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from rlscope.config import ConfigError, RunConfig, TrainConfig, validate
from rlscope.learner import UpdatePlan, prepare, update
from rlscope.methods import MethodConfig, resolve_method
from rlscope.methods.aggregation import aggregate
from rlscope.methods.regularizers import adaptive_entropy_update, kl_full
from rlscope.metrics.sinks import read_jsonl
from rlscope.policy import ModelConfig
from rlscope.sampling import SamplingConfig, generate
from rlscope.sampling.processors import SampledDistribution
from rlscope.tasks import TaskConfig, make_task
from rlscope.tasks.base import make_policy_for
from rlscope.train import RunResult, train

F64 = torch.float64
SMALL_TASK = TaskConfig(seq_len=4, eval_batches=1, eval_batch_size=8)
# Keys that exist or differ only because a KL term or an entropy controller is configured.
KL_KEYS = ("kl_ctrl/beta", "loss/kl", "policy/kl_ref_k1", "policy/kl_ref_k3",
           "policy/kl_ref_seq_k1")


def _cfg(tmp: Path, name: str, components: MethodConfig, sampling: SamplingConfig | None = None,
         **run: Any) -> TrainConfig:
    run = {"batch_size": 16, "num_steps": 5, "eval_every": 0, "progress": False,
           "device": "cpu", "threads": 1, "runs_dir": str(tmp), "name": name,
           "log_samples": 0, **run}
    return TrainConfig(method="reinforce", components=components, task_options=SMALL_TASK,
                       sampling=sampling or SamplingConfig(), run=RunConfig(**run))


def _strip(row: dict[str, float], keys: tuple[str, ...]) -> dict[str, float]:
    return {k: v for k, v in row.items()
            if k not in keys and not k.startswith(("time/", "throughput/", "perf/"))}


def _params(result: RunResult, step: int) -> dict[str, torch.Tensor]:
    path = result.run_dir / "checkpoints" / f"step_{step}.pt"
    return torch.load(path, weights_only=True)["policy"]


# -------------------------------------------------------------------------- KL warm-up


def test_kl_warmup_is_exactly_no_kl_then_the_configured_beta(tmp_path: Path) -> None:
    warm = train(_cfg(tmp_path, "warm", MethodConfig(kl_coef=0.1, kl_target="ref",
                                                     kl_control="warmup", kl_warmup_steps=3)))
    plain = train(_cfg(tmp_path, "plain", MethodConfig()))
    rows = warm.metrics
    # β = 0 on steps 0, 1, 2, then β_after = kl_coef = 0.1.
    assert [r["kl_ctrl/beta"] for r in rows] == [0.0, 0.0, 0.0, 0.1, 0.1]
    # The reference was built (its KL is measured) through the warm-up.
    assert all("policy/kl_ref_k1" in r for r in rows)
    for r in rows[:3]:
        # loss/total = loss/policy + 0·KL: the KL term adds exactly nothing...
        assert r["loss/total"] == r["loss/policy"]
    # ...so the warm-up steps are bit-identical to a run without KL (same samples, losses,
    # gradients; only the KL bookkeeping differs).
    for a, b in zip(rows[:3], plain.metrics[:3], strict=True):
        assert _strip(a, KL_KEYS) == _strip(b, KL_KEYS)
    # After the warm-up: loss/total = loss/policy + 0.1·loss/kl with KL > 0 (the policy has
    # moved off the reference for 3 updates), up to float32 rounding.
    r = rows[3]
    assert r["loss/kl"] > 0
    assert r["loss/total"] == pytest.approx(r["loss/policy"] + 0.1 * r["loss/kl"],
                                            rel=1e-5, abs=1e-7)
    assert r["loss/total"] != r["loss/policy"]


# -------------------------------------------------------------- adaptive entropy control


def test_adaptive_entropy_coefficient_moves_and_reaches_the_loss(tmp_path: Path) -> None:
    # Target 5 nats/token is above log V (V = 2 symbols + SEP: log 3 ≈ 1.10), so H̄ < target every
    # step and c rises by δ = 0.01 per step from c0 = 0: 0, 0.01, 0.02, 0.03, 0.04.
    up = train(_cfg(tmp_path, "up", MethodConfig(entropy_control="adaptive", entropy_coef=0.0,
                                                 entropy_target=5.0, entropy_delta=0.01,
                                                 entropy_window=2)))
    want, c = [], 0.0
    for _ in range(5):
        want.append(c)
        c = c + 0.01
    coefs = [r["entropy_ctrl/coef"] for r in up.metrics]
    assert coefs == want
    for r, coef in zip(up.metrics, coefs, strict=True):
        # the learner used the logged c: loss/total = loss/policy − c·loss/entropy
        assert r["loss/total"] == pytest.approx(r["loss/policy"] - coef * r["loss/entropy"],
                                                rel=1e-5, abs=1e-7)
    # Target 0: H̄ ≥ target always, so c falls by δ and stops at 0:
    # 0.025, 0.015, 0.005, max(0.005 − 0.01, 0) = 0, 0.
    down = train(_cfg(tmp_path, "down", MethodConfig(entropy_control="adaptive",
                                                     entropy_coef=0.025, entropy_target=0.0,
                                                     entropy_delta=0.01)))
    coefs = [r["entropy_ctrl/coef"] for r in down.metrics]
    assert coefs[:3] == [0.025, 0.025 - 0.01, 0.025 - 0.01 - 0.01] and coefs[3:] == [0.0, 0.0]
    # Each logged c is the controller replayed on the logged entropies (window 10).
    cfg = resolve_method("reinforce", MethodConfig(entropy_control="adaptive",
                                                   entropy_target=0.0, entropy_delta=0.01))
    entropies = [r["policy/entropy"] for r in down.metrics]
    for s in range(4):
        assert coefs[s + 1] == adaptive_entropy_update(coefs[s], entropies[:s + 1], cfg.entropy)


def test_adaptive_entropy_that_stays_at_zero_changes_nothing(tmp_path: Path) -> None:
    """c0 = 0 with target 0 never moves (max(0 − δ, 0) = 0): the entropy term is in the loss
    with coefficient 0, and the run is bit-identical to one without an entropy bonus."""
    adaptive = train(_cfg(tmp_path, "adaptive", MethodConfig(
        entropy_control="adaptive", entropy_target=0.0, entropy_delta=0.01)))
    plain = train(_cfg(tmp_path, "plain", MethodConfig()))
    assert all(r["entropy_ctrl/coef"] == 0.0 and r["loss/entropy"] > 0
               for r in adaptive.metrics)
    for a, b in zip(adaptive.metrics, plain.metrics, strict=True):
        assert _strip(a, ("loss/entropy",)) == _strip(b, ())
    for name, w in _params(plain, 5).items():
        assert torch.equal(_params(adaptive, 5)[name], w), name


# ---------------------------------------------------------------------------- resume


def test_resume_continues_warmup_and_entropy_controller_exactly(tmp_path: Path) -> None:
    """The warm-up crosses the resume point (step 13 > 10). On this seed the entropy target
    0.62 lies between step 10's entropy (≈ 0.60) and the window mean of steps 7–10 (≈ 0.66),
    so a resume that lost the entropy window would raise c instead of holding it at 0 and
    diverge from step 11 on."""
    components = MethodConfig(kl_coef=0.05, kl_target="ref", kl_control="warmup",
                              kl_warmup_steps=13, entropy_control="adaptive",
                              entropy_coef=0.01, entropy_target=0.62, entropy_delta=0.002,
                              entropy_window=4)
    straight = train(_cfg(tmp_path, "straight", components, num_steps=20))
    half = train(_cfg(tmp_path, "half", components, num_steps=10))
    resumed = train(_cfg(tmp_path, "resumed", components, num_steps=20,
                         resume=str(half.run_dir)))
    a = read_jsonl(straight.run_dir / "metrics.jsonl")
    b = read_jsonl(resumed.run_dir / "metrics.jsonl")
    assert [r["step"] for r in b] == list(range(20))
    for ra, rb in zip(a, b, strict=True):
        assert _strip(ra, ()) == _strip(rb, ()), f"step {ra['step']} differs"
    # the warm-up crossed the resume point, and the entropy controller moved
    assert [r["kl_ctrl/beta"] for r in a] == [0.0] * 13 + [0.05] * 7
    assert len({r["entropy_ctrl/coef"] for r in a}) > 1
    # the checkpoint at step 10 holds c in force at step 10 and the last 4 entropies
    payload = torch.load(half.run_dir / "checkpoints" / "step_10.pt", weights_only=True)
    assert payload["entropy_coef"] == a[10]["entropy_ctrl/coef"]
    assert payload["entropy_history"] == [r["policy/entropy"] for r in a[6:10]]


# ------------------------------------------------------------------------ full KL


def test_full_kl_runs_through_train_with_a_kept_set(tmp_path: Path) -> None:
    result = train(_cfg(tmp_path, "full", MethodConfig(kl_coef=0.1, kl_target="ref",
                                                       kl_estimator="full"),
                        sampling=SamplingConfig(top_k=2)))
    kls = [r["loss/kl"] for r in result.metrics]
    # Step 0: π is the reference's copy, so every token's KL is exactly 0.
    assert kls[0] == 0.0
    # Later the exact KL is positive (it is ≥ 0 per token) and everything stays finite.
    assert all(k > 0 for k in kls[1:])
    assert all(torch.isfinite(torch.tensor(list(r.values()))).all() for r in result.metrics)


def _full_kl_setup() -> tuple[Any, ...]:
    """fp64 policy and a *different* reference (so the KL and its gradient are not 0), a
    sampled ragged batch with a top-2 kept set, and `prepare`'s inputs."""
    task = make_task("token_reversal", TaskConfig(seq_len=4))
    spec = resolve_method("reinforce", MethodConfig(kl_coef=0.5, kl_target="ref",
                                                    kl_estimator="full", entropy_coef=0.01))
    torch.manual_seed(0)
    policy = make_policy_for(task, ModelConfig(dtype="float64"))
    torch.manual_seed(1)
    ref = make_policy_for(task, ModelConfig(dtype="float64")).requires_grad_(False).eval()
    g = torch.Generator().manual_seed(2)
    prompts = task.sample_prompts(g, 8)
    seeds_B = torch.randint(0, 2**62, (8,), generator=g)
    batch = generate(policy.eval(), prompts, SamplingConfig(top_k=2, stop_token_ids=(2,)),
                     seeds_B, 4)
    rewards_B = task.score(batch).rewards_B
    batch = dataclasses.replace(batch, rewards_B=rewards_B, raw_rewards_B=rewards_B)
    inputs, _ = prepare(spec, batch, policy, None, ref, 0.5, 1, SampledDistribution(1.0, True))
    return spec, policy, batch, inputs


def test_prepare_stores_the_reference_distribution_and_select_slices_it() -> None:
    _, _, batch, inputs = _full_kl_setup()
    assert inputs.ref_logp_BTV is not None and batch.keep_mask_BTV is not None
    assert inputs.ref_logp_BTV.shape == (*inputs.tokens_BT.shape, 3)  # V = 2 symbols + SEP
    # the reference distribution is the processed one: zero mass outside the kept set
    assert bool((inputs.ref_logp_BTV.exp().sum(-1) - 1).abs().max() < 1e-12)
    assert bool((inputs.ref_logp_BTV[~batch.keep_mask_BTV] == float("-inf")).all())
    # its sampled-token column is the sampled-token reference log-prob
    picked = inputs.ref_logp_BTV.gather(-1, inputs.tokens_BT[..., None])[..., 0]
    assert torch.equal(picked, inputs.ref_logp_BT)
    part = inputs.select(slice(2, 5))
    assert part.ref_logp_BTV is not None
    assert torch.equal(part.ref_logp_BTV, inputs.ref_logp_BTV[2:5])


def _one_step(micro: int, beta: float) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    spec, policy, batch, inputs = _full_kl_setup()
    # SGD, not Adam: Adam's first step lr·g/(|g| + eps) would amplify fp64 round-off in the
    # tiny gradient coordinates; SGD keeps the comparison at round-off level.
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.5)
    plan = UpdatePlan(spec=spec, inner_epochs=1, num_minibatches=1, micro_batch_size=micro,
                      max_len=4, grad_clip=0.0, dist=SampledDistribution(1.0, True))
    result = update(plan, policy.train(), None, optimizer, batch, inputs, beta, 0.01)
    parts = {k: float(v) for k, v in result.last.parts.items()}
    return copy.deepcopy(policy.state_dict()), parts


def test_full_kl_gradient_accumulation_is_exact() -> None:
    """micro_batch_size 2 (4 micro-batches) and the whole batch of 8 give the same parameters
    after one optimizer step, in fp64, with the full KL term active and non-trivial."""
    whole, parts = _one_step(8, 0.5)
    micro, parts_micro = _one_step(2, 0.5)
    no_kl, _ = _one_step(8, 0.0)
    assert parts["loss/kl"] > 1e-3  # a different reference: the term is not trivially 0
    assert abs(parts_micro["loss/kl"] - parts["loss/kl"]) < 1e-12
    moved = max(float((whole[k] - no_kl[k]).abs().max()) for k in whole)
    assert moved > 1e-4  # the KL term changes the step
    for name, w in whole.items():
        assert float((micro[name] - w).abs().max()) < 1e-12, name


def test_full_kl_loss_part_is_the_aggregated_exact_kl() -> None:
    spec, policy, batch, inputs = _full_kl_setup()
    _, parts = _one_step(8, 0.5)
    from rlscope.learner import forward_completion

    with torch.no_grad():
        fwd = forward_completion(policy, batch, inputs.tokens_BT, SampledDistribution(1.0, True))
        kl_BT = kl_full(fwd.logp_BTV, inputs.ref_logp_BTV)
        n = inputs.mask_BT.sum()
        want = float(aggregate(kl_BT, inputs.mask_BT, spec.agg, n, 8.0, 4))
    assert abs(parts["loss/kl"] - want) < 1e-12


# ------------------------------------------------------------------------ validation


@pytest.mark.parametrize(("method", "components", "fragment"), [
    ("reinforce", MethodConfig(kl_control="warmup", kl_warmup_steps=5),
     "kl_control='warmup' needs kl_coef > 0"),
    ("reinforce", MethodConfig(kl_coef=0.1, kl_control="warmup", kl_warmup_steps=-1),
     "kl_warmup_steps=-1 must be >= 0"),
    ("reinforce", MethodConfig(kl_coef=0.1, kl_warmup_steps=5),
     "kl_warmup_steps=5 only acts with kl_control='warmup'"),
    ("reinforce", MethodConfig(kl_control="sometimes"), "kl_control='sometimes' is unknown"),
    ("grpo", MethodConfig(kl_estimator="full"), "kl_estimator='full' needs kl_target='ref'"),
    ("ppo", MethodConfig(kl_estimator="full"), "kl_estimator='full' needs kl_place='loss'"),
    ("reinforce", MethodConfig(entropy_control="adaptive", entropy_delta=0.0),
     "entropy_delta=0.0 must be > 0"),
    ("reinforce", MethodConfig(entropy_control="adaptive", entropy_window=0),
     "entropy_window=0 must be >= 1"),
    ("reinforce", MethodConfig(entropy_control="adaptive", entropy_target=-0.1),
     "entropy_target=-0.1 must be >= 0"),
    ("reinforce", MethodConfig(entropy_target=0.5), "only act with entropy_control='adaptive'"),
    ("reinforce", MethodConfig(entropy_control="pid"), "entropy_control='pid' is unknown"),
])
def test_invalid_regulariser_settings_are_rejected_with_the_reason(
        tmp_path: Path, method: str, components: MethodConfig, fragment: str) -> None:
    cfg = dataclasses.replace(_cfg(tmp_path, "bad", components), method=method)
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        validate(cfg)


def test_valid_regulariser_settings_resolve() -> None:
    spec = resolve_method("grpo", MethodConfig(kl_target="ref", kl_estimator="full",
                                               kl_control="warmup", kl_warmup_steps=10,
                                               entropy_control="adaptive", entropy_target=0.3,
                                               entropy_delta=0.005, entropy_window=5))
    assert spec.kl.estimator == "full" and spec.kl.warmup_steps == 10
    assert spec.needs_reference  # warm-up still builds the reference (β_after = 0.04 > 0)
    assert (spec.entropy.control, spec.entropy.target, spec.entropy.delta,
            spec.entropy.window) == ("adaptive", 0.3, 0.005, 5)
    assert spec.uses_entropy_bonus and spec.entropy_coef == 0.0
    validate(TrainConfig(method="grpo", components=MethodConfig(
        kl_target="ref", kl_estimator="full", kl_control="warmup", kl_warmup_steps=10,
        entropy_control="adaptive")))
