"""gkd (METHODS_2026.md §3): the gkd_jsd objective — worked example, the β limits, the
teacher = student identity (loss and gradient 0), validation, and the preset through the
loop."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from fp64 import F64, TOL

from rlscope.config import ConfigError, RunConfig, TrainConfig, validate
from rlscope.methods import METHODS, MethodConfig
from rlscope.methods.distill import generalized_jsd_BT
from rlscope.methods.objectives import OBJECTIVES, PolicyTerms
from rlscope.methods.spec import ObjectiveConfig
from rlscope.methods.teacher import TeacherConfig, teacher_errors
from rlscope.policy import ModelConfig
from rlscope.sampling import SamplingConfig
from rlscope.tasks import TaskConfig, make_task
from rlscope.tasks.base import make_policy_for
from rlscope.train import train

TASK = TaskConfig(vocab=4, seq_len=4, eval_batches=1, eval_batch_size=8)


def _log(p: list[float]) -> torch.Tensor:
    return torch.tensor(p, dtype=F64).log()[None, None]


def test_worked_example() -> None:
    """P_θ = (0.5, 0.5), P_T = (0.9, 0.1): JSD_0.5 = 0.101749, KL(P_T‖P_θ) = 0.368064,
    KL(P_θ‖P_T) = 0.510826 (the β = 0 and β = 1 limits)."""
    s, t = _log([0.5, 0.5]), _log([0.9, 0.1])
    assert abs(generalized_jsd_BT(s, t, 0.5).item() - 0.101749) < 1e-6
    assert abs(generalized_jsd_BT(s, t, 0.0).item() - 0.368064) < 1e-6
    assert abs(generalized_jsd_BT(s, t, 1.0).item() - 0.510826) < 1e-6


def _terms(logits: torch.Tensor, teacher: torch.Tensor) -> PolicyTerms:
    logp_BTV = logits.log_softmax(-1)
    logp_BT = logp_BTV[..., 0]
    zeros = torch.zeros_like(logp_BT)
    return PolicyTerms(logp_BT, logp_BT.detach(), zeros, torch.ones_like(logp_BT),
                       logp_BTV=logp_BTV, teacher_logp_BTV=teacher)


def test_objective_values_stats_and_temperature() -> None:
    logits = _log([0.5, 0.5]).clone().requires_grad_()
    teacher = _log([0.9, 0.1])
    loss, stats = OBJECTIVES["gkd_jsd"](_terms(logits, teacher), ObjectiveConfig("gkd_jsd"))
    assert abs(loss.item() - 0.101749) < 1e-6
    assert abs(stats["distill/fkl"].item() - 0.368064) < 1e-6
    assert abs(stats["distill/rkl"].item() - 0.510826) < 1e-6
    # τ = 2: both distributions flattened, P_T ∝ (0.9, 0.1)^(1/2) = (0.75, 0.25)
    loss2, _ = OBJECTIVES["gkd_jsd"](_terms(logits, teacher),
                                     ObjectiveConfig("gkd_jsd", gkd_temperature=2.0))
    expected = generalized_jsd_BT(_log([0.5, 0.5]), _log([0.75, 0.25]), 0.5)
    torch.testing.assert_close(loss2.detach(), expected, **TOL)
    # the teacher gets no gradient even when it requires one
    t = teacher.clone().requires_grad_()
    loss3, _ = OBJECTIVES["gkd_jsd"](_terms(logits, t), ObjectiveConfig("gkd_jsd"))
    loss3.sum().backward()
    assert t.grad is None and logits.grad is not None and logits.grad.abs().sum() > 0


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_teacher_equal_to_student_gives_zero_loss_and_gradient(beta: float) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g, dtype=F64).requires_grad_()
    teacher = logits.detach().log_softmax(-1)
    loss, _ = OBJECTIVES["gkd_jsd"](_terms(logits, teacher),
                                    ObjectiveConfig("gkd_jsd", gkd_beta=beta))
    (grad,) = torch.autograd.grad(loss.sum(), logits)
    assert loss.abs().max().item() < 1e-14
    assert grad.abs().max().item() < 1e-14


def test_preset_settings() -> None:
    spec = METHODS["gkd"]
    assert (spec.objective.name, spec.objective.gkd_beta, spec.objective.gkd_temperature,
            spec.objective.gkd_lambda, spec.agg) == ("gkd_jsd", 0.5, 1.0, 1.0, "token_mean")
    assert spec.needs_teacher and spec.needs_teacher_distribution
    assert spec.reads_learner_distribution and not spec.needs_groups


class _TopK:
    vocab_size = 4
    full_distribution = False

    def logp_BTV(self, batch: object) -> torch.Tensor:
        raise AssertionError("not called")


def test_top_k_teacher_rejected() -> None:
    (error,) = teacher_errors(_TopK(), 4, METHODS["gkd"].needs_teacher_distribution)
    assert "needs the teacher's full distribution" in error
    assert teacher_errors(_TopK(), 4, METHODS["opd"].needs_teacher_distribution) == []


def _cfg(components: MethodConfig, teacher: str = "t.pt") -> TrainConfig:
    return TrainConfig(method="gkd", components=components, task_options=TASK,
                       teacher_options=TeacherConfig(teacher_path=teacher),
                       run=RunConfig(batch_size=8, group_size=1))


@pytest.mark.parametrize(("components", "message"), [
    (MethodConfig(gkd_beta=1.5), "method.gkd_beta=1.5 must lie in"),
    (MethodConfig(gkd_temperature=0.0), "method.gkd_temperature=0.0 be > 0"),
    (MethodConfig(gkd_lambda=0.0), r"method.gkd_lambda=0.0 must lie in \(0, 1\]"),
    (MethodConfig(gkd_lambda=0.5), "needs a task with target sequences"),
])
def test_rejected_outside_its_regime(tmp_path: Path, components: MethodConfig,
                                     message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(_cfg(components, str(tmp_path)))
    with pytest.raises(ConfigError, match="distils from a teacher"):
        validate(_cfg(MethodConfig(), ""))


def test_a_replayed_top_k_set_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")  # looks like a Hugging Face teacher directory
    cfg = dataclasses.replace(_cfg(MethodConfig(), str(tmp_path)),
                              sampling=SamplingConfig(top_k=2))
    with pytest.raises(ConfigError, match="truncates the student's"):
        validate(cfg)
    validate(dataclasses.replace(cfg, sampling=SamplingConfig(top_k=2,
                                                              replay_sampling_mask=False)))


def test_teacher_equal_to_student_through_the_loop(tmp_path: Path) -> None:
    """--init T --teacher_path T: the first step's JSD, both KLs and the policy loss are 0 (to
    the rounding of two float64 forwards)."""
    torch.manual_seed(3)
    policy = make_policy_for(make_task("token_reversal", TASK), ModelConfig(dtype="float64"))
    path = tmp_path / "t.pt"
    torch.save({"policy": policy.state_dict()}, path)
    row = train(TrainConfig(
        method="gkd", task_options=TASK, model=ModelConfig(dtype="float64"),
        sampling=SamplingConfig(use_cache=False),
        teacher_options=TeacherConfig(teacher_path=str(path)),
        run=RunConfig(num_steps=1, batch_size=8, group_size=1, eval_every=0, init=str(path),
                      progress=False, device="cpu", runs_dir=str(tmp_path)))).metrics[0]
    for key in ("distill/jsd", "distill/rkl", "distill/fkl", "loss/policy"):
        assert abs(row[key]) < 1e-12, key
