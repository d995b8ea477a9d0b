"""The cached multi-turn episode sampler, training on episodes, and their diagnostics (issue 20).

Environments: tests/episode_envs.py (deterministic, vocabulary 8, turn stop token 1).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
import torch
from episode_envs import (
    STOP,
    TARGET,
    VOCAB,
    EchoFactory,
    EndlessFactory,
    RaisingFactory,
)

from rlscope import learner
from rlscope.batch import RolloutBatch
from rlscope.cli import main
from rlscope.doctor.findings import DoctorConfig, Unavailable
from rlscope.doctor.rules import RULES
from rlscope.doctor.table import MetricTable
from rlscope.envs import DONE_REASONS, EpisodeBudget
from rlscope.learner import Denominators, forward_completion, micro_batch_loss, prepare
from rlscope.methods import MethodConfig, resolve_method
from rlscope.policy import ModelConfig, build_policy
from rlscope.sampling.draw import SamplingConfig
from rlscope.sampling.episodes import episode_loss_metrics, episode_metrics, generate_episodes
from rlscope.sampling.processors import SampledDistribution
from rlscope.tasks import TASKS, TaskConfig
from rlscope.tasks.base import Interactive, Task
from rlscope.tasks.episodes import PROMPT_MARGIN, EpisodeTask, episode_returns

ENV_SEEDS = torch.tensor([0, 0, 1, 1, 2, 2, 5, 5])
"""Four groups of two rows; initial observations of 2, 3 and 4 tokens (left padding)."""
ROW_SEEDS = torch.arange(ENV_SEEDS.numel()) + 100
BUDGET = EpisodeBudget(max_turns=4, max_turn_tokens=4, max_episode_tokens=40)


def tiny_policy(seed: int = 0) -> Any:
    torch.manual_seed(seed)
    return build_policy(ModelConfig(), VOCAB, 64)


def sample(policy: Any, cfg: SamplingConfig, factory: Any = None,
           budget: EpisodeBudget = BUDGET) -> RolloutBatch:
    return generate_episodes(policy, factory or EchoFactory(), ENV_SEEDS, budget, cfg,
                             ROW_SEEDS, group_id_B=torch.arange(4).repeat_interleave(2))


class FixedPolicy(torch.nn.Module):
    """Prefers ``token`` at every position (logit 5, the others 0), cache-free."""

    def __init__(self, token: int) -> None:
        super().__init__()
        self.vocab_size, self.hidden_size = VOCAB, 1
        self.logits_V = torch.nn.Parameter(torch.zeros(VOCAB))
        with torch.no_grad():
            self.logits_V[token] = 5.0

    def forward(self, tokens_BT: torch.Tensor, attention_mask_BT: Any = None) -> Any:
        B, T = tokens_BT.shape
        return self.logits_V.expand(B, T, VOCAB), torch.zeros(B, T, 1)

    def init_cache(self, batch_size: int, max_len: int) -> None:
        return None

    def prefill(self, tokens_BT: torch.Tensor, attention_mask_BT: Any, cache: Any) -> Any:
        return self.logits_V.expand(tokens_BT.shape[0], VOCAB)

    def decode_step(self, tokens_B: torch.Tensor, cache: Any) -> Any:
        return self.logits_V.expand(tokens_B.shape[0], VOCAB)


GREEDY = SamplingConfig(temperature=0.0)


def one_row(policy: Any, factory: Any, budget: EpisodeBudget) -> RolloutBatch:
    return generate_episodes(policy, factory, torch.tensor([3]), budget, GREEDY,
                             torch.tensor([0]))


# ---------------------------------------------------------------- the cached sampler


@pytest.mark.parametrize("cfg", [SamplingConfig(), SamplingConfig(temperature=0.7, top_k=5),
                                 GREEDY], ids=["t1", "topk", "greedy"])
def test_cached_episodes_equal_recomputing_every_turn(cfg):
    policy = tiny_policy()
    cached = sample(policy, cfg)
    scratch = sample(policy, SamplingConfig(**{**cfg.__dict__, "use_cache": False}))
    assert torch.equal(cached.completion_tokens_BT, scratch.completion_tokens_BT)
    assert torch.equal(cached.completion_mask_BT, scratch.completion_mask_BT)
    assert torch.equal(cached.env_mask_BT, scratch.env_mask_BT)
    torch.testing.assert_close(cached.logp_sampler_BT, scratch.logp_sampler_BT,
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(cached.logp_raw_BT, scratch.logp_raw_BT, atol=1e-5, rtol=0)
    # the batch holds real multi-turn episodes: environment tokens between policy turns
    assert cached.env_mask_BT is not None and cached.env_mask_BT.sum() > 0
    assert cached.turns_B is not None and int(cached.turns_B.max()) >= 2


def test_episode_logprobs_equal_a_single_forward_over_the_same_tokens():
    policy = tiny_policy(1)
    batch = sample(policy, SamplingConfig(temperature=0.7, top_k=5))
    mask_BT = batch.completion_mask_BT.bool()
    # the learner's forward (replayed temperature and kept set) gives the sampler's log-probs
    fwd = forward_completion(policy, batch, batch.completion_tokens_BT,
                             SampledDistribution(0.7, replay_keep=True))
    torch.testing.assert_close(fwd.logp_BT[mask_BT], batch.logp_sampler_BT[mask_BT],
                               atol=1e-5, rtol=0)
    # and each row alone, unpadded, in one plain forward, gives the raw log-probs
    assert batch.prompt_mask_BP is not None
    for i in range(batch.batch_size):
        prompt = batch.prompt_tokens_BP[i][batch.prompt_mask_BP[i].bool()]
        full = torch.cat([prompt, batch.completion_tokens_BT[i]])[None]
        logp_LV = policy.forward(full)[0][0].log_softmax(-1)
        P = prompt.numel()
        logp_T = logp_LV[P - 1:-1].gather(-1, batch.completion_tokens_BT[i][:, None])[:, 0]
        torch.testing.assert_close(logp_T[mask_BT[i]], batch.logp_raw_BT[i][mask_BT[i]],
                                   atol=1e-5, rtol=0)
    # environment tokens carry log-prob 0 and are never in the loss mask
    assert batch.env_mask_BT is not None
    env = batch.env_mask_BT.bool()
    assert not (env & mask_BT).any()
    assert float(batch.logp_sampler_BT[env].abs().sum()) == 0.0


def test_rows_of_a_group_share_their_start_and_environment_tokens_follow_the_rules():
    batch = sample(tiny_policy(2), SamplingConfig())
    assert torch.equal(batch.prompt_tokens_BP[0::2], batch.prompt_tokens_BP[1::2])
    assert batch.env_mask_BT is not None and batch.turn_BT is not None
    for i in range(batch.batch_size):
        tokens = batch.completion_tokens_BT[i].tolist()
        env = batch.env_mask_BT[i].bool().tolist()
        turn = batch.turn_BT[i].tolist()
        # every observation of the echo environment is sixes then a seven, answering the
        # policy turn it follows (same turn index)
        t = 0
        while t < len(tokens):
            if env[t]:
                start = t
                while t < len(tokens) and env[t]:
                    t += 1
                segment = tokens[start:t]
                assert segment[-1] == 7 and set(segment[:-1]) == {6}
                assert turn[start - 1] == turn[start] == turn[t - 1]
            t += 1


# ---------------------------------------------------------------- budgets and ends


def test_max_turns_truncation():
    b = one_row(FixedPolicy(STOP), EndlessFactory(answer_len=2),
                EpisodeBudget(max_turns=3, max_turn_tokens=4, max_episode_tokens=64))
    assert b.completion_tokens_BT[0].tolist() == [1, 6, 6, 1, 6, 6, 1]
    assert b.completion_mask_BT[0].tolist() == [1, 0, 0, 1, 0, 0, 1]
    assert b.turn_BT is not None and b.turn_BT[0].tolist() == [0, 0, 0, 1, 1, 1, 2]
    assert b.end_reason_B is not None and DONE_REASONS[int(b.end_reason_B[0])] == "max_turns"
    assert b.turn_rewards_BK is not None and b.turn_rewards_BK[0].tolist() == [0.25] * 3
    assert b.turns_B is not None and int(b.turns_B[0]) == 3
    assert not bool(b.finished_by_stop_B[0])
    assert float(episode_metrics(b)["episode/truncated_frac/max_turns"]) == 1.0


def test_max_turn_tokens_truncation():
    b = one_row(FixedPolicy(2), EndlessFactory(answer_len=2),
                EpisodeBudget(max_turns=2, max_turn_tokens=3, max_episode_tokens=64))
    assert b.completion_tokens_BT[0].tolist() == [2, 2, 2, 6, 6, 2, 2, 2]
    assert b.end_reason_B is not None
    assert DONE_REASONS[int(b.end_reason_B[0])] == "max_turn_tokens"
    assert float(episode_metrics(b)["episode/truncated_frac/max_turn_tokens"]) == 1.0


def test_max_episode_tokens_truncation():
    b = one_row(FixedPolicy(STOP), EndlessFactory(answer_len=2),
                EpisodeBudget(max_turns=50, max_turn_tokens=4, max_episode_tokens=5))
    assert b.completion_tokens_BT[0].tolist() == [1, 6, 6, 1, 6]
    assert b.end_reason_B is not None
    assert DONE_REASONS[int(b.end_reason_B[0])] == "max_episode_tokens"
    m = episode_metrics(b)
    assert float(m["episode/truncated_frac/max_episode_tokens"]) == 1.0
    assert float(m["episode/policy_tokens"]) == 2.0 and float(m["episode/env_tokens"]) == 3.0


def test_environment_ends_the_episode_solved():
    b = one_row(FixedPolicy(TARGET), EchoFactory(),
                EpisodeBudget(max_turns=3, max_turn_tokens=2, max_episode_tokens=20))
    assert b.completion_tokens_BT[0].tolist() == [TARGET, TARGET]
    assert b.end_reason_B is not None and DONE_REASONS[int(b.end_reason_B[0])] == "solved"
    assert bool(b.finished_by_stop_B[0])
    assert float(episode_metrics(b)["episode/solved_frac"]) == 1.0


def test_a_raising_environment_ends_its_episode_failed_and_counts_an_error():
    b = one_row(FixedPolicy(STOP), RaisingFactory(),
                EpisodeBudget(max_turns=3, max_turn_tokens=2, max_episode_tokens=20))
    assert b.end_reason_B is not None and DONE_REASONS[int(b.end_reason_B[0])] == "failed"
    m = episode_metrics(b)
    assert float(m["env/errors"]) == 1.0
    assert float(m["env/time"]) >= 0.0


# ---------------------------------------------------------------- training on episodes


def test_loss_gradient_is_exactly_zero_on_environment_tokens(monkeypatch):
    policy = tiny_policy(3)
    batch = sample(policy, SamplingConfig())
    batch = RolloutBatch(**{**batch.__dict__,
                            "rewards_B": torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 0.2, 0.0, 1.0])})
    spec = resolve_method("grpo", MethodConfig())
    dist = SampledDistribution(1.0, True)
    inputs, _ = prepare(spec, batch, policy, None, None, 0.0, 2, dist)
    assert batch.env_mask_BT is not None
    env = batch.env_mask_BT.bool()
    assert float(episode_loss_metrics(batch.env_mask_BT, inputs.mask_BT)[
        "episode/env_tokens_in_loss"]) == 0.0
    captured: dict[str, torch.Tensor] = {}
    real = learner.forward_completion

    def run(plant: float) -> torch.Tensor:
        def spy(*args: Any, **kwargs: Any) -> Any:
            fwd = real(*args, **kwargs)
            # a planted change of the environment tokens' log-probs must not reach the loss
            logp_BT = fwd.logp_BT + plant * env
            logp_BT.retain_grad()
            captured["logp"] = logp_BT
            return learner.Forward(logp_BT, fwd.logp_BTV, fwd.hidden_BTD, fwd.logits_BTV)

        monkeypatch.setattr(learner, "forward_completion", spy)
        policy.zero_grad()
        out = micro_batch_loss(spec, policy, None, batch, inputs,
                               Denominators.of(inputs, 0, batch.batch_size, 40), 0.0, dist, 2)
        out.loss.backward()
        return out.loss.detach()

    loss = run(0.0)
    grad_BT = captured["logp"].grad
    assert grad_BT is not None
    assert float(grad_BT[env].abs().max()) == 0.0
    assert float(grad_BT[batch.completion_mask_BT.bool()].abs().max()) > 0.0
    assert torch.equal(run(-3.0), loss)
    # the planted bug (environment tokens inside the loss mask) shows in the metric
    planted = episode_loss_metrics(batch.env_mask_BT, inputs.mask_BT + batch.env_mask_BT)
    assert float(planted["episode/env_tokens_in_loss"]) == 1.0


def test_episode_task_scores_discounted_returns_and_is_interactive():
    task = EpisodeTask("echo_test", EchoFactory(turn_reward=0.5),
                       TaskConfig(turn_discount=0.5, max_turns=3))
    assert isinstance(task, Interactive) and isinstance(task, Task)
    rewards_BK = torch.tensor([[0.5, 0.5, 1.0], [1.0, 0.0, 0.0]])
    assert episode_returns(rewards_BK, 0.5).tolist() == [0.5 + 0.25 + 0.25, 1.0]
    prompts = task.sample_prompts(torch.Generator().manual_seed(0), 4)
    assert prompts.env_seeds_B is not None and prompts.env_seeds_B.shape == (4,)
    # the longest initial observation (2 3 4 4) and the margin for lengths that vary
    assert task.prompt_len == 4 + PROMPT_MARGIN
    assert task.traits.stop_token_ids == (STOP,)
    assert task.validate() == []
    assert any("turn_discount" in e for e in EpisodeTask(
        "echo_test", EchoFactory(), TaskConfig(turn_discount=0.0)).validate())
    assert any("max_episode_tokens" in e for e in EpisodeTask(
        "echo_test", EchoFactory(), TaskConfig(max_turn_tokens=32,
                                                max_episode_tokens=16)).validate())


@pytest.fixture
def echo_task(monkeypatch):
    monkeypatch.setitem(TASKS, "echo_test",
                        lambda cfg: EpisodeTask("echo_test", EchoFactory(exact=True), cfg))


EPISODE_RUN = ["--task", "echo_test", "--batch_size", "16", "--group_size", "4",
               "--max_turns", "3", "--max_turn_tokens", "4", "--max_episode_tokens", "24",
               "--eval_batches", "1", "--eval_batch_size", "8", "--device", "cpu",
               "--no_progress", "--turn_discount", "0.9"]


def test_grpo_trains_on_episodes_for_20_steps(echo_task, tmp_path):
    rc = main(["train", "--method", "grpo", "--num_steps", "20", "--eval_every", "10",
               *EPISODE_RUN, "--runs_dir", str(tmp_path), "--name", "ep"])
    assert rc == 0
    records = [json.loads(line) for line in (tmp_path / "ep" / "metrics.jsonl").open()]
    assert len(records) == 20
    for r in records:
        assert all(math.isfinite(v) for v in r.values()), r
        assert r["episode/env_tokens_in_loss"] == 0.0
        assert 1.0 <= r["episode/turns"] <= 3.0
        assert r["episode/env_tokens"] > 0.0 or r["episode/solved_frac"] == 1.0
        assert abs(sum(r[f"episode/truncated_frac/{k}"] for k in
                       ("max_turns", "max_turn_tokens", "max_episode_tokens"))
                   + r["episode/solved_frac"] - 1.0) < 1e-6  # echo: solved or truncated
    evals = [json.loads(line) for line in (tmp_path / "ep" / "eval.jsonl").open()]
    assert [e["step"] for e in evals] == [0, 10, 20]
    for e in evals:
        assert 0.0 <= e["eval/success"] <= 1.0
        assert e["eval/test_error"] == pytest.approx(1.0 - e["eval/success"])
        assert 1.0 <= e["eval/turns"] <= 3.0
    samples = [json.loads(line) for line in (tmp_path / "ep" / "samples.jsonl").open()]
    assert samples
    for sample_row in samples:  # the whole episode, its environment tokens marked
        assert len(sample_row["env_mask"]) == len(sample_row["completion"])
        env_tokens = [t for t, e in zip(sample_row["completion"], sample_row["env_mask"],
                                        strict=True) if e]
        assert set(env_tokens) <= {6, 7}
    assert any(any(sample_row["env_mask"]) for sample_row in samples)
    findings = json.loads((tmp_path / "ep" / "findings.json").read_text())["findings"]
    assert findings and "env_tokens_in_loss" not in [f["id"] for f in findings]


@pytest.mark.parametrize(("method", "reason"), [
    ("ppo", "value head"), ("vapo", "value head"), ("grpo_token", "candidates"),
    ("scope_lite", "per-token labels"), ("ce", "ground-truth labels")])
def test_a_method_invalid_on_episodes_is_refused_with_its_reason(echo_task, tmp_path, capsys,
                                                                method, reason):
    rc = main(["train", "--method", method, "--num_steps", "1", *EPISODE_RUN,
               "--runs_dir", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert reason in err
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_episode_options_are_refused_on_a_single_turn_task(tmp_path, capsys):
    rc = main(["train", "--task", "token_reversal", "--max_turns", "3", "--num_steps", "1",
               "--device", "cpu", "--no_progress", "--runs_dir", str(tmp_path)])
    assert rc == 2
    assert "max_turns" in capsys.readouterr().err


@pytest.mark.parametrize(("option", "reason"), [
    (["--max_new_tokens", "8"], "--max_episode_tokens"),
    (["--stop_token_ids", "2"], "turn stop tokens [1]"),
    (["--backend", "static"], "eager backend"),
    (["--env_processes", "-1"], "task.env_processes=-1"),
    (["--turn_discount", "1.5"], "(0, 1]")])
def test_sampling_options_episodes_cannot_honour_are_refused(echo_task, tmp_path, capsys,
                                                              option, reason):
    rc = main(["train", "--num_steps", "1", *EPISODE_RUN, *option, "--runs_dir", str(tmp_path)])
    assert rc == 2
    assert reason in capsys.readouterr().err


def test_an_episode_run_resumes_exactly(echo_task, tmp_path):
    run = [*EPISODE_RUN, "--eval_every", "0", "--checkpoint_every", "2", "--delay", "1",
           "--runs_dir", str(tmp_path)]
    assert main(["train", "--method", "grpo", "--num_steps", "4", "--name", "whole", *run]) == 0
    assert main(["train", "--method", "grpo", "--num_steps", "2", "--name", "cut", *run]) == 0
    assert main(["train", "--method", "grpo", "--num_steps", "4", "--resume",
                 str(tmp_path / "cut"), *run]) == 0

    def records(name: str) -> list[dict[str, float]]:
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(("time/",
                                                                                 "env/time",
                                                                                 "throughput/"))}
                for line in (tmp_path / name / "metrics.jsonl").open()]

    assert records("cut") == records("whole")


# ---------------------------------------------------------------- doctor rules

N = 40
STEPS = np.arange(N, dtype=float)


def table(series: dict[str, Any]) -> MetricTable:
    t = MetricTable(source="synthetic", fmt="test", config={})
    for name, values in series.items():
        values = np.broadcast_to(np.asarray(values, dtype=float), (N,))
        for s, v in zip(STEPS, values, strict=True):
            t.add(float(s), name, float(v))
    return t


HEALTHY = {"episode/turns": 2.0, "episode/env_tokens_in_loss": 0.0,
           "episode/truncated_frac/max_turns": 0.05,
           "episode/truncated_frac/max_turn_tokens": 0.02, "env/time": 0.1, "time/step": 1.0}


def fired(out: Any, rule_id: str) -> Any:
    assert isinstance(out, list) and len(out) == 1 and out[0].id == rule_id, out
    return out[0]


def test_env_tokens_in_loss_rule():
    frac = np.where(STEPS >= 12, 0.4, 0.0)
    f = fired(RULES["env_tokens_in_loss"](table(HEALTHY | {"episode/env_tokens_in_loss": frac}),
                                          DoctorConfig()), "env_tokens_in_loss")
    assert f.severity == "critical" and f.step == 12.0 and f.evidence["max"] == 0.4
    assert RULES["env_tokens_in_loss"](table(HEALTHY), DoctorConfig()) == []


def test_turn_budget_exhaustion_rule():
    planted = HEALTHY | {"episode/truncated_frac/max_turns": np.linspace(0.1, 0.6, N)}
    f = fired(RULES["turn_budget_exhaustion"](table(planted), DoctorConfig()),
              "turn_budget_exhaustion")
    assert f.evidence["last_window_mean"] > 0.5 and f.evidence["budget"] == "max_turns"
    assert f.actions[0] == "raise --max_turns"
    assert RULES["turn_budget_exhaustion"](table(HEALTHY), DoctorConfig()) == []
    # on a multi-turn run the single-turn truncation rule defers to it
    out = RULES["truncation"](table(planted | {"length/clip_ratio": 0.6}), DoctorConfig())
    assert isinstance(out, Unavailable) and out.reason == "config"


def test_env_time_dominates_rule():
    f = fired(RULES["env_time_dominates"](table(HEALTHY | {"env/time": 0.8}), DoctorConfig()),
              "env_time_dominates")
    assert f.evidence["median_share"] == 0.8
    assert RULES["env_time_dominates"](table(HEALTHY), DoctorConfig()) == []


@pytest.mark.parametrize("rule_id", ["env_tokens_in_loss", "turn_budget_exhaustion",
                                     "env_time_dominates"])
def test_episode_rules_do_not_apply_to_single_turn_runs(rule_id):
    single = table({"reward/mean": 0.5, "time/step": 1.0, "env/time": 0.9})
    assert RULES[rule_id](single, DoctorConfig()) == []
    assert isinstance(RULES[rule_id](MetricTable(source="empty", fmt="test"), DoctorConfig()),
                      Unavailable)


def test_remax_baseline_on_episodes_is_a_greedy_episode_per_group(echo_task, tmp_path):
    from rlscope.config import RunConfig, TrainConfig
    from rlscope.methods.spec import OverlongConfig
    from rlscope.train import greedy_rewards

    task = TASKS["echo_test"](TaskConfig(max_turns=3, max_turn_tokens=4, max_episode_tokens=24))
    assert isinstance(task, EpisodeTask)
    policy = tiny_policy(4)
    rollout = generate_episodes(policy, task.factory, ENV_SEEDS, task.budget, SamplingConfig(),
                                ROW_SEEDS)
    cfg = TrainConfig(method="remax", task="echo_test", run=RunConfig(device="cpu"))
    got_B = greedy_rewards(rollout, policy, task, cfg, OverlongConfig(), 2, 24, 0)
    greedy = generate_episodes(policy, task.factory, ENV_SEEDS[::2], task.budget, GREEDY,
                               torch.zeros(4, dtype=torch.long))
    assert torch.equal(got_B, task.score(greedy).rewards_B.repeat_interleave(2))
    rc = main(["train", "--method", "remax", "--num_steps", "3", "--eval_every", "0",
               *EPISODE_RUN, "--runs_dir", str(tmp_path), "--name", "remax"])
    assert rc == 0
    records = [json.loads(line) for line in (tmp_path / "remax" / "metrics.jsonl").open()]
    assert all(0.0 <= r["reward/greedy_mean"] <= 1.0 for r in records)


def test_environments_in_worker_processes_give_the_same_episodes():
    from episode_envs import SlowEchoFactory

    from rlscope.sampling.episodes import EpisodePool

    policy = tiny_policy(5)
    factory = SlowEchoFactory(seconds=0.01)
    here = sample(policy, SamplingConfig(), factory)
    pool = EpisodePool(2)
    try:
        there = sample(policy, SamplingConfig(), factory)
        pooled = generate_episodes(policy, factory, ENV_SEEDS, BUDGET, SamplingConfig(),
                                   ROW_SEEDS, group_id_B=torch.arange(4).repeat_interleave(2),
                                   pool=pool)
    finally:
        pool.close()
    assert torch.equal(here.completion_tokens_BT, there.completion_tokens_BT)
    for name in ("completion_tokens_BT", "completion_mask_BT", "env_mask_BT", "turn_BT",
                 "turn_rewards_BK", "turns_B", "end_reason_B", "finished_by_stop_B"):
        assert torch.equal(getattr(pooled, name), getattr(here, name)), name
    torch.testing.assert_close(pooled.logp_sampler_BT, here.logp_sampler_BT, atol=1e-5, rtol=0)
    assert pooled.env_time_B is not None and float(pooled.env_time_B.sum()) >= 0.01


def test_a_dead_worker_fails_its_episodes_and_the_pool_recovers():
    from episode_envs import DyingFactory

    from rlscope.sampling.episodes import EpisodePool

    pool = EpisodePool(1)
    budget = EpisodeBudget(max_turns=2, max_turn_tokens=2, max_episode_tokens=8)
    try:
        dead = generate_episodes(FixedPolicy(STOP), DyingFactory(), torch.tensor([0, 1]),
                                 budget, GREEDY, torch.tensor([0, 1]), pool=pool)
        alive = generate_episodes(FixedPolicy(STOP), EndlessFactory(), torch.tensor([0, 1]),
                                  budget, GREEDY, torch.tensor([0, 1]), pool=pool)
    finally:
        pool.close()
    assert dead.end_reason_B is not None and dead.env_errors_B is not None
    assert [DONE_REASONS[int(r)] for r in dead.end_reason_B] == ["failed", "failed"]
    assert dead.env_errors_B.tolist() == [1, 1]
    assert alive.end_reason_B is not None
    assert [DONE_REASONS[int(r)] for r in alive.end_reason_B] == ["max_turns"] * 2


def test_train_with_environments_in_worker_processes(echo_task, tmp_path):
    rc = main(["train", "--method", "grpo", "--num_steps", "2", "--eval_every", "0",
               *EPISODE_RUN, "--env_processes", "2", "--runs_dir", str(tmp_path),
               "--name", "pool"])
    assert rc == 0
    records = [json.loads(line) for line in (tmp_path / "pool" / "metrics.jsonl").open()]
    assert len(records) == 2 and all(r["env/errors"] == 0.0 for r in records)
    evals = [json.loads(line) for line in (tmp_path / "pool" / "eval.jsonl").open()]
    assert 0.0 <= evals[-1]["eval/success"] <= 1.0


def test_packed_learner_gives_the_sampler_logprobs_of_an_episode():
    from rlscope.learner_packed import PackedLearner, packed_forward

    torch.manual_seed(6)
    policy = build_policy(ModelConfig(arch="llama", d_model=32), VOCAB, 64)
    batch = sample(policy, SamplingConfig())
    mask_BT = batch.completion_mask_BT
    fwd = packed_forward(policy, PackedLearner(logprob_chunk=16), batch,
                         batch.completion_tokens_BT, mask_BT, batch.logp_sampler_BT,
                         SampledDistribution(1.0, True), chunked=True)
    assert fwd is not None
    torch.testing.assert_close(fwd.logp_BT[mask_BT.bool()],
                               batch.logp_sampler_BT[mask_BT.bool()], atol=1e-5, rtol=0)


def test_a_factory_that_checks_its_options_reports_them_through_the_task():
    class Checked(EchoFactory):
        def validate(self) -> list[str]:
            return ["echo: set --echo_level to 1 or 2"]

    task = EpisodeTask("echo_test", Checked(), TaskConfig())
    assert task.validate() == ["echo: set --echo_level to 1 or 2"]


@pytest.mark.slow
def test_grpo_learns_the_echo_episodes(echo_task, tmp_path):
    # measured: greedy success 0 at step 0 and 1.0 at step 50 for seeds 0, 1 and 2
    rc = main(["train", "--method", "grpo", "--num_steps", "60", "--eval_every", "60",
               "--task", "echo_test", "--batch_size", "32", "--group_size", "8",
               "--max_turns", "3", "--max_turn_tokens", "4", "--max_episode_tokens", "24",
               "--eval_batches", "1", "--eval_batch_size", "64", "--turn_discount", "0.9",
               "--device", "cpu", "--no_progress", "--runs_dir", str(tmp_path),
               "--name", "learn"])
    assert rc == 0
    evals = [json.loads(line) for line in (tmp_path / "learn" / "eval.jsonl").open()]
    assert evals[0]["eval/success"] <= 0.1 and evals[-1]["eval/success"] >= 0.9


def test_episode_batches_of_different_widths_stack_for_the_learner():
    from rlscope.batch import concat_rollouts

    policy = tiny_policy(7)
    dist = SampledDistribution(1.0, True)
    a = generate_episodes(policy, EchoFactory(), torch.tensor([0, 0]), BUDGET, SamplingConfig(),
                          torch.tensor([1, 2]), group_id_B=torch.tensor([0, 0]))
    b = generate_episodes(policy, EndlessFactory(answer_len=5), torch.tensor([2, 2]),
                          EpisodeBudget(max_turns=4, max_turn_tokens=4, max_episode_tokens=30),
                          SamplingConfig(), torch.tensor([3, 4]), group_id_B=torch.tensor([0, 0]))
    assert a.prompt_len != b.prompt_len or \
        a.completion_tokens_BT.shape[1] != b.completion_tokens_BT.shape[1]
    both = concat_rollouts([a, b])
    assert both.group_id_B.tolist() == [0, 0, 1, 1]
    assert both.turn_BT is not None and both.env_mask_BT is not None
    for part, rows in ((a, slice(0, 2)), (b, slice(2, 4))):
        T = part.completion_tokens_BT.shape[1]
        mask = part.completion_mask_BT.bool()
        assert torch.equal(both.completion_mask_BT[rows, :T], part.completion_mask_BT)
        assert bool((both.turn_BT[rows, T:] == -1).all())
        assert float(both.completion_mask_BT[rows, T:].abs().sum()) == 0.0
        alone = forward_completion(policy, part, part.completion_tokens_BT, dist).logp_BT
        stacked = forward_completion(policy, both, both.completion_tokens_BT, dist).logp_BT
        torch.testing.assert_close(stacked[rows, :T][mask], alone[mask], atol=1e-5, rtol=0)


def test_dapo_fills_its_batch_with_episodes_of_other_widths(echo_task, tmp_path):
    run = [arg for arg in EPISODE_RUN if arg not in ("--turn_discount", "0.9")]
    rc = main(["train", "--method", "dapo", "--fill_batch", "--num_steps", "10",
               "--eval_every", "0", *run, "--runs_dir", str(tmp_path), "--name", "fill"])
    assert rc == 0
    records = [json.loads(line) for line in (tmp_path / "fill" / "metrics.jsonl").open()]
    assert max(r["group/fill_rounds"] for r in records) >= 2  # a refill was stacked
    assert all(math.isfinite(r["loss/total"]) for r in records)


def test_held_out_sets_share_one_prompt_width_and_are_fixed_per_seed():
    from rlscope.evaluation import evaluate, heldout_batch

    task = EpisodeTask("echo_test", EchoFactory(), TaskConfig(eval_batches=3, eval_batch_size=2,
                                                              max_episode_tokens=24))
    sets = task.eval_prompts(0)
    assert len({s.tokens_BP.shape[1] for s in sets}) == 1 and len(sets) == 3
    assert torch.equal(heldout_batch(task, 0).env_seeds_B, heldout_batch(task, 0).env_seeds_B)
    assert not torch.equal(heldout_batch(task, 0).env_seeds_B, heldout_batch(task, 1).env_seeds_B)
    values = evaluate(FixedPolicy(TARGET), task, [heldout_batch(task, 0)], 24)
    assert float(values["eval/success"]) == 1.0 and float(values["eval/turns"]) == 1.0
    assert float(values["eval/return"]) == 1.0 and float(values["eval/test_error"]) == 0.0


def test_sampled_episodes_at_temperature_zero_match_the_greedy_evaluation():
    """`sampled_episodes` (the sampled success of docs/recipes.md's code_repair recipe): at
    temperature 0 each of its samples is the greedy episode that `evaluate` plays, rows are
    seed-major, and at temperature 1 another chunking gives the same episodes (fixed sampling
    seeds)."""
    from rlscope.evaluation import evaluate, heldout_batch, sampled_episodes
    from rlscope.policy import ModelConfig as Model
    from rlscope.tasks import make_task
    from rlscope.tasks.base import make_policy_for

    task = make_task("guess_number", TaskConfig(max_turns=3, max_turn_tokens=4,
                                                max_episode_tokens=16, eval_batches=1,
                                                eval_batch_size=6))
    assert isinstance(task, Interactive)
    torch.manual_seed(0)
    policy = make_policy_for(task, Model()).eval()
    seeds_B = heldout_batch(task, 0).env_seeds_B
    assert seeds_B is not None and len(seeds_B) == 6
    greedy = evaluate(policy, task, [heldout_batch(task, 0)], 0)
    solved_N, turns_N = sampled_episodes(policy, task, seeds_B, 2, 0.0, chunk=5)
    assert solved_N.shape == turns_N.shape == (12,)
    assert torch.equal(solved_N[0::2], solved_N[1::2]) and torch.equal(turns_N[0::2],
                                                                       turns_N[1::2])
    assert float(solved_N.mean()) == pytest.approx(float(greedy["eval/success"]))
    assert float(turns_N.float().mean()) == pytest.approx(float(greedy["eval/turns"]))
    hot_N, hot_turns_N = sampled_episodes(policy, task, seeds_B, 2, 1.0)
    again_N, again_turns_N = sampled_episodes(policy, task, seeds_B, 2, 1.0, chunk=3)
    assert torch.equal(hot_N, again_N) and torch.equal(hot_turns_N, again_turns_N)
    with pytest.raises(ValueError, match="samples >= 1"):
        sampled_episodes(policy, task, seeds_B, 0, 1.0)
