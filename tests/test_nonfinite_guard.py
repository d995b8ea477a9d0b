"""A non-finite gradient never reaches the weights: the eager learner skips that optimizer step
and the loop reports it as optim/nonfinite_steps."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from rlscope.config import RunConfig, TrainConfig
from rlscope.learner import UpdatePlan, prepare, update
from rlscope.methods import MethodConfig, resolve_method
from rlscope.policy.tiny import TinyConfig, TinyTransformer
from rlscope.sampling import SamplingConfig, generate
from rlscope.sampling.processors import SampledDistribution
from rlscope.tasks import TaskConfig, make_task
from rlscope.train import train


def _batch(policy: TinyTransformer) -> tuple[object, object]:
    task = make_task("token_reversal", TaskConfig(seq_len=4))
    g = torch.Generator().manual_seed(0)
    prompts = task.sample_prompts(g, 16)
    batch = generate(policy, prompts, SamplingConfig(), torch.arange(16), 4)
    rewards_B = task.score(batch).rewards_B
    return dataclasses.replace(batch, rewards_B=rewards_B, raw_rewards_B=rewards_B), task


def test_a_nan_gradient_skips_the_step_and_leaves_the_weights() -> None:
    spec = resolve_method("reinforce", MethodConfig())
    torch.manual_seed(0)
    policy = TinyTransformer(TinyConfig(vocab_size=3, max_len=9))
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    plan = UpdatePlan(spec=spec, inner_epochs=2, num_minibatches=1, micro_batch_size=16,
                      max_len=4, grad_clip=1.0, dist=SampledDistribution(1.0, True))
    batch, _ = _batch(policy)
    inputs, _ = prepare(spec, batch, policy, None, None, 0.0, 1, SampledDistribution(1.0, True))
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    calls = {"n": 0}

    def poison(grad: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        return grad * float("nan") if calls["n"] == 1 else grad

    handle = policy.head.weight.register_hook(poison)
    result = update(plan, policy, None, optimizer, batch, inputs, 0.0)
    handle.remove()
    norms = result.grad_norms_S
    assert norms.shape == (2,) and torch.isnan(norms[0]) and torch.isfinite(norms[1])
    after = policy.state_dict()
    assert all(torch.isfinite(v).all() for v in after.values())
    # the first (poisoned) step was skipped, the second one trained
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert optimizer.state[policy.head.weight]["step"] == 1


def test_the_loop_reports_skipped_steps(tmp_path: Path) -> None:
    cfg = TrainConfig(method="grpo", task_options=TaskConfig(seq_len=4, eval_batches=1,
                                                             eval_batch_size=8),
                      run=RunConfig(num_steps=2, batch_size=16, eval_every=0, device="cpu",
                                    progress=False, runs_dir=str(tmp_path), doctor_every=0))
    result = train(cfg)
    assert [m["optim/nonfinite_steps"] for m in result.metrics] == [0.0, 0.0]
