"""The issue-19 distillation and DeepSeek-V3.2 presets run 20 steps with finite metrics
(METHODS_2026.md, "Tests that must exist")."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rlscope.config import RunConfig, TrainConfig
from rlscope.methods import METHODS, MethodConfig
from rlscope.methods.teacher import TeacherConfig
from rlscope.policy import ModelConfig
from rlscope.tasks import TaskConfig, make_task
from rlscope.tasks.base import make_policy_for
from rlscope.train import train

TASK = TaskConfig(vocab=4, seq_len=4, eval_batches=1, eval_batch_size=8)

PRESETS = {
    "dsv32": ("gate/opsm_D_mean", "policy/kl_ref_is"),
    "opd": ("distill/teacher_rkl", "distill/teacher_rkl_seq"),
    "gkd": ("distill/jsd", "distill/rkl", "distill/fkl"),
}
"""Each preset and metrics of its own that every step must log."""


def _teacher(tmp_path: Path) -> str:
    """A random policy of the task's model, saved as an rlscope checkpoint."""
    torch.manual_seed(123)
    policy = make_policy_for(make_task("token_reversal", TASK), ModelConfig())
    path = tmp_path / "teacher.pt"
    torch.save({"policy": policy.state_dict()}, path)
    return str(path)


@pytest.mark.parametrize("method", sorted(PRESETS))
def test_twenty_steps_with_finite_metrics(tmp_path: Path, method: str) -> None:
    teacher = _teacher(tmp_path) if METHODS[method].needs_teacher else ""
    result = train(TrainConfig(
        method=method, components=MethodConfig(), task_options=TASK,
        teacher_options=TeacherConfig(teacher_path=teacher),
        run=RunConfig(num_steps=20, batch_size=8, group_size=4, eval_every=0, name=method,
                      progress=False, device="cpu", runs_dir=str(tmp_path))))
    assert len(result.metrics) == 20
    for row in result.metrics:
        for key in PRESETS[method]:
            assert key in row, key
        bad = {k: v for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)}
        assert not bad, bad
