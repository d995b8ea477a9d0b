"""The minimal GRPO example computes exactly what `train()` computes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

from rlscope.config import RunConfig, TrainConfig
from rlscope.policy import ModelConfig
from rlscope.tasks import TaskConfig, make_task
from rlscope.tasks.base import make_policy_for
from rlscope.train import train

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "minimal_grpo.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("minimal_grpo", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["minimal_grpo"] = module
    spec.loader.exec_module(module)
    return module


def test_minimal_grpo_first_update_equals_train(tmp_path: Path) -> None:
    """One step, fp64: the example's parameters equal train()'s to the last bit."""
    task_cfg = TaskConfig(seq_len=6, eval_batches=1, eval_batch_size=8)
    model_cfg = ModelConfig(dtype="float64")
    result = train(TrainConfig(
        method="grpo", task_options=task_cfg, model=model_cfg,
        run=RunConfig(num_steps=1, batch_size=32, group_size=4, inner_epochs=2, eval_every=0,
                      device="cpu", progress=False, runs_dir=str(tmp_path))))
    trained = torch.load(result.run_dir / "checkpoints" / "step_1.pt", weights_only=True)
    example = _load_example()
    task = make_task("token_reversal", task_cfg)
    torch.manual_seed(0)
    policy = make_policy_for(task, model_cfg)
    initial = {n: v.clone() for n, v in policy.state_dict().items()}
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3, weight_decay=0.0, fused=True)
    generator = torch.Generator().manual_seed(0)
    example.grpo_step(policy, optimizer, task, generator, batch_size=32, group_size=4,
                      inner_epochs=2)
    mine = policy.state_dict()
    for name, value in trained["policy"].items():
        assert torch.equal(mine[name], value), name
    assert any(not torch.equal(mine[n], v) for n, v in initial.items()), "no update happened"
