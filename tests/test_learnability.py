"""Learnability (COMPANIONS.md §5): the theory's pure functions on hand-computed values, the
``unique_path`` task (termination mask on hand-written trajectories, rewards), its
`TabularPolicy`, the exact evaluation metrics against brute-force enumeration, the
``traj_group_pg`` preset's rejections and a short run's metrics."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

from rlscope.batch import RolloutBatch
from rlscope.config import ConfigError, RunConfig, TrainConfig, validate
from rlscope.methods import MethodConfig
from rlscope.metrics.learnability import (
    expected_mixed_groups,
    expected_successes,
    grad_log_q_sq_norm,
    in_deep_cold_tail,
    in_sub_band_tail,
    mixed_group_probability,
    pass_at_k,
    regime,
    shell,
    success_probability,
)
from rlscope.policy import ModelConfig
from rlscope.policy.tabular import TabularPolicy, target_logit
from rlscope.tasks import TaskConfig, make_task
from rlscope.tasks.unique_path import UniquePathTask, exact_path_metrics, path_valid_mask

# ------------------------------------------------------------------ theory


def test_mixed_group_probability_by_hand() -> None:
    # q = 0.5, K = 2: 1 − 0.25 − 0.25 = 0.5; q = 0.1, K = 8: 1 − 1e-8 − 0.9^8 = 0.56953279
    assert float(mixed_group_probability(0.5, 2)) == pytest.approx(0.5)
    assert float(mixed_group_probability(0.1, 8)) == pytest.approx(1 - 1e-8 - 0.43046721)
    # K = 1 is never mixed; q = 0 or 1 never mixed
    assert float(mixed_group_probability(0.3, 1)) == pytest.approx(0.0)
    assert float(mixed_group_probability(0.0, 8)) == 0.0
    assert float(mixed_group_probability(1.0, 8)) == 0.0
    with pytest.raises(ValueError, match="group_size"):
        mixed_group_probability(0.5, 0)


def test_success_probability_pass_at_k_and_budgets() -> None:
    # q = 0.5 · 0.4 · 0.25 = 0.05; homogeneous p = 0.5, D = 3: 0.125
    assert float(success_probability(torch.tensor([0.5, 0.4, 0.25]))) == pytest.approx(0.05)
    assert float(success_probability(torch.full((3,), 0.5))) == pytest.approx(0.125)
    # pass@4 at q = 0.5: 1 − 0.0625
    assert float(pass_at_k(0.5, 4)) == pytest.approx(0.9375)
    # B = 512, q = 0.125: 64 successes; (512/8)·M(0.125, 8) = 64 · (1 − 0.125^8 − 0.875^8)
    assert expected_successes(0.125, 512) == pytest.approx(64.0)
    assert expected_mixed_groups(0.125, 512, 8) == pytest.approx(
        64 * (1 - 0.125 ** 8 - 0.875 ** 8))


def test_regimes_shells_and_tails() -> None:
    # K = 8: qK < 1 ⇔ q < 0.125 (cold); (1 − q)K < 1 ⇔ q > 0.875 (saturated)
    assert regime(0.1, 8) == "cold"
    assert regime(0.125, 8) == "contrastive"
    assert regime(0.5, 8) == "contrastive"
    assert regime(0.9, 8) == "saturated"
    assert [shell(q) for q in (1.0, 0.5, 0.1, 0.05, 0.0012)] == [0, -1, -1, -2, -3]
    with pytest.raises(ValueError, match="q=0"):
        shell(0.0)
    assert in_sub_band_tail(0.1, 8) and not in_sub_band_tail(0.2, 8)
    assert in_deep_cold_tail(0.01, 8) and not in_deep_cold_tail(0.0125, 8)


def test_grad_log_q_norm_formula_against_autograd() -> None:
    # D = 3, p = 0.5: target logits 3 · 0.25 = 0.75; full table (b = 4) × 4/3 = 1.0
    assert grad_log_q_sq_norm(0.5, 3) == pytest.approx(0.75)
    assert grad_log_q_sq_norm(0.5, 3, branching=4) == pytest.approx(1.0)
    # autograd on the tabular initialisation (wrong actions share 1 − p equally)
    logits_Db = torch.zeros(3, 4)
    logits_Db[:, 0] = target_logit(0.5, 4)
    logits_Db.requires_grad_(True)
    log_q = logits_Db.log_softmax(-1)[:, 0].sum()
    (grad,) = torch.autograd.grad(log_q, logits_Db)
    assert float(grad.square().sum()) == pytest.approx(1.0, rel=1e-5)
    assert float(grad[:, 0].square().sum()) == pytest.approx(0.75, rel=1e-5)


# ------------------------------------------------------------------ task and policy


def _task(**options: object) -> UniquePathTask:
    task = make_task("unique_path", TaskConfig(**options))  # type: ignore[arg-type]
    assert isinstance(task, UniquePathTask)
    return task


def test_termination_mask_on_hand_written_trajectories() -> None:
    correct_BT = torch.tensor([[1, 1, 1],    # all right: 3 actions, reward 1
                               [1, 0, 1],    # wrong at depth 1: actions 0, 1 count
                               [0, 1, 1],    # wrong at once: only action 0 counts
                               [1, 1, 0]]).bool()
    assert path_valid_mask(correct_BT).tolist() == [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]]


def test_score_rewards_and_valid_mask() -> None:
    task = _task(num_prompts=2, horizon=3, branching=4)
    targets_BT = task.targets_NH[torch.tensor([0, 0, 1])]
    wrong_BT = (targets_BT + 1) % 4
    completion_BT = torch.stack([targets_BT[0],
                                 torch.stack([targets_BT[1, 0], wrong_BT[1, 1],
                                              targets_BT[1, 2]]),
                                 wrong_BT[2]])
    batch = RolloutBatch(prompt_tokens_BP=torch.tensor([[0], [0], [1]]), prompt_mask_BP=None,
                         completion_tokens_BT=completion_BT,
                         completion_mask_BT=torch.ones(3, 3),
                         logp_sampler_BT=torch.zeros(3, 3), logp_raw_BT=torch.zeros(3, 3),
                         finished_by_stop_B=torch.zeros(3, dtype=torch.bool),
                         group_id_B=torch.arange(3), targets_BT=targets_BT)
    scores = task.score(batch)
    assert scores.rewards_B.tolist() == [1.0, 0.0, 0.0]
    assert scores.valid_mask_BT is not None
    assert scores.valid_mask_BT.tolist() == [[1, 1, 1], [1, 1, 0], [1, 0, 0]]


def test_targets_follow_the_task_seed_not_the_run() -> None:
    a, b = _task(task_seed=0), _task(task_seed=0)
    assert torch.equal(a.targets_NH, b.targets_NH)
    assert a.targets_NH.shape == (128, 3)
    assert not torch.equal(a.targets_NH, _task(task_seed=1).targets_NH)


def test_tabular_policy_starts_at_p0_and_decodes_by_depth() -> None:
    task = _task(num_prompts=5, horizon=3, branching=4, initial_correct_probability=0.3)
    policy = task.build_policy(ModelConfig())
    assert isinstance(policy, TabularPolicy)
    p_NH = policy.probabilities_NH(task.targets_NH)
    assert torch.allclose(p_NH, torch.full((5, 3), 0.3), atol=1e-6)
    with torch.no_grad():
        policy.table_NHb[2, 1, 3] = 5.0
        logits_BTV, _ = policy(torch.tensor([[2, 0, 0, 0]]))
        cache = policy.init_cache(1, 4)
        first = policy.prefill(torch.tensor([[2]]), None, cache)
        second = policy.decode_step(torch.tensor([0]), cache)
    assert torch.equal(first[0], policy.table_NHb[2, 0])
    assert torch.equal(second[0], policy.table_NHb[2, 1])
    assert torch.equal(logits_BTV[0, 1], policy.table_NHb[2, 1])
    assert torch.equal(logits_BTV[0, 3], policy.table_NHb[2, 2])  # past H: the last depth


def test_exact_metrics_match_brute_force_enumeration() -> None:
    """Every action sequence of a 2-prompt, H 3, b 3 table enumerated: q, E[actions taken],
    reach and M(q, K) from the enumeration equal the closed forms."""
    torch.manual_seed(0)
    task = _task(num_prompts=2, horizon=3, branching=3)
    policy = task.build_policy(ModelConfig())
    assert isinstance(policy, TabularPolicy)
    with torch.no_grad():
        policy.table_NHb.normal_()
    probs_NHb = policy.table_NHb.detach().double().softmax(-1)
    exact = exact_path_metrics(policy.probabilities_NH(task.targets_NH), group_size=4)
    for x in range(2):
        q = steps = 0.0
        reach = [0.0, 0.0, 0.0]
        for actions in itertools.product(range(3), repeat=3):
            prob = math.prod(float(probs_NHb[x, d, a]) for d, a in enumerate(actions))
            right = [a == int(task.targets_NH[x, d]) for d, a in enumerate(actions)]
            taken = next((d + 1 for d, ok in enumerate(right) if not ok), 3)
            steps += prob * taken
            q += prob * all(right)
            for d in range(taken):
                reach[d] += prob
        assert float(exact["success_probability"][x]) == pytest.approx(q, rel=1e-5)
        assert float(exact["expected_visited_steps"][x]) == pytest.approx(steps, rel=1e-5)
        for d in range(3):
            assert float(exact[f"reach_probability_d{d}"][x]) == pytest.approx(reach[d], rel=1e-5)
        assert float(exact["predicted_mixed_group_rate"][x]) == pytest.approx(
            1 - q ** 4 - (1 - q) ** 4, rel=1e-5)
        assert float(exact["pass_at_group_size"][x]) == pytest.approx(1 - (1 - q) ** 4,
                                                                     rel=1e-5)


def test_exact_metrics_match_monte_carlo() -> None:
    """The sampled success rate of the generic sampler matches the exact q within 4 sd."""
    from rlscope.sampling.sampler import SamplingConfig, generate

    task = _task(num_prompts=4, horizon=3, branching=4, initial_correct_probability=0.6)
    policy = task.build_policy(ModelConfig())
    prompts = task.sample_prompts(torch.Generator().manual_seed(0), 4000)
    rollout = generate(policy, prompts, SamplingConfig(), torch.arange(4000), 3)
    rate = float(task.score(rollout).rewards_B.mean())
    q = 0.6 ** 3
    assert abs(rate - q) < 4 * math.sqrt(q * (1 - q) / 4000), (rate, q)


@pytest.mark.parametrize(("options", "match"), [
    ({"horizon": 0}, r"task\.horizon=0.*--horizon >= 1"),
    ({"branching": 1}, r"task\.branching=1.*--branching >= 2"),
    ({"initial_correct_probability": 1.0}, r"initial_correct_probability=1\.0 must be"),
    ({"reward_noise": 0.1, "reward_noise_mode": "label_flip"}, "reward_noise does not apply"),
])
def test_task_rejections(options: dict[str, object], match: str) -> None:
    cfg = TrainConfig(method="traj_group_pg", task="unique_path",
                      task_options=TaskConfig(**options))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=match):
        validate(cfg)


@pytest.mark.parametrize(("run", "match"), [
    ({"group_size": 1}, r"run\.group_size=1: this method compares samples"),
    ({"delay": 1}, "drop --delay"),
])
def test_preset_rejections(run: dict[str, object], match: str) -> None:
    cfg = TrainConfig(method="traj_group_pg", task="unique_path",
                      run=RunConfig(batch_size=32, **run))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=match):
        validate(cfg)


def test_preset_components_and_zscore_override() -> None:
    spec, _, d = validate(TrainConfig(method="TrajGroupPG", task="unique_path",
                                      run=RunConfig(batch_size=32)))
    assert (spec.advantage.name, spec.objective.name, spec.agg, spec.selection, spec.kl.coef) \
        == ("group_center", "score", "seq_mean_token_sum", "none", 0.0)
    assert d.group_size == 8
    spec, _, _ = validate(TrainConfig(method="traj_group_pg", task="unique_path",
                                      run=RunConfig(batch_size=32),
                                      components=MethodConfig(advantage="group_zscore")))
    assert spec.advantage.name == "group_zscore"


def test_short_run_logs_the_exact_and_sampled_metrics(tmp_path: Path) -> None:
    from rlscope.metrics.schema import unregistered
    from rlscope.train import train

    result = train(TrainConfig(method="traj_group_pg", task="unique_path",
                               task_options=TaskConfig(horizon=2),
                               run=RunConfig(batch_size=32, group_size=4, num_steps=2,
                                             eval_every=1, runs_dir=str(tmp_path),
                                             progress=False, device="cpu")))
    first = result.evals[0]
    # untrained table: p = 0.5 at both depths, q = 0.25, K = 4
    assert first["eval/success_probability"] == pytest.approx(0.25, abs=1e-5)
    assert first["eval/predicted_mixed_group_rate"] == pytest.approx(
        1 - 0.25 ** 4 - 0.75 ** 4, abs=1e-5)
    assert first["eval/expected_visited_steps"] == pytest.approx(1.5, abs=1e-5)
    assert unregistered(first) == []
    rows = [r for r in result.metrics if "group/all_zero_rate" in r]
    assert rows and unregistered(rows[0]) == []
    for row in rows:
        assert row["group/mixed_rate"] + row["group/all_zero_rate"] \
            + row["group/all_one_rate"] == pytest.approx(1.0)
        assert 1.0 <= row["length/mean"] <= 2.0  # actions taken, never the padded H


@pytest.mark.parametrize("advantage", ["group_center", "group_zscore"])
def test_traj_group_pg_learns_and_the_mixed_rate_follows_m_q_k(tmp_path: Path,
                                                               advantage: str) -> None:
    """60 steps on 32 prompts (H 3, b 4, p0 0.5: q starts at 0.125), 32 groups of 8, Adam lr
    5e-2. Measured over seeds 0–4 (both normalisations): final exact q 0.896–0.900; mean
    |group/mixed_rate − eval/predicted_mixed_group_rate| over the 12 evaluation steps 0.031–0.057
    (max single gap 0.15). Thresholds: q > 0.8, mean gap < 0.1."""
    from rlscope.config import OptimConfig
    from rlscope.train import train

    result = train(TrainConfig(
        method="traj_group_pg", task="unique_path", task_options=TaskConfig(num_prompts=32),
        components=MethodConfig(advantage=advantage), optim=OptimConfig(lr=5e-2),
        run=RunConfig(seed=0, batch_size=256, group_size=8, num_steps=60, eval_every=5,
                      runs_dir=str(tmp_path), progress=False, device="cpu", log_samples=0,
                      doctor_every=0)))
    assert result.evals[0]["eval/success_probability"] == pytest.approx(0.125, abs=1e-4)
    assert result.evals[-1]["eval/success_probability"] > 0.8
    sampled = {int(m["step"]): m["group/mixed_rate"] for m in result.metrics}
    gaps = [abs(sampled[int(e["step"])] - e["eval/predicted_mixed_group_rate"])
            for e in result.evals if int(e["step"]) in sampled]
    assert len(gaps) == 12
    assert sum(gaps) / len(gaps) < 0.1


def test_builtin_learnability_manifest_validates(capsys: pytest.CaptureFixture[str]) -> None:
    """The manifest's 2 configurations × 3 seeds pass every check before anything runs."""
    from rlscope.cli import main

    assert main(["sweep", "--builtin", "learnability", "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sweep learnability: 6 runs (2 ids × 3 seeds)")
    for args in ("--advantage group_center", "--advantage group_zscore",
                 "--task unique_path --method traj_group_pg --horizon 3",
                 "--batch_size 512 --lr 0.01 --num_steps 200 --eval_every 10"):
        assert args in out


def test_remote_scoring_keeps_the_valid_mask() -> None:
    """--env_workers' chunk concatenation carries Scores.valid_mask_BT in row order; a failed
    chunk keeps every position (pure function, no Ray)."""
    from rlscope.env_workers import concat_scores
    from rlscope.tasks import Scores

    ok = Scores(torch.tensor([1.0, 0.0]), valid_mask_BT=torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
    out = concat_scores([ok, None], [slice(0, 2), slice(2, 3)], 2, 0.0, torch.device("cpu"))
    assert out.valid_mask_BT is not None
    assert out.valid_mask_BT.tolist() == [[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]]
    plain = concat_scores([Scores(torch.tensor([1.0]))], [slice(0, 1)], 2, 0.0,
                          torch.device("cpu"))
    assert plain.valid_mask_BT is None


def test_one_loop_update_is_the_trajectory_policy_gradient(tmp_path: Path) -> None:
    """Identity: one traj_group_pg step of the loop (plain SGD, no clipping) moves the table by
    −lr · ∇ of −(1/B) Σ_b (r_b − mean_group r) Σ_{t valid} log π(a_t | x_b, t), computed here
    by autograd on the batch the loop sampled (the termination mask included)."""
    from rlscope.config import OptimConfig
    from rlscope.learner import prepare, update
    from rlscope.train import sample_rollouts, score_rollouts, setup

    cfg = TrainConfig(method="traj_group_pg", task="unique_path",
                      task_options=TaskConfig(num_prompts=6, horizon=3, branching=3),
                      optim=OptimConfig(grad_clip=0.0),
                      run=RunConfig(batch_size=24, group_size=4, runs_dir=str(tmp_path),
                                    device="cpu", progress=False))
    parts = setup(cfg)
    policy = parts.policy
    assert isinstance(policy, TabularPolicy)
    rollout = sample_rollouts(policy, parts.task, parts.cfg, parts.generator, parts.device,
                              parts.d.num_prompts, parts.d.group_size, parts.d.max_new_tokens)
    batch = score_rollouts(rollout, policy, parts.task, parts.cfg, False, 0)
    assert batch.rewards_B is not None and batch.targets_BT is not None
    # the loss mask is the termination mask: positions after the first wrong action dropped
    correct_BT = batch.completion_tokens_BT == batch.targets_BT
    assert torch.equal(batch.completion_mask_BT, path_valid_mask(correct_BT))
    assert float(batch.completion_mask_BT.sum()) < batch.completion_mask_BT.numel()
    table0 = policy.table_NHb.detach().clone()
    # the expected gradient, by autograd on a copy of the table
    table = table0.clone().requires_grad_(True)
    x_B = batch.prompt_tokens_BP[:, 0]
    logp_BT = table[x_B].log_softmax(-1).gather(-1, batch.completion_tokens_BT[..., None])[..., 0]
    r_GK = batch.rewards_B.view(-1, 4)
    adv_B = (r_GK - r_GK.mean(-1, keepdim=True)).reshape(-1)
    loss = -(adv_B * (logp_BT * batch.completion_mask_BT).sum(-1)).mean()
    (grad,) = torch.autograd.grad(loss, table)
    assert float(grad.abs().sum()) > 0  # the batch has mixed groups
    inputs, _ = prepare(parts.spec, batch, policy, None, None, 0.0, parts.d.group_size,
                        parts.plan.dist, None, parts.plan.packed, None)
    sgd = torch.optim.SGD(parts.params, lr=0.1)
    update(parts.plan, policy, None, sgd, batch, inputs, 0.0)
    assert torch.allclose(policy.table_NHb.detach() - table0, -0.1 * grad, atol=1e-6)
