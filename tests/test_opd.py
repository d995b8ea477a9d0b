"""opd (METHODS_2026.md §3): the teacher_rkl advantage, the frozen-policy Teacher, worked
example, identities, validation and the preset through the loop."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from fp64 import F64, TOL
from fp64 import t as _t

from rlscope.config import ConfigError, RunConfig, TrainConfig, validate
from rlscope.methods import METHODS, MethodConfig
from rlscope.methods.advantages import ADVANTAGES, AdvantageInputs, discounted_rtg
from rlscope.methods.spec import AdvantageConfig
from rlscope.methods.teacher import PolicyTeacher, Teacher, TeacherConfig, teacher_errors
from rlscope.policy import ModelConfig
from rlscope.sampling import SamplingConfig
from rlscope.tasks import TaskConfig, make_task
from rlscope.tasks.base import make_policy_for
from rlscope.train import RunResult, setup, train

TASK = TaskConfig(vocab=4, seq_len=4, eval_batches=1, eval_batch_size=8)


def _adv(logp_mu: list[list[float]], logp_t: list[list[float]], cfg: AdvantageConfig,
         rewards: list[float] | None = None, group_size: int = 1) -> torch.Tensor:
    mu = _t(logp_mu)
    r = _t(rewards) if rewards is not None else torch.zeros(mu.shape[0], dtype=F64)
    x = AdvantageInputs(rewards_B=r, mask_BT=torch.ones_like(mu), group_size=group_size,
                        teacher_logp_BT=_t(logp_t), behaviour_logp_BT=mu)
    return ADVANTAGES["teacher_rkl"](x, cfg)


def test_worked_example() -> None:
    """p_μ = 0.5, p_T = 0.8: A = ln 0.8 − ln 0.5 = 0.470004."""
    a = _adv([[math.log(0.5)]], [[math.log(0.8)]], METHODS["opd"].advantage)
    assert abs(a.item() - 0.470004) < 1e-6


def test_teacher_equal_to_the_student_gives_zero_advantage() -> None:
    logp = -torch.rand(3, 5, dtype=F64)
    a = _adv(logp.tolist(), logp.tolist(), METHODS["opd"].advantage)
    assert torch.equal(a, torch.zeros_like(logp))


def test_expected_advantage_is_minus_the_reverse_kl() -> None:
    """E_{a∼π}[A_t] = −KL(π‖P_T) at a state (enumerating the vocabulary)."""
    pi = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    pt = torch.tensor([0.1, 0.6, 0.3], dtype=F64)
    a = _adv(pi.log()[:, None].tolist(), pt.log()[:, None].tolist(), AdvantageConfig(
        "teacher_rkl"))[:, 0]
    kl = (pi * (pi.log() - pt.log())).sum()
    torch.testing.assert_close((pi * a).sum(), -kl, **TOL)


def test_beta_gamma_and_env_mixing() -> None:
    mu, te = [[-1.0, -2.0, -0.5]], [[-0.5, -1.0, -1.5]]
    base_BT = _t([[0.5, 1.0, -1.0]])
    cfg = AdvantageConfig("teacher_rkl", teacher_beta=2.0)
    torch.testing.assert_close(_adv(mu, te, cfg), 2 * base_BT, **TOL)
    cfg = AdvantageConfig("teacher_rkl", teacher_gamma=0.5)
    torch.testing.assert_close(_adv(mu, te, cfg), _t([[0.5 + 0.5 - 0.25, 1.0 - 0.5, -1.0]]),
                               **TOL)
    assert torch.equal(discounted_rtg(base_BT, torch.ones_like(base_BT), 0.5),
                       _adv(mu, te, cfg))
    # c_env = 0.5 × group_zscore over a group of 2 with rewards (1, 0): (+1, −1) per row
    cfg = AdvantageConfig("teacher_rkl", teacher_env_coef=0.5, env_advantage="group_zscore")
    a = _adv(mu * 2, te * 2, cfg, rewards=[1.0, 0.0], group_size=2)
    torch.testing.assert_close(a, torch.cat([base_BT + 0.5, base_BT - 0.5]), atol=1e-7, rtol=0)


def test_preset_settings() -> None:
    spec = METHODS["opd"]
    assert (spec.advantage.name, spec.objective.name, spec.objective.cap, spec.agg) == \
        ("teacher_rkl", "is_capped", 10.0, "token_mean")
    assert (spec.advantage.teacher_beta, spec.advantage.teacher_gamma,
            spec.advantage.teacher_env_coef) == (1.0, 0.0, 0.0)
    assert spec.needs_teacher and not spec.needs_teacher_distribution
    assert not spec.needs_groups and spec.kl.coef == 0


def _teacher_file(tmp_path: Path, seed: int = 1, vocab: int = 4,
                  dtype: str = "float64") -> Path:
    torch.manual_seed(seed)
    task = make_task("token_reversal", TaskConfig(vocab=vocab, seq_len=4))
    policy = make_policy_for(task, ModelConfig(dtype=dtype))
    path = tmp_path / f"teacher_{seed}_{vocab}.pt"
    torch.save({"policy": policy.state_dict()}, path)
    return path


def _cfg(method: str, teacher: str = "", components: MethodConfig | None = None,
         init: str = "", steps: int = 2, name: str = "run", tmp: str = ".",
         ) -> TrainConfig:
    return TrainConfig(
        method=method, components=components or MethodConfig(), task_options=TASK,
        model=ModelConfig(dtype="float64"), sampling=SamplingConfig(use_cache=False),
        teacher_options=TeacherConfig(teacher_path=teacher),
        run=RunConfig(num_steps=steps, batch_size=8, group_size=1, eval_every=0, name=name,
                      init=init, progress=False, device="cpu", runs_dir=tmp))


def test_rejected_without_a_teacher_or_with_a_useless_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="distils from a teacher: set --teacher_path"):
        validate(_cfg("opd"))
    with pytest.raises(ConfigError, match="reads no teacher"):
        validate(_cfg("reinforce", str(_teacher_file(tmp_path))))
    with pytest.raises(ConfigError, match="no such file"):
        validate(_cfg("opd", str(tmp_path / "missing.pt")))
    (tmp_path / "empty").mkdir()  # neither a run, an sft output nor a Hugging Face model
    with pytest.raises(ConfigError, match="is a directory that holds no teacher"):
        validate(_cfg("opd", str(tmp_path / "empty")))
    (tmp_path / "bad_hf").mkdir()  # a config.json that is not a model: refused at setup
    (tmp_path / "bad_hf" / "config.json").write_text("{}")
    with pytest.raises(ConfigError):
        setup(_cfg("opd", str(tmp_path / "bad_hf")))
    with pytest.raises(ConfigError, match=r"method.teacher_beta=0.0 must be > 0"):
        validate(_cfg("opd", "x", MethodConfig(teacher_beta=0.0)))
    with pytest.raises(ConfigError, match=r"so --teacher_env_coef needs run.group_size > 1"):
        validate(_cfg("opd", str(_teacher_file(tmp_path)), MethodConfig(teacher_env_coef=1.0)))
    with pytest.raises(ConfigError, match=r"method.env_advantage=.gae."):
        validate(_cfg("opd", "x", MethodConfig(teacher_env_coef=1.0, env_advantage="gae")))


def test_a_teacher_of_another_vocabulary_is_rejected_before_training(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not fit this policy"):
        setup(_cfg("opd", str(_teacher_file(tmp_path, vocab=6))))


class _TopK:
    """A teacher that returns top-k log-probs only."""

    vocab_size = 4
    full_distribution = False

    def logp_BTV(self, batch: object) -> torch.Tensor:
        raise AssertionError("not called")


def test_teacher_errors() -> None:
    assert isinstance(_TopK(), Teacher)
    assert teacher_errors(_TopK(), 4, needs_distribution=False) == []
    (error,) = teacher_errors(_TopK(), 4, needs_distribution=True)
    assert "full distribution" in error
    (error,) = teacher_errors(_TopK(), 5, needs_distribution=False)
    assert "vocabulary (4) differs from the student's (5)" in error


def test_the_loaded_teacher_is_a_frozen_policy(tmp_path: Path) -> None:
    """setup builds a `PolicyTeacher` from the checkpoint, with no trainable parameter."""
    parts = setup(_cfg("opd", str(_teacher_file(tmp_path)), tmp=str(tmp_path)))
    assert isinstance(parts.teacher, PolicyTeacher)
    teacher_params = dict(parts.teacher.policy.named_parameters())
    assert all(not p.requires_grad for p in teacher_params.values())


def _run(tmp_path: Path, name: str, teacher: Path, init: str = "",
         steps: int = 2) -> RunResult:
    return train(_cfg("opd", str(teacher), init=init, steps=steps, name=name,
                      tmp=str(tmp_path)))


def test_teacher_equal_to_student_gives_no_update(tmp_path: Path) -> None:
    """--init T --teacher_path T: A ≡ 0 (to rounding of the two forwards), so the policy loss
    and its gradient vanish and the reverse KL is 0."""
    teacher = _teacher_file(tmp_path)
    row = _run(tmp_path, "same", teacher, init=str(teacher), steps=1).metrics[0]
    assert abs(row["distill/teacher_rkl"]) < 1e-12 and abs(row["adv/abs_mean"]) < 1e-12
    assert abs(row["loss/policy"]) < 1e-12


def test_distillation_lowers_the_reverse_kl(tmp_path: Path) -> None:
    """From a random student toward another random policy, the sampled reverse KL to the
    teacher is positive and finite at the start."""
    rows = _run(tmp_path, "distil", _teacher_file(tmp_path, seed=7), steps=2).metrics
    assert rows[0]["distill/teacher_rkl"] > 0
    assert all(math.isfinite(r["distill/teacher_rkl_seq"]) for r in rows)


def test_a_hugging_face_directory_teaches_a_tiny_student(tmp_path: Path) -> None:
    """--teacher_path may be a local Hugging Face model of the task's vocabulary (here a
    config-built one-layer llama); the student is the tiny transformer."""
    from rlscope.policy.hf import tiny_hf_model

    vocab = make_policy_for(make_task("token_reversal", TASK), ModelConfig()).vocab_size
    tiny_hf_model("llama", vocab, hidden_size=16, num_layers=1, num_heads=2,
                  max_len=32).save_pretrained(tmp_path / "hf")
    result = train(TrainConfig(
        method="opd", task_options=TASK,
        teacher_options=TeacherConfig(teacher_path=str(tmp_path / "hf")),
        run=RunConfig(num_steps=2, batch_size=8, group_size=1, eval_every=0, progress=False,
                      device="cpu", runs_dir=str(tmp_path))))
    assert all(math.isfinite(r["distill/teacher_rkl"]) and r["distill/teacher_rkl"] != 0
               for r in result.metrics)
