"""ReMax (Li et al. arXiv:2310.10505): the reward of a greedy rollout of the same prompt as the
baseline. The loop decodes every prompt greedily, scores it like the samples, and carries the
result on the batch through selection, staleness and replay to the advantage."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import torch

from rlscope.batch import PromptBatch
from rlscope.config import RunConfig, TrainConfig, validate
from rlscope.learner import prepare
from rlscope.methods.spec import OverlongConfig
from rlscope.policy import ModelConfig
from rlscope.replay import ReplayConfig
from rlscope.sampling import SamplingConfig, generate
from rlscope.sampling.processors import SampledDistribution
from rlscope.tasks import TaskConfig
from rlscope.tasks.base import make_policy_for
from rlscope.train import greedy_rewards, sample_rollouts, score_rollouts, train

TASK = TaskConfig(seq_len=4, eval_batches=1, eval_batch_size=16)


def _cfg(tmp_path: Path, method: str = "remax", task_options: TaskConfig = TASK,
         **run: Any) -> TrainConfig:
    return TrainConfig(method=method, task_options=task_options, run=RunConfig(**{
        "num_steps": 3, "batch_size": 16, "eval_every": 0, "progress": False, "device": "cpu",
        "runs_dir": str(tmp_path), **run}))


def test_remax_preset_declares_the_greedy_baseline() -> None:
    spec, _, _ = validate(TrainConfig(method="ReMax"))
    assert spec.advantage.name == "remax" and spec.gate.name == "none"
    assert spec.objective.name == "score" and spec.agg == "token_mean"
    assert spec.needs_greedy_baseline
    assert not validate(TrainConfig(method="reinforce"))[0].needs_greedy_baseline


def test_advantage_is_reward_minus_the_greedy_rollouts_reward(tmp_path: Path) -> None:
    """On a real batch with groups of 2: the greedy reward is the task's score of the argmax
    decode of the row's prompt, equal within a group, and A = (r − r_greedy) on every valid
    token."""
    cfg = _cfg(tmp_path, group_size=2)
    spec, task, d = validate(cfg)
    torch.manual_seed(0)
    policy = make_policy_for(task, cfg.model)
    g = torch.Generator().manual_seed(0)
    rollout = sample_rollouts(policy, task, cfg, g, torch.device("cpu"), d.num_prompts,
                              d.group_size, d.max_new_tokens)
    batch = score_rollouts(rollout, policy, task, cfg, False, 0)
    greedy_B = greedy_rewards(rollout, policy, task, cfg, spec.overlong, d.group_size,
                              d.max_new_tokens, 0)
    assert greedy_B.shape == (16,) and torch.equal(greedy_B[0::2], greedy_B[1::2])
    # independent path: argmax decoding of each row's prompt, scored by the task
    prompts = task.sample_prompts(torch.Generator().manual_seed(0), d.num_prompts)
    assert torch.equal(prompts.tokens_BP.repeat_interleave(2, 0), rollout.prompt_tokens_BP)
    greedy = generate(policy, prompts, SamplingConfig(temperature=0.0),
                      torch.zeros(d.num_prompts, dtype=torch.long), d.max_new_tokens)
    assert torch.equal(greedy.completion_tokens_BT,
                       policy(torch.cat([prompts.tokens_BP, greedy.completion_tokens_BT], 1))[0]
                       [:, prompts.tokens_BP.shape[1] - 1:-1].argmax(-1))
    assert torch.equal(greedy_B, task.score(greedy).rewards_B.repeat_interleave(2))
    assert bool((greedy_B != batch.rewards_B).any()), "baseline equals every reward: vacuous"

    batch = dataclasses.replace(batch, greedy_rewards_B=greedy_B)
    inputs, _ = prepare(spec, batch, policy, None, None, 0.0, d.group_size,
                        SampledDistribution(1.0, False))
    assert batch.rewards_B is not None
    expected_BT = (batch.rewards_B - greedy_B)[:, None] * batch.completion_mask_BT
    torch.testing.assert_close(inputs.adv_BT, expected_BT, atol=0, rtol=0)
    # the field follows row selection like every batched tensor
    picked = batch.select(torch.tensor([3, 0]))
    assert picked.greedy_rewards_B is not None
    assert picked.greedy_rewards_B.tolist() == [greedy_B[3].item(), greedy_B[0].item()]


def _finite(rows: list[dict[str, float]]) -> None:
    for row in rows:
        bad = [k for k, v in row.items() if not math.isfinite(v)]
        assert not bad, bad


def test_remax_20_steps_finite_with_greedy_metric(tmp_path: Path) -> None:
    result = train(_cfg(tmp_path, num_steps=20, name="plain"))
    assert result.status == "completed" and len(result.metrics) == 20
    _finite(result.metrics)
    greedy = [r["reward/greedy_mean"] for r in result.metrics]
    assert all(0.0 <= v <= 1.0 for v in greedy)


def test_greedy_baseline_survives_delay_and_replay(tmp_path: Path) -> None:
    """The trained batch comes from the staleness queue or the replay buffer, and still carries
    its greedy rewards (prepare raises without them)."""
    delayed = train(_cfg(tmp_path, num_steps=5, delay=2, name="delay"))
    assert [r["step"] for r in delayed.metrics] == [0, 1, 2, 3, 4]  # warm-up trains too
    replayed = train(dataclasses.replace(_cfg(tmp_path, num_steps=5, delay=1, name="replay"),
                                         replay=ReplayConfig(replay_capacity=3)))
    for result in (delayed, replayed):
        _finite(result.metrics)
        assert all("reward/greedy_mean" in r for r in result.metrics)


def test_greedy_decode_leaves_the_samples_and_their_noise_unchanged(tmp_path: Path) -> None:
    """The greedy decode draws nothing from the sampling stream: step 0 of remax samples and
    corrupts exactly as reinforce does."""
    noisy = dataclasses.replace(TASK, reward_noise=0.3, reward_noise_mode="random_reward")
    remax = train(_cfg(tmp_path, task_options=noisy, num_steps=1, name="remax"))
    reinforce = train(_cfg(tmp_path, "reinforce", task_options=noisy, num_steps=1,
                           name="reinforce"))
    a, b = remax.metrics[0], reinforce.metrics[0]
    for key in ("reward/mean", "reward/raw_mean", "reward/noise_rate", "length/mean",
                "policy/entropy_sampled"):
        assert a[key] == b[key], key
    assert a["reward/noise_rate"] > 0


def test_greedy_reward_gets_the_training_noise_from_its_own_stream(tmp_path: Path) -> None:
    """The baseline is the reward function the samples get, training noise included, drawn
    from a stream of its own: with every reward replaced by a uniform (random_reward, noise 1),
    the greedy rewards are uniforms too, none equal to the sample in the same row (one shared
    stream would give equal values row by row)."""
    cfg = _cfg(tmp_path, task_options=dataclasses.replace(
        TASK, reward_noise=1.0, reward_noise_mode="random_reward"))
    spec, task, d = validate(cfg)
    torch.manual_seed(0)
    policy = make_policy_for(task, cfg.model)
    rollout = sample_rollouts(policy, task, cfg, torch.Generator().manual_seed(0),
                              torch.device("cpu"), d.num_prompts, d.group_size,
                              d.max_new_tokens)
    batch = score_rollouts(rollout, policy, task, cfg, False, 0)
    greedy_B = greedy_rewards(rollout, policy, task, cfg, spec.overlong, d.group_size,
                              d.max_new_tokens, 0)
    assert batch.rewards_B is not None and batch.noise_B is not None and batch.noise_B.all()
    assert not bool((greedy_B == batch.rewards_B).any())
    # clean token_reversal rewards on 4 positions are multiples of 1/4; uniforms are not
    assert not bool(((greedy_B * 4) == (greedy_B * 4).round()).any())


def test_greedy_reward_gets_the_overlong_shaping_of_its_own_length(tmp_path: Path) -> None:
    # L_max = 4, L_buf = 1: a greedy completion of 4 tokens loses 1, a shorter one nothing —
    # the same shaping the samples get. The stop token is content token 1 (this untrained
    # policy's greedy decode starts every row with SEP, which would stop every row at once).
    # Under the balanced init this seed's untrained greedy rows have both lengths.
    cfg = dataclasses.replace(_cfg(tmp_path), sampling=SamplingConfig(stop_token_ids=(1,)),
                              model=ModelConfig(embed_init="balanced"))
    _, task, d = validate(cfg)
    torch.manual_seed(1)
    policy = make_policy_for(task, cfg.model)
    rollout = sample_rollouts(policy, task, cfg, torch.Generator().manual_seed(0),
                              torch.device("cpu"), d.num_prompts, 1, d.max_new_tokens)
    args = (1, d.max_new_tokens, 0)
    plain_B = greedy_rewards(rollout, policy, task, cfg, OverlongConfig(), *args)
    shaped_B = greedy_rewards(rollout, policy, task, cfg, OverlongConfig("penalty"), *args)
    prompts = PromptBatch(rollout.prompt_tokens_BP, targets_BT=rollout.targets_BT)
    greedy = generate(policy, prompts, SamplingConfig(temperature=0.0, stop_token_ids=(1,)),
                      torch.zeros(16, dtype=torch.long), d.max_new_tokens)
    length_B = greedy.completion_mask_BT.sum(-1)
    assert 0 < int((length_B == 4).sum()) < 16, "need greedy rows of both kinds"
    torch.testing.assert_close(shaped_B - plain_B, -(length_B == 4).float())
