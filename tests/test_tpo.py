"""The TPO family and the label-distillation objectives (METHODS.md, "Objectives"): values and
gradients by hand on tiny inputs, the uniform-skill identity, and the loop around them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rlscope.config import ConfigError, RunConfig, TrainConfig, validate
from rlscope.methods import MethodConfig, resolve_method, validate_method
from rlscope.methods.advantages import ADVANTAGES, AdvantageInputs
from rlscope.methods.aggregation import aggregate
from rlscope.methods.objectives import OBJECTIVES, PolicyTerms
from rlscope.methods.spec import AdvantageConfig, ObjectiveConfig
from rlscope.methods.tpo import skill
from rlscope.tasks import TaskConfig
from rlscope.train import train

CFG = ObjectiveConfig()
LN = math.log


def _seq_terms(logp_B: list[float], rewards_B: list[float], group_size: int,
               logp_old_B: list[float] | None = None) -> PolicyTerms:
    """One-token sequences (so the summed sequence log-prob is the token's)."""
    logp_BT = torch.tensor(logp_B, dtype=torch.float64)[:, None].requires_grad_(True)
    old = logp_B if logp_old_B is None else logp_old_B
    return PolicyTerms(logp_BT=logp_BT, logp_old_BT=torch.tensor(old, dtype=torch.float64)[:, None],
                       weight_BT=torch.zeros_like(logp_BT), mask_BT=torch.ones_like(logp_BT),
                       rewards_B=torch.tensor(rewards_B, dtype=torch.float64),
                       group_size=group_size)


def _group_loss(name: str, x: PolicyTerms) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss_BT, stats = OBJECTIVES[name](x, CFG)
    n = float(x.logp_BT.shape[0])
    return aggregate(loss_BT, x.mask_BT, "seq_mean_token_sum", x.mask_BT.sum(), n, 1), stats


def test_skill_is_a_z_score_and_only_centred_when_uniform() -> None:
    # [1, 0, 0, 1]: mean 0.5, population std 0.5 → [1, −1, −1, 1]
    assert skill(torch.tensor([[1.0, 0.0, 0.0, 1.0]])).tolist() == [[1.0, -1.0, -1.0, 1.0]]
    # std 0 ≤ 1e-6: centred only → zeros
    assert skill(torch.tensor([[0.3, 0.3]])).abs().max() == 0


def test_tpo_target_loss_and_gradient_by_hand() -> None:
    """One group of 2: s = s_old = [ln .25, ln .75], r = [1, 0] → skill [1, −1].
    q ∝ [.25·e, .75/e] = [.679570, .275909] → q = [.711235, .288765];
    loss = −(.711235·ln .25 + .288765·ln .75) = 1.069053;
    d loss/d s = softmax(s) − q = [.25 − .711235, .75 − .288765] = [−.461235, .461235]."""
    x = _seq_terms([LN(0.25), LN(0.75)], [1.0, 0.0], group_size=2)
    loss, stats = _group_loss("tpo", x)
    assert float(loss.detach()) == pytest.approx(1.0690531378, abs=1e-9)
    loss.backward()
    assert x.logp_BT.grad is not None
    assert x.logp_BT.grad[:, 0].tolist() == pytest.approx([-0.4612345942, 0.4612345942], abs=1e-9)
    # target entropy −Σ q ln q and top probability, broadcast to each sample's tokens
    q = torch.tensor([0.7112345942, 0.2887654058], dtype=torch.float64)
    assert stats["tpo_target_entropy"][:, 0].tolist() == pytest.approx(
        [float(-(q * q.log()).sum())] * 2, abs=1e-9)
    assert stats["tpo_target_top_prob"][:, 0].tolist() == pytest.approx([0.7112345942] * 2)


def test_tpo_no_anchor_ignores_the_behaviour_distribution() -> None:
    """q = softmax([1, −1]) = [.880797, .119203]; loss = −(.880797·ln .25 + .119203·ln .75)
    = 1.255337, whatever s_old is."""
    for old in ([LN(0.25), LN(0.75)], [LN(0.9), LN(0.1)]):
        x = _seq_terms([LN(0.25), LN(0.75)], [1.0, 0.0], group_size=2, logp_old_B=old)
        loss, _ = _group_loss("tpo_no_anchor", x)
        assert float(loss.detach()) == pytest.approx(1.2553365661, abs=1e-9)


def test_tpo_with_uniform_skill_keeps_the_behaviour_group_distribution() -> None:
    """Equal rewards: skill 0, so q = softmax(log_softmax(s_old)) — the policy's own group
    distribution — and on-policy (s = s_old) the gradient softmax(s) − q is exactly 0."""
    torch.manual_seed(0)
    logp = (-torch.rand(8, dtype=torch.float64) * 3).tolist()
    x = _seq_terms(logp, [0.5] * 8, group_size=4)
    loss, stats = _group_loss("tpo", x)
    loss.backward()
    assert x.logp_BT.grad is not None and float(x.logp_BT.grad.abs().max()) < 1e-15
    s_G4 = torch.tensor(logp, dtype=torch.float64).view(2, 4)
    q_G4 = s_G4.log_softmax(-1).softmax(-1)
    assert stats["tpo_target_top_prob"].view(2, 4)[:, 0].tolist() == pytest.approx(
        q_G4.max(-1).values.tolist(), abs=1e-12)


def test_group_pg_is_the_skill_weighted_log_likelihood() -> None:
    """Two groups of 2, r = [1, 0 | 0, 1]: skill [1, −1 | −1, 1]; loss = mean over groups of
    −Σ skill_i·s_i, so d loss/d ℓ_i = −skill_i / 2 (two groups)."""
    x = _seq_terms([-0.1, -2.0, -0.5, -0.7], [1.0, 0.0, 0.0, 1.0], group_size=2)
    loss, _ = _group_loss("group_pg", x)
    # −(1·(−0.1) − 1·(−2.0)) = −1.9; −(−1·(−0.5) + 1·(−0.7)) = 0.2; mean −0.85
    assert float(loss.detach()) == pytest.approx(-0.85, abs=1e-12)
    loss.backward()
    assert x.logp_BT.grad is not None
    assert x.logp_BT.grad[:, 0].tolist() == pytest.approx([-0.5, 0.5, 0.5, -0.5], abs=1e-12)


def test_group_objectives_reject_split_groups() -> None:
    x = _seq_terms([-0.1, -2.0, -0.5], [1.0, 0.0, 0.0], group_size=2)
    with pytest.raises(ValueError, match="whole groups"):
        OBJECTIVES["tpo"](x, CFG)


def test_tpo_full_action_by_hand() -> None:
    """π = [.5, .3, .2], sampled class 0, r = 1: A = 1 − (.25 + .09 + .04) = .62; the score
    vector [.62, 0, 0] has z-score [√2, −1/√2, −1/√2]; q ∝ π·exp(skill) = [.892958, .064225,
    .042817]; loss = −Σ q ln π = .765188; d loss/d log π_v = π_v − q_v (through the softmax)."""
    logits_BTV = torch.tensor([[[LN(0.5), LN(0.3), LN(0.2)]]], dtype=torch.float64,
                              requires_grad=True)
    logp_BTV = logits_BTV.log_softmax(-1)
    tokens_BT = torch.tensor([[0]])
    x = PolicyTerms(logp_BT=logp_BTV[..., 0], logp_old_BT=logp_BTV[..., 0].detach(),
                    weight_BT=torch.zeros(1, 1, dtype=torch.float64),
                    mask_BT=torch.ones(1, 1, dtype=torch.float64),
                    rewards_B=torch.tensor([1.0], dtype=torch.float64), logp_BTV=logp_BTV,
                    tokens_BT=tokens_BT)
    loss_BT, stats = OBJECTIVES["tpo_full_action"](x, CFG)
    assert float(loss_BT.detach()) == pytest.approx(0.7651875618, abs=1e-9)
    assert float(stats["tpo_target_top_prob"]) == pytest.approx(0.8929581985, abs=1e-9)
    assert float(stats["tpo_target_entropy"]) == pytest.approx(0.4123258417, abs=1e-9)
    loss_BT.sum().backward()
    q = [0.8929581985, 0.0642250809, 0.0428167206]
    assert logits_BTV.grad is not None
    assert logits_BTV.grad[0, 0].tolist() == pytest.approx(
        [0.5 - q[0], 0.3 - q[1], 0.2 - q[2]], abs=1e-9)


def _candidate_terms(cur_V: list[float], old_V: list[float]) -> tuple[PolicyTerms, torch.Tensor]:
    """One prefix, V = 4, candidates [0, 2, 0] (token 0 drawn twice), target token 0."""
    logits_BTV = torch.tensor([[[LN(p) for p in cur_V]]], dtype=torch.float64,
                              requires_grad=True)
    logp_BTV = logits_BTV.log_softmax(-1)
    cand_BTK = torch.tensor([[[0, 2, 0]]])
    old_BTK = torch.tensor([[[LN(old_V[0]), LN(old_V[2]), LN(old_V[0])]]], dtype=torch.float64)
    x = PolicyTerms(logp_BT=logp_BTV[..., 0], logp_old_BT=old_BTK[..., 0],
                    weight_BT=torch.zeros(1, 1, dtype=torch.float64),
                    mask_BT=torch.ones(1, 1, dtype=torch.float64), logp_BTV=logp_BTV,
                    candidates_BTK=cand_BTK, cand_logp_old_BTK=old_BTK,
                    cand_rewards_BTK=torch.tensor([[[1.0, 0.0, 1.0]]], dtype=torch.float64))
    return x, logits_BTV


def test_tpo_token_by_hand() -> None:
    """Old candidate probabilities [.4, .2, .4] (already normalised over the candidate set),
    rewards [1, 0, 1] → skill [1/√2, −√2, 1/√2]; q ∝ [.4·e^.7071, .2·e^−1.4142, .4·e^.7071]
    = [.485452, .029096, .485452]; loss = −Σ q ln [.4, .2, .4] = .936459.
    On-policy, d loss/d current candidate log-prob_k = [.4, .2, .4]_k − q_k; token 0 collects
    candidates 0 and 2: 2·(.4 − .485452) = −.170904, token 2: .2 − .029096 = .170904, and the
    candidates' log-probs move only through the logits of tokens 0 and 2."""
    pi = [0.4, 0.3, 0.2, 0.1]
    x, logits = _candidate_terms(pi, pi)
    loss_BT, stats = OBJECTIVES["tpo_token"](x, CFG)
    assert float(loss_BT.detach()) == pytest.approx(0.9364587808, abs=1e-9)
    assert float(stats["tpo_target_top_prob"]) == pytest.approx(0.4854518279, abs=1e-9)
    loss_BT.sum().backward()
    # d/d logits_v = Σ_k g_k (1[c_k = v] − π_v), g = d loss / d cur_k (sums to 0 over k)
    g0, g2 = 2 * (0.4 - 0.4854518279), 0.2 - 0.0290963442
    assert logits.grad is not None
    assert logits.grad[0, 0].tolist() == pytest.approx([g0, 0.0, g2, 0.0], abs=1e-9)


def test_grpo_token_by_hand_on_and_off_policy() -> None:
    """A = z-score of [1, 0, 1] = [.7071, −1.4142, .7071]. On-policy: ρ = 1, loss
    −Σ A = 0 and d loss/d cur_k = −A_k. Off-policy with current π = [.5, .2, .15, .15]
    against old [.4, .3, .2, .1]: ρ = [.5/.4, .15/.2, .5/.4] = [1.25, .75, 1.25]:
    candidates 0 and 2 clip at 1.2 (A > 0): −1.2·.7071 = −.848528 each; candidate 1 clips at
    .8 (A < 0): −min(.75·(−1.4142), .8·(−1.4142)) = 1.131371; k3 = [.023144, .045651,
    .023144]; loss = −.848528·2 + 1.131371 + .04·.091938 = −.562008."""
    pi = [0.4, 0.3, 0.2, 0.1]
    x, logits = _candidate_terms(pi, pi)
    loss_BT, _ = OBJECTIVES["grpo_token"](x, ObjectiveConfig(candidate_kl=0.04))
    assert float(loss_BT.detach()) == pytest.approx(0.0, abs=1e-9)
    loss_BT.sum().backward()
    # d loss/d logits_v = Σ_k (−A_k)(1[c_k = v] − π_v) = −Σ_{k: c_k = v} A_k (Σ_k A_k = 0), and
    # k3's gradient 1 − e^−d vanishes at d = 0: token 0 gets −2/√2 = −√2, token 2 gets +√2.
    assert logits.grad is not None
    assert logits.grad[0, 0].tolist() == pytest.approx(
        [-math.sqrt(2), 0.0, math.sqrt(2), 0.0], abs=1e-7)
    cur = [0.5, 0.2, 0.15, 0.15]
    x, _ = _candidate_terms(cur, pi)
    loss_BT, stats = OBJECTIVES["grpo_token"](x, ObjectiveConfig(candidate_kl=0.04))
    assert float(loss_BT.detach()) == pytest.approx(-0.5620078784, abs=1e-9)
    assert float(stats["clipfrac_high"]) == pytest.approx(2 / 3)
    assert float(stats["clipfrac_low"]) == pytest.approx(1 / 3)
    assert float(stats["candidate_kl"]) == pytest.approx(2 * 0.0231435513 + 0.0456512609)


# ---------------------------------------------------------------- label distillation terms


def test_oracle_token_advantage_by_hand() -> None:
    """A_t = (1[a_t = y_t] − Σπ²)·m_t: correct [1, 0, 1], Σπ² [.52, .58, .5], scored [1, 1, 0]
    → [.48, −.58, 0]."""
    x = AdvantageInputs(rewards_B=torch.zeros(1), mask_BT=torch.ones(1, 3),
                        sum_p2_BT=torch.tensor([[0.52, 0.58, 0.5]]),
                        score_mask_BT=torch.tensor([[1.0, 1.0, 0.0]]),
                        token_correct_BT=torch.tensor([[1.0, 0.0, 1.0]]))
    adv = ADVANTAGES["oracle_token"](x, AdvantageConfig("oracle_token"))
    assert adv[0].tolist() == pytest.approx([0.48, -0.58, 0.0])


def _label_terms(weight: list[float], gate: list[float]) -> PolicyTerms:
    """π at two positions [[.6, .4], [.3, .7]], actor tokens [0, 0], labels [0, 1]."""
    logp_BTV = torch.tensor([[[0.6, 0.4], [0.3, 0.7]]], dtype=torch.float64).log()
    tokens_BT = torch.tensor([[0, 0]])
    return PolicyTerms(logp_BT=logp_BTV.gather(-1, tokens_BT[..., None])[..., 0],
                       logp_old_BT=torch.zeros(1, 2, dtype=torch.float64),
                       weight_BT=torch.tensor([weight], dtype=torch.float64),
                       mask_BT=torch.ones(1, 2, dtype=torch.float64), logp_BTV=logp_BTV,
                       tokens_BT=tokens_BT, targets_BT=torch.tensor([[0, 1]]),
                       label_mask_BT=torch.ones(1, 2, dtype=torch.float64),
                       gate_BT=torch.tensor([gate], dtype=torch.float64))


def test_self_distill_by_hand() -> None:
    """A = [1 − .52, 0 − .58] = [.48, −.58]; ℓ = [ln .6, ln .3]; g = σ(A·(−ℓ)) =
    [σ(.245196), σ(−.698304)] = [.560994, .332188]; w = g·A; CE = [−ln .6, −ln .7].
    loss_t = −ℓ_t·w_t + .5·g_t·CE_t = [.280839, −.172727]."""
    g = [0.5609937955, 0.3321883098]
    x = _label_terms([g[0] * 0.48, g[1] * -0.58], g)
    loss_BT, stats = OBJECTIVES["self_distill"](x, ObjectiveConfig(distill_alpha=0.5))
    assert loss_BT[0].tolist() == pytest.approx([0.2808386054, -0.1727268774], abs=1e-9)
    assert stats["distill_ce"][0].tolist() == pytest.approx(
        [g[0] * -LN(0.6), g[1] * -LN(0.7)], abs=1e-9)


def test_scope_lite_trains_labels_from_the_first_wrong_token() -> None:
    """Actor [0, 0] vs labels [0, 1]: the first error is at t = 1, so the suffix is [0, 1] and
    the correction adds .5·(−ln .7) at t = 1 only; a correct rollout adds nothing."""
    x = _label_terms([0.2, -0.1], [0.5, 0.5])
    loss_BT, stats = OBJECTIVES["scope_lite"](x, ObjectiveConfig(distill_alpha=0.5))
    assert loss_BT[0].tolist() == pytest.approx(
        [-LN(0.6) * 0.2, -LN(0.3) * -0.1 + 0.5 * -LN(0.7)], abs=1e-12)
    assert stats["first_error_frac"][0].tolist() == [0.0, 1.0]
    correct = PolicyTerms(**{**x.__dict__, "targets_BT": torch.tensor([[0, 0]])})
    loss_BT, stats = OBJECTIVES["scope_lite"](correct, ObjectiveConfig(distill_alpha=0.5))
    assert loss_BT[0].tolist() == pytest.approx([-LN(0.6) * 0.2, -LN(0.3) * -0.1], abs=1e-12)
    assert float(stats["first_error_frac"].sum()) == 0.0


# ------------------------------------------------------------------- validation and loop

SMALL = TaskConfig(seq_len=4, eval_batches=1, eval_batch_size=16)


def _cfg(tmp_path: Path, method: str, task: str = "token_reversal",
         components: MethodConfig | None = None, **run: object) -> TrainConfig:
    run_kw: dict[str, object] = {"batch_size": 16, "num_steps": 4, "eval_every": 0,
                                 "runs_dir": str(tmp_path), "progress": False,
                                 "device": "cpu", "log_samples": 0, **run}
    return TrainConfig(method=method, task=task, components=components or MethodConfig(),
                       task_options=TaskConfig() if "bandit" in task else SMALL,
                       run=RunConfig(**run_kw))  # type: ignore[arg-type]


def test_tpo_family_declares_its_aggregation() -> None:
    spec = resolve_method("tpo", MethodConfig(agg="token_mean"))
    assert any("defined with agg='seq_mean_token_sum'" in e
               for e in validate_method(spec, group_size=8, batch_size=16))
    spec = resolve_method("tpo_token", MethodConfig(agg="sum"))
    assert any("mean over prefixes" in e for e in validate_method(spec, 8, 16))
    # the objective on an ungrouped preset makes it grouped
    spec = resolve_method("reinforce", MethodConfig(objective="tpo", agg="seq_mean_token_sum"))
    assert any("group_size must be > 1" in e for e in validate_method(spec, 1, 16))


def test_tpo_micro_batches_must_hold_whole_groups(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="micro_batch_size=4 must hold whole groups of 8"):
        validate(_cfg(tmp_path, "tpo", micro_batch_size=4))
    validate(_cfg(tmp_path, "tpo", micro_batch_size=8))


def test_tpo_gradient_accumulation_equals_one_batch(tmp_path: Path) -> None:
    """Micro-batches of one group each give the same parameters as the whole batch."""
    results = [train(_cfg(tmp_path, "tpo", micro_batch_size=m, name=f"tpo{m}"))
               for m in (8, 16)]
    a, b = ([r["loss/policy"] for r in res.metrics] for res in results)
    assert a == pytest.approx(b, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("method", ["tpo", "tpo_no_anchor", "group_pg"])
def test_group_objectives_are_on_policy_exact_at_the_first_pass(tmp_path: Path,
                                                                method: str) -> None:
    """First pass ratio exactly 1; the soft targets are proper distributions over a group of 8
    (top probability in [1/8, 1])."""
    result = train(_cfg(tmp_path, method, name=method))
    for row in result.metrics:
        assert row["policy/ratio_mean_first"] == 1.0
        assert math.isfinite(row["loss/policy"])
        if method != "group_pg":
            assert 1 / 8 - 1e-6 <= row["policy/tpo_target_top_prob"] <= 1.0
