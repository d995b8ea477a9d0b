"""The VPO companion (COMPANIONS.md §2): the ``vector_pareto`` table, the three set scores with
common random weights, the identity vpo_grpo (M = 1, one weight w*) = scalar_grpo, the pool
metrics, every rejection, a short run, exact resume, the kind's defaults and the CLI table."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from rlscope import steps
from rlscope.batch import SetBatch
from rlscope.cli import _train_parse, _tyro_parse, main
from rlscope.config import ConfigError, OptimConfig, RunConfig, TrainConfig
from rlscope.methods import resolve_method
from rlscope.methods.resolve import MethodConfig
from rlscope.metrics.schema import unregistered
from rlscope.policy.set_policy import SetPolicy, sample_sets, slot_entropy
from rlscope.steps.set_step import (
    SetStep,
    dirichlet_ones,
    gold_set_reward,
    multi_rlvr_set_score,
    scalar_set_score,
    set_advantages,
    set_loss,
    vpo_set_score,
)
from rlscope.tasks import TaskConfig
from rlscope.tasks.vector_pareto import (
    BASE_TABLE,
    candidate_rewards,
    gold_weights,
    in_set_diversity,
    pool_metrics,
    reward_table,
)
from rlscope.train import train

GOLD = gold_weights()


def close(actual: torch.Tensor, expected: object) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), rtol=0,
                               atol=1e-6)


# ------------------------------------------------------------------------------ the task


def test_the_table_rolls_by_the_prompt_and_swaps_the_objectives_on_odd_prompts() -> None:
    table_PAO = reward_table(8)
    assert table_PAO.shape == (8, 7, 2)
    close(table_PAO[0], BASE_TABLE)
    # p = 1: R(1, a) = b[(a − 1) mod 7], swapped
    assert table_PAO[1, 0].tolist() == pytest.approx([0.05, 0.05])  # b[6] = (.05, .05)
    assert table_PAO[1, 1].tolist() == pytest.approx([0.0, 1.0])  # b[0] = (1, 0) swapped
    assert table_PAO[1, 2].tolist() == pytest.approx([0.25, 0.85])  # b[1] = (.85, .25) swapped
    # p = 2: R(2, a) = b[(a − 2) mod 7], not swapped
    assert table_PAO[2, 0].tolist() == pytest.approx([0.3, 0.2])  # b[5]
    assert table_PAO[2, 2].tolist() == pytest.approx([1.0, 0.0])  # b[0]
    # p = 3: R(3, 6) = b[3] = (.25, .85) swapped = (.85, .25)
    assert table_PAO[3, 6].tolist() == pytest.approx([0.85, 0.25])
    # every prompt's best gold score is the compromise (.6, .6): 0.6
    assert (table_PAO @ GOLD).max(-1).values.tolist() == pytest.approx([0.6] * 8)
    prompt_B, actions_BM = torch.tensor([1, 2]), torch.tensor([[0, 1], [2, 0]])
    close(candidate_rewards(table_PAO, prompt_B, actions_BM),
          [[[0.05, 0.05], [0.0, 1.0]], [[1.0, 0.0], [0.3, 0.2]]])


# ------------------------------------------------------------------------ the set scores


def two_sets() -> tuple[torch.Tensor, torch.Tensor]:
    """One group of K = 2 sets of M = 2 candidates sharing N = 2 weights: set A holds both
    corners (1, 0), (0, 1); set B the compromise (.6, .6) twice; w_1 = (1, 0),
    w_2 = (.25, .75)."""
    rewards_BMO = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.6, 0.6], [0.6, 0.6]]])
    weights_GNO = torch.tensor([[[1.0, 0.0], [0.25, 0.75]]])
    return rewards_BMO, weights_GNO[torch.tensor([0, 0])]


def test_the_three_set_scores_on_common_random_weights() -> None:
    rewards_BMO, weights_BNO = two_sets()
    # vpo_grpo: A: w_1 → max(1, 0) = 1; w_2 → max(.25, .75) = .75; mean .875.
    #           B: .6 under both weights (each sums to 1) → .6
    assert vpo_set_score(rewards_BMO, weights_BNO, GOLD).tolist() == pytest.approx([0.875, 0.6])
    # multi_rlvr: A: max(.5, .5) = .5; B: .6
    assert multi_rlvr_set_score(rewards_BMO, weights_BNO, GOLD).tolist() == pytest.approx(
        [0.5, 0.6])
    # scalar_grpo: the first candidate only: A .5, B .6
    assert scalar_set_score(rewards_BMO, weights_BNO, GOLD).tolist() == pytest.approx(
        [0.5, 0.6])
    assert gold_set_reward(rewards_BMO, GOLD).tolist() == pytest.approx([0.5, 0.6])
    # group z-score of (.875, .6): mean .7375, population std .1375 → (+1, −1); the diverse
    # set wins under vpo_grpo, the compromise under both scalar scores
    cfg = resolve_method("vpo_grpo").advantage
    assert set_advantages(torch.tensor([0.875, 0.6]), 2, cfg).tolist() == pytest.approx(
        [1.0, -1.0], abs=1e-6)
    assert set_advantages(torch.tensor([0.5, 0.6]), 2, cfg).tolist() == pytest.approx(
        [-1.0, 1.0], abs=1e-6)
    # a group of equal scores (std 0 ≤ 1e-8) gets no advantage
    assert set_advantages(torch.tensor([0.6, 0.6, 0.5, 0.7]), 2, cfg).tolist() == \
        pytest.approx([0.0, 0.0, -1.0, 1.0], abs=1e-6)


def test_the_k_sets_of_a_group_share_their_dirichlet_weights(tmp_path: Path) -> None:
    stepper = SetStep(config(tmp_path, batch_size=12, group_size=4), resolve_method("vpo_grpo"),
                      torch.device("cpu"))
    batch = stepper.collect()
    assert batch.weights_GNO.shape == (3, 16, 2)
    assert batch.group_ids_B.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    w_BNO = batch.weights_BNO
    for g in range(3):  # the same weights for every set of a group, different across groups
        assert all(torch.equal(w_BNO[4 * g + k], batch.weights_GNO[g]) for k in range(4))
    assert not torch.equal(batch.weights_GNO[0], batch.weights_GNO[1])
    assert all((p == batch.prompt_ids_B[4 * g]).all()
               for g, p in enumerate(batch.prompt_ids_B.view(3, 4)))
    assert torch.allclose(batch.weights_GNO.sum(-1), torch.ones(3, 16))
    assert (batch.weights_GNO >= 0).all()
    # Dirichlet(1, 1): w_1 uniform on [0, 1], mean 1/2, variance 1/12
    w1 = dirichlet_ones((20000, 2), torch.Generator().manual_seed(0))[:, 0]
    assert float(w1.mean()) == pytest.approx(0.5, abs=0.01)
    assert float(w1.var()) == pytest.approx(1 / 12, abs=0.003)


def test_vpo_with_one_candidate_and_the_gold_weight_equals_scalar_grpo() -> None:
    torch.manual_seed(0)
    policy = SetPolicy(num_prompts=4, num_slots=1, num_actions=7, hidden=8)
    G, K = 2, 4
    prompt_ids_B = torch.tensor([1, 3]).repeat_interleave(K)
    with torch.no_grad():
        logp_BMA = policy.log_probs(prompt_ids_B)
    actions_BM, logp_BM = sample_sets(logp_BMA, torch.Generator().manual_seed(1))
    batch = SetBatch(prompt_ids_B=prompt_ids_B, actions_BM=actions_BM,
                     logp_old_BM=logp_BM + torch.linspace(-0.3, 0.3, 8)[:, None],  # ρ ≠ 1
                     rewards_BMO=candidate_rewards(reward_table(4), prompt_ids_B, actions_BM),
                     weights_GNO=GOLD.expand(G, 1, 2).clone(),
                     group_ids_B=torch.arange(G).repeat_interleave(K))
    spec = resolve_method("vpo_grpo")
    out = {}
    for name, score in (("vpo", vpo_set_score), ("scalar", scalar_set_score)):
        scores_B = score(batch.rewards_BMO, batch.weights_BNO, GOLD)
        adv_B = set_advantages(scores_B, K, spec.advantage)
        policy.zero_grad()
        loss, stats = set_loss(policy, batch, adv_B, spec.objective)
        loss.backward()
        out[name] = (scores_B, adv_B, loss.detach(), stats["clipfrac_region"],
                     [p.grad.clone() for p in policy.parameters()])  # type: ignore[union-attr]
    (s_v, a_v, l_v, c_v, g_v), (s_s, a_s, l_s, c_s, g_s) = out["vpo"], out["scalar"]
    # (1/1) Σ_j max_{m ∈ {1}} w*ᵀ r_m = w*ᵀ r_1
    torch.testing.assert_close(s_v, s_s, rtol=0, atol=1e-7)
    torch.testing.assert_close(a_v, a_s, rtol=0, atol=1e-6)
    torch.testing.assert_close(l_v, l_s, rtol=0, atol=1e-7)
    assert torch.equal(c_v, c_s) and float(c_v.sum()) > 0  # the clip is exercised
    assert float(a_v.abs().sum()) > 0
    for gv, gs in zip(g_v, g_s, strict=True):
        torch.testing.assert_close(gv, gs, rtol=0, atol=1e-7)
    assert any(float(g.abs().sum()) > 0 for g in g_v)


def test_the_set_loss_is_the_ppo_clip_mean_over_candidates() -> None:
    """Two sets of two candidates, A = (+1, −1); ρ = (1.5, 1.0 | 0.5, 1.0): per candidate
    −min(ρA, clip(ρ, .8, 1.2)A) = (−1.2, −1.0 | 0.8, 1.0), mean 0.4 / 4 = −0.1."""
    policy = SetPolicy(num_prompts=1, num_slots=2, num_actions=7, hidden=4)
    prompt_ids_B = torch.zeros(2, dtype=torch.long)
    actions_BM = torch.tensor([[0, 1], [2, 3]])
    with torch.no_grad():
        logp_BM = policy.log_probs(prompt_ids_B).gather(-1, actions_BM[..., None])[..., 0]
    rho_BM = torch.tensor([[1.5, 1.0], [0.5, 1.0]])
    batch = SetBatch(prompt_ids_B=prompt_ids_B, actions_BM=actions_BM,
                     logp_old_BM=logp_BM - rho_BM.log(), rewards_BMO=torch.zeros(2, 2, 2),
                     weights_GNO=torch.zeros(1, 1, 2), group_ids_B=torch.zeros(2))
    loss, stats = set_loss(policy, batch, torch.tensor([1.0, -1.0]),
                           resolve_method("vpo_grpo").objective)
    assert float(loss.detach()) == pytest.approx((-1.2 - 1.0 + 0.8 + 1.0) / 4, abs=1e-5)
    assert stats["clipfrac_region"].tolist() == [[1.0, 0.0], [1.0, 0.0]]
    torch.testing.assert_close(stats["ratio"], rho_BM, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------- evaluation


def test_pool_metrics_best_at_k_and_diversity_on_a_hand_example() -> None:
    # one prompt, 3 sets of M = 2; gold scores set by set: (.5, .5), (.6, .05), (.25, .55)
    rewards_PSMO = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]],
                                  [[0.6, 0.6], [0.05, 0.05]],
                                  [[0.3, 0.2], [0.85, 0.25]]]])
    m = pool_metrics(rewards_PSMO, GOLD)
    assert float(m["mean_scalar_reward"]) == pytest.approx(2.45 / 6)
    assert float(m["best@1"]) == pytest.approx(0.5)
    assert float(m["best@3"]) == pytest.approx(0.6)  # max(.5, .5, .6)
    assert float(m["best@9"]) == pytest.approx(0.6)  # the whole pool of 6
    # L1 inside each set: |1 − 0| + |0 − 1| = 2; .55 + .55 = 1.1; .55 + .05 = .6
    assert float(m["pool_diversity_l1"]) == pytest.approx((2 + 1.1 + 0.6) / 3)
    # M = 3: pairs (a, b) 2, (a, c) .4 + .6 = 1, (b, c) .6 + .4 = 1 → 4/3; M = 1 → 0
    three = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.6, 0.6]]])
    assert in_set_diversity(three).tolist() == pytest.approx([4 / 3])
    assert in_set_diversity(torch.ones(5, 1, 2)).tolist() == [0.0] * 5
    # M = 1: best@9 looks at the first 9 sets only (the 10th holds the best answer)
    singles = torch.tensor([[0.0, 0.0]] * 9 + [[0.6, 0.6]] + [[0.0, 1.0]] * 2)
    one = pool_metrics(singles.view(1, 12, 1, 2), GOLD)
    assert float(one["best@9"]) == 0.0 and float(one["best@1"]) == 0.0
    assert float(one["pool_diversity_l1"]) == 0.0


def test_the_slot_entropy_of_a_uniform_policy_is_log_7() -> None:
    logp_BMA = torch.full((2, 3, 7), -math.log(7))
    close(slot_entropy(logp_BMA), [[math.log(7)] * 3] * 2)


# ---------------------------------------------------------------------------- rejections


def config(tmp_path: Path, method: str = "vpo_grpo", task: dict[str, Any] | None = None,
           components: dict[str, Any] | None = None, **run: Any) -> TrainConfig:
    return TrainConfig(
        method=method, task="vector_pareto",
        run=RunConfig(**{"num_steps": 20, "batch_size": 32, "group_size": 8, "eval_every": 10,
                         "inner_epochs": 2, "runs_dir": str(tmp_path / "runs"),
                         "progress": False, "device": "cpu", **run}),
        task_options=TaskConfig(**{"eval_batches": 2, **(task or {})}),
        components=MethodConfig(**(components or {})))


REJECTIONS = [
    ({"group_size": 1}, {}, {}, "vpo_grpo",
     "run.group_size=1: the set step compares the K sets of a group; set --group_size 2"),
    ({"batch_size": 36}, {}, {}, "vpo_grpo",
     "run.batch_size=36 is not divisible by the group size 8: set --batch_size to a multiple"),
    ({}, {"num_candidates": 3}, {}, "scalar_grpo",
     "scalar_grpo scores one answer per set (w*ᵀ r_1), but task.num_candidates=3: set "
     "--num_candidates 1"),
    ({}, {"num_candidates": 1}, {}, "vpo_grpo",
     "vpo_grpo scores a set of several candidates, but task.num_candidates=1: set "
     "--num_candidates 2 or more"),
    ({}, {"num_candidates": 1}, {}, "multi_rlvr",
     "multi_rlvr scores a set of several candidates"),
    ({}, {"num_weight_samples": 0}, {}, "vpo_grpo",
     "task.num_weight_samples=0 must be >= 1: set --num_weight_samples 1 or more"),
    ({}, {"set_hidden": 0}, {}, "vpo_grpo", "task.set_hidden=0 must be >= 1"),
    ({}, {"eval_batches": 0}, {}, "vpo_grpo", "task.eval_batches=0 must be >= 1"),
    ({}, {"num_prompts": -1}, {}, "vpo_grpo", "task.num_prompts=-1 must be >= 0"),
    ({"num_minibatches": 2}, {}, {}, "vpo_grpo",
     "run.num_minibatches=2: the set step makes --inner_epochs full-batch passes"),
    ({}, {}, {"kl_coef": 0.1, "entropy_coef": 0.01}, "vpo_grpo",
     "--kl_coef, --entropy_coef: the set step's update is fixed"),
    ({}, {}, {"clip_low": 0.0}, "vpo_grpo", "clip bounds (0.0, 0.2) must be > 0"),
    ({"delay": 1}, {}, {}, "vpo_grpo", "--delay is not supported by the 'set' step"),
    ({}, {"reward_noise": 0.1}, {}, "vpo_grpo", "--reward_noise is not supported by the 'set'"),
]


@pytest.mark.parametrize(("run", "task", "components", "method", "message"), REJECTIONS)
def test_every_rejection_says_what_to_change(tmp_path: Path, run: dict[str, Any],
                                             task: dict[str, Any], components: dict[str, Any],
                                             method: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        steps.validate_run(config(tmp_path, method, task, components, **run))
    assert message in str(error.value)


def test_the_defaults_pass_and_a_clip_change_is_allowed(tmp_path: Path) -> None:
    assert steps.validate_run(config(tmp_path)) == "set"
    assert steps.validate_run(config(tmp_path, "scalar_grpo", {"num_candidates": 1},
                                     {"clip_high": 0.3})) == "set"
    assert steps.validate_run(config(tmp_path, "MultiRLVR")) == "set"


def test_a_set_method_and_a_rollout_task_are_refused_naming_both() -> None:
    with pytest.raises(ConfigError, match=r"--method grpo trains with the 'rollout' step, but "
                                          r"--task vector_pareto is a task of the 'set' step"):
        steps.validate_run(TrainConfig(method="grpo", task="vector_pareto"))
    with pytest.raises(ConfigError, match=r"--method vpo_grpo trains with the 'set' step, but "
                                          r"--task token_reversal.*vector_pareto"):
        steps.validate_run(TrainConfig(method="vpo_grpo", task="token_reversal"))


# -------------------------------------------------------------------------------- runs


def records(run_dir: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


def test_a_20_step_run_is_finite_registered_and_evaluated_on_schedule(tmp_path: Path) -> None:
    result = train(config(tmp_path))
    assert result.status == "completed"
    metrics, evals = records(result.run_dir, "metrics.jsonl"), \
        records(result.run_dir, "eval.jsonl")
    assert [m["step"] for m in metrics] == list(range(20))
    assert [e["step"] for e in evals] == [0, 10, 20]
    assert all(math.isfinite(v) for row in metrics + evals for v in row.values())
    names = {k for row in metrics + evals for k in row}
    assert unregistered(names) == []
    assert {"reward/mean", "vpo/gold_set_reward", "adv/abs_mean", "policy/ratio_mean",
            "policy/clipfrac_region", "group/mixed_rate", "loss/total"} <= names
    assert {"eval/mean_scalar_reward", "eval/best@1", "eval/best@3", "eval/best@9",
            "eval/pool_diversity_l1", "eval/entropy"} <= names
    for e in evals:  # best@1 ≤ best@3 ≤ best@9 ≤ 0.6, the best gold score of any answer
        assert e["eval/best@1"] <= e["eval/best@3"] <= e["eval/best@9"] <= 0.6 + 1e-6
    # z-scored advantages: mean 0 over the batch, |A| ≤ √(K − 1)
    assert all(abs(m["adv/mean"]) < 1e-5 and m["adv/max"] <= math.sqrt(7) + 1e-5
               for m in metrics)
    stored = json.loads((result.run_dir / "config.json").read_text())
    assert stored["method_spec"]["step"] == "set"
    assert "M=3 candidates" in stored["task_description"]


def test_a_resumed_run_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    whole = train(config(tmp_path / "a", num_steps=8, eval_every=4, checkpoint_every=3))
    first = train(config(tmp_path / "b", num_steps=3, eval_every=4, checkpoint_every=3))
    resumed = train(config(tmp_path / "b", num_steps=8, eval_every=4, checkpoint_every=3,
                           resume=str(first.run_dir)))
    assert resumed.status == "completed"

    def strip(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]

    assert strip(records(resumed.run_dir, "metrics.jsonl")) == strip(whole.metrics)
    assert strip(records(resumed.run_dir, "eval.jsonl")) == strip(whole.evals)
    assert [e["step"] for e in whole.evals] == [0, 4, 8]


def test_vpo_grpo_learns_a_diverse_set_and_scalar_grpo_the_compromise(tmp_path: Path) -> None:
    """60 steps of 8 groups: vpo_grpo's sets spread out (the optimal set, both corners and the
    compromise, has in-set diversity 4/3) and its preference-averaged score rises (0.76 for that
    set); scalar_grpo's one answer becomes the compromise, gold score 0.6."""
    def run(method: str, m: int) -> Any:
        cfg = config(tmp_path / method, method, {"num_candidates": m}, num_steps=60,
                     batch_size=64, eval_every=60, inner_epochs=4, doctor_every=0)
        return train(dataclasses.replace(cfg, optim=OptimConfig(lr=3e-3)))  # the VPO lr

    vpo, scalar = run("vpo_grpo", 3), run("scalar_grpo", 1)
    first, last = vpo.evals[0], vpo.evals[-1]
    assert first["eval/pool_diversity_l1"] < 0.9 and last["eval/pool_diversity_l1"] > 1.2
    assert vpo.metrics[0]["reward/mean"] < 0.66 and vpo.metrics[-1]["reward/mean"] > 0.72
    assert scalar.evals[0]["eval/best@1"] < 0.5 and scalar.evals[-1]["eval/best@1"] > 0.59
    assert scalar.evals[-1]["eval/pool_diversity_l1"] == 0.0


def test_a_set_batch_selects_rows_and_keeps_the_group_weights() -> None:
    batch = SetBatch(prompt_ids_B=torch.tensor([3, 3, 5, 5]), actions_BM=torch.arange(8).view(4, 2),
                     logp_old_BM=torch.zeros(4, 2), rewards_BMO=torch.zeros(4, 2, 2),
                     weights_GNO=torch.rand(2, 3, 2), group_ids_B=torch.tensor([0, 0, 1, 1]))
    picked = batch.select(torch.tensor([1, 2]))
    assert picked.prompt_ids_B.tolist() == [3, 5]
    assert picked.actions_BM.tolist() == [[2, 3], [4, 5]]
    assert picked.group_ids_B.tolist() == [0, 1] and picked.batch_size == 2
    assert torch.equal(picked.weights_GNO, batch.weights_GNO)
    assert torch.equal(picked.weights_BNO, batch.weights_GNO)


# ------------------------------------------------------------------------ command line


def parse(args: list[str]) -> TrainConfig:
    cfg = _tyro_parse(TrainConfig, args, "rlscope train")
    assert isinstance(cfg, TrainConfig)
    return steps.with_kind_defaults(cfg, lambda defaults: _train_parse(args, defaults))


def test_the_spec_defaults_apply_to_the_options_not_given() -> None:
    cfg = parse(["--task", "vector_pareto", "--method", "vpo_grpo", "--num_steps", "7"])
    assert (cfg.run.num_steps, cfg.run.batch_size, cfg.run.group_size, cfg.run.inner_epochs,
            cfg.run.eval_every, cfg.optim.lr) == (7, 128, 8, 4, 20, 3e-3)
    given = parse(["--task", "vector_pareto", "--method", "scalar_grpo", "--lr", "1e-3",
                   "--batch_size", "64", "--num_candidates", "1"])
    assert (given.optim.lr, given.run.batch_size, given.run.num_steps,
            given.task_options.num_candidates) == (1e-3, 64, 500, 1)
    rollout = parse(["--task", "token_reversal", "--method", "grpo"])  # untouched
    assert rollout == TrainConfig(method="grpo", task="token_reversal")


def test_the_train_table_shows_best_at_1_and_best_at_9(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    assert main(["train", "--task", "vector_pareto", "--method", "vpo_grpo", "--num_steps",
                 "2", "--batch_size", "16", "--eval_batches", "1", "--no_progress",
                 "--device", "cpu", "--runs_dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "best@1" in out and "best@9" in out and "test_error" not in out


def test_the_builtin_vpo_manifest_validates(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "--builtin", "vpo", "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert "9 runs (3 ids × 3 seeds)" in out
    for method, m in (("vpo_grpo", 3), ("scalar_grpo", 1), ("multi_rlvr", 3)):
        assert f"--method {method} --num_candidates {m} --seed 0" in out
    assert out.count("--num_steps 500") == 9 and out.count("--lr 0.003") == 9


@pytest.mark.slow
def test_the_vpo_manifest_smoke_run_writes_its_csv(tmp_path: Path) -> None:
    """The builtin vpo manifest at 2 steps, one seed, batch 16, evaluation every step (three
    runs, each a process of its own: ~20 s): every run completes and results.csv names every
    id with the best@k columns."""
    import re
    from importlib.resources import files

    text = (files("rlscope.sweep") / "builtin" / "vpo.toml").read_text()
    text = text.replace("seeds = [0, 1, 2]", "seeds = [0]")
    text = re.sub(r"num_steps = \d+", "num_steps = 2", text)
    text = re.sub(r"eval_every = \d+", "eval_every = 1", text)
    text = text.replace("batch_size = 128", "batch_size = 16")
    (tmp_path / "smoke.toml").write_text(text)
    out_dir = tmp_path / "sweep"
    assert main(["sweep", str(tmp_path / "smoke.toml"), "--output", str(out_dir)]) == 0
    results = (out_dir / "results.csv").read_text()
    assert all(f"{run_id}_s0" in results for run_id in ("vpo_grpo", "scalar_grpo",
                                                         "multi_rlvr"))
    assert "eval/best@9" in results and "eval/best@1" in results
    assert "| vpo_grpo | vpo_grpo |" in (out_dir / "final.md").read_text()
