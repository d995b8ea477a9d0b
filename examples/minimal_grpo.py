"""GRPO on token_reversal in one screen, written against rlscope's public pieces.

Every step: sample G completions per prompt with the KV-cached sampler, score them, keep the
groups whose rewards differ, z-score rewards within each group, and take PPO-clip steps with a
k3 KL penalty to the behaviour policy. `tests/test_examples.py` checks that one step of this
file gives exactly the parameters of one step of `rlscope.train.train` with the same seed.

    python examples/minimal_grpo.py --steps 100
"""

from __future__ import annotations

import argparse

import torch

from rlscope.learner import forward_completion
from rlscope.methods import resolve_method
from rlscope.methods.advantages import AdvantageInputs, group_zscore
from rlscope.methods.aggregation import aggregate
from rlscope.methods.objectives import PolicyTerms, ppo_clip
from rlscope.methods.regularizers import kl_estimate
from rlscope.methods.selection import mixed_groups
from rlscope.policy import ModelConfig
from rlscope.sampling import SampledDistribution, SamplingConfig, generate
from rlscope.tasks import TaskConfig, make_task
from rlscope.tasks.base import make_policy_for


def grpo_step(policy, optimizer, task, generator, batch_size=96, group_size=8,
              inner_epochs=1, grad_clip=1.0) -> dict[str, float]:
    spec = resolve_method("grpo")
    prompts = task.sample_prompts(generator, batch_size // group_size)
    prompts = prompts.repeat_interleave(group_size)
    row_seeds_B = torch.randint(0, 2**62, (prompts.batch_size,), generator=generator)
    policy.eval()
    batch = generate(policy, prompts, SamplingConfig(), row_seeds_B, task.completion_len)
    rewards_B = task.score(batch).rewards_B
    keep_B, _ = mixed_groups(rewards_B, group_size)
    batch, rewards_B = batch.select(keep_B), rewards_B[keep_B]
    mask_BT = batch.completion_mask_BT
    adv_BT = group_zscore(AdvantageInputs(rewards_B, mask_BT, group_size), spec.advantage)
    n_tokens = mask_BT.sum()
    policy.train()
    for _ in range(inner_epochs):
        # log π(a_t | prefix), teacher-forced; each group's shared prompt is computed once
        logp_BT = forward_completion(policy, batch, batch.completion_tokens_BT,
                                     SampledDistribution(1.0, replay_keep=True),
                                     group_size=group_size).logp_BT
        terms = PolicyTerms(logp_BT, batch.logp_sampler_BT, adv_BT, mask_BT)
        loss_BT, _ = ppo_clip(terms, spec.objective)
        kl_BT = kl_estimate(logp_BT, batch.logp_sampler_BT, spec.kl.estimator)
        loss = aggregate(loss_BT, mask_BT, "token_mean", n_tokens, 0.0, 0) \
            + spec.kl.coef * aggregate(kl_BT, mask_BT, "token_mean", n_tokens, 0.0, 0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(policy.parameters()), grad_clip)
        optimizer.step()
    return {"reward": float(rewards_B.mean()), "loss": float(loss.detach())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    task = make_task("token_reversal", TaskConfig())
    torch.manual_seed(args.seed)
    policy = make_policy_for(task, ModelConfig())
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3, weight_decay=0.0, fused=True)
    generator = torch.Generator().manual_seed(args.seed)
    for step in range(args.steps):
        stats = grpo_step(policy, optimizer, task, generator)
        if step % 10 == 0:
            print(f"step {step:4d}  reward {stats['reward']:.3f}  loss {stats['loss']:+.4f}")


if __name__ == "__main__":
    main()
