"""The training loop (METHODS.md, "Training protocol"): bit-exact resume, the metric schema,
validation before training, staleness, and dynamic-sampling selection."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from rlscope.config import ConfigError, RunConfig, TrainConfig, validate
from rlscope.methods import METHODS, MethodConfig
from rlscope.methods.teacher import TeacherConfig
from rlscope.metrics.schema import metric_def, unregistered
from rlscope.metrics.sinks import read_jsonl
from rlscope.policy import ModelConfig
from rlscope.replay import ReplayConfig
from rlscope.sampling import SamplingConfig
from rlscope.tasks import TASKS, Scores, TaskConfig, make_task
from rlscope.tasks.base import make_policy_for
from rlscope.tasks.reversal import ReversalTask
from rlscope.train import OUT_OF_REGIME_STREAK, RunResult, train

SMALL_TASK = TaskConfig(seq_len=4, eval_batches=1, eval_batch_size=16)


def _cfg(runs_dir: Path, method: str = "grpo", task: str = "token_reversal",
         task_options: TaskConfig = SMALL_TASK, components: MethodConfig | None = None,
         **run: Any) -> TrainConfig:
    run = {"batch_size": 16, "eval_every": 5, "num_steps": 10, "runs_dir": str(runs_dir),
           "progress": False, "device": "cpu", **run}
    return TrainConfig(method=method, task=task, task_options=task_options,
                       components=components or MethodConfig(), run=RunConfig(**run))


def _without_timing(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items()
            if not k.startswith(("time/", "throughput/", "perf/"))}


# ---------------------------------------------------------------------------------- resume


@pytest.mark.parametrize(("method", "run_kw"), [
    ("grpo", {}),
    ("ppo", {}),          # adaptive KL coefficient, value head and reference in the checkpoint
    ("grpo", {"delay": 2}),  # the staleness queue in the checkpoint
])
def test_resume_equals_straight_run(tmp_path: Path, method: str, run_kw: dict[str, Any]
                                    ) -> None:
    straight = train(_cfg(tmp_path, method, num_steps=20, name="straight", **run_kw))
    half = train(_cfg(tmp_path, method, num_steps=10, name="resumed", **run_kw))
    resumed = train(_cfg(tmp_path, method, num_steps=20, resume=str(half.run_dir), **run_kw))
    assert resumed.run_dir == half.run_dir
    assert straight.status == resumed.status == "completed"

    a = read_jsonl(straight.run_dir / "metrics.jsonl")
    b = read_jsonl(resumed.run_dir / "metrics.jsonl")
    assert [r["step"] for r in a] == list(range(20))  # a delay's warm-up steps train too
    assert [r["step"] for r in b] == [r["step"] for r in a]
    for ra, rb in zip(a, b, strict=True):
        assert _without_timing(ra) == _without_timing(rb), f"step {ra['step']} differs"
    if method == "ppo":  # the adaptive controller moved β, and the resumed run carried it on
        betas = [r["kl_ctrl/beta"] for r in a]
        assert betas[0] == METHODS["ppo"].kl.coef and len(set(betas)) > 1

    # evaluations agree too: the first leg's final evaluation at step 10 was logged at the
    # checkpoint's step, so the resume dropped it (and evaluated step 10 again where scheduled)
    ea = [_without_timing(r) for r in read_jsonl(straight.run_dir / "eval.jsonl")]
    eb = [_without_timing(r) for r in read_jsonl(resumed.run_dir / "eval.jsonl")]
    assert eb == ea
    status = json.loads((resumed.run_dir / "status.json").read_text())
    assert status["status"] == "completed" and status["steps"] == 20

    # the in-memory result of the resumed leg holds only its own steps
    assert [r["step"] for r in resumed.metrics] == list(range(10, 20))


def test_resume_without_checkpoint_fails(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"--resume .*empty: no checkpoint in"):
        train(_cfg(tmp_path, num_steps=2, resume=str(tmp_path / "empty")))
    run = train(_cfg(tmp_path, num_steps=1, name="run"))
    for f in (run.run_dir / "checkpoints").iterdir():
        f.unlink()
    with pytest.raises(ConfigError, match=r"--resume .*: no checkpoint in"):
        train(_cfg(tmp_path, num_steps=2, resume=str(run.run_dir)))


def test_same_seed_same_metrics_other_seed_differs(tmp_path: Path) -> None:
    a = train(_cfg(tmp_path, "reinforce", num_steps=3, name="a"))
    b = train(_cfg(tmp_path, "reinforce", num_steps=3, name="b"))
    c = train(_cfg(tmp_path, "reinforce", num_steps=3, name="c", seed=1))
    assert [_without_timing(r) for r in a.metrics] == [_without_timing(r) for r in b.metrics]
    assert [_without_timing(r) for r in a.metrics] != [_without_timing(r) for r in c.metrics]


# ---------------------------------------------------------------------------------- schema

ALL_METHODS = list(METHODS)


def _in_regime(cfg: TrainConfig) -> TrainConfig:
    """The smallest change that puts each preset inside its valid regime."""
    needs = METHODS[cfg.method].requires
    if METHODS[cfg.method].step == "set":  # VPO: its own task; scalar_grpo scores one candidate
        from rlscope.steps.set_step import ONE_CANDIDATE

        return dataclasses.replace(cfg, task="vector_pareto", task_options=TaskConfig(
            num_candidates=1 if cfg.method in ONE_CANDIDATE else 3, eval_batches=1))
    if METHODS[cfg.method].step == "two_view":  # pedagogy: its own task and two models
        return dataclasses.replace(cfg, task="teacher_student", task_options=TaskConfig())
    if "replay" in needs or "staleness" in needs:
        cfg = dataclasses.replace(cfg, replay=ReplayConfig(replay_capacity=4))
    if "bandit" in needs:
        cfg = dataclasses.replace(cfg, task="digits_bandit", task_options=TaskConfig())
    elif "binary_rewards" in needs:
        cfg = dataclasses.replace(cfg, task_options=dataclasses.replace(
            cfg.task_options, binary_reward=True))
    if METHODS[cfg.method].needs_teacher and not METHODS[cfg.method].builtin_teacher:
        # a random policy of the same model as teacher (the OPD presets' teacher is built in)
        teacher = Path(cfg.run.runs_dir) / "teacher.pt"
        policy = make_policy_for(make_task(cfg.task, cfg.task_options), cfg.model)
        torch.save({"policy": policy.state_dict()}, teacher)
        cfg = dataclasses.replace(cfg, teacher_options=TeacherConfig(str(teacher)))
    return cfg


def test_every_preset_runs_with_finite_metrics_in_regime(tmp_path: Path) -> None:
    """Every preset: validated, 20 steps in its regime (token_reversal, or digits_bandit for
    bandit-only presets), every logged number finite. The presets of the other step kinds
    (rlm_grpo: tests/test_tree_step.py) run in their own tests, on their own tasks."""
    for method in (m for m in METHODS if METHODS[m].step == "rollout"):
        result = train(_in_regime(_cfg(tmp_path, method, num_steps=20, eval_every=0,
                                       name=method, log_samples=0)))
        assert len(result.metrics) == 20, method
        for row in result.metrics:
            bad = [k for k, v in row.items() if not math.isfinite(v)]
            assert not bad, (method, bad)


# Outside each regime: no replay or delay for the replay and freshness presets, reward noise
# for dg_token (noisy rewards do not decompose), non-binary rewards for maxrl.
NOISY = dataclasses.replace(SMALL_TASK, reward_noise=0.1, reward_noise_mode="label_flip")
OUT_OF_REGIME = {"replay_dg": {}, "fresh_dg": {}, "dg_token": {"task_options": NOISY},
                 "maxrl": {}, "log_growth": {}, "dapo": {"components": MethodConfig(kl_coef=0.1)},
                 "tpo_full_action": {}, "tpo_token": {"task_options": NOISY},
                 "grpo_token": {"delay": 2}, "self_distill_dg": {"task": "digits_bandit"},
                 "scope_lite": {"task": "digits_bandit"},
                 **{m: {"components": MethodConfig(kl_coef=0.1)}
                    for m in ("clip_cov", "kl_cov", "dapo_forking")},
                 "opo": {"delay": 1}, "gpg": {"components": MethodConfig(selection="mixed_groups")},
                 "scalerl": {"components": MethodConfig(kl_coef=0.1)},
                 "vapo": {"components": MethodConfig(critic_pretrain_steps=0)},
                 "opd_reverse_kl": {"delay": 1}, "opd_topk_reverse_kl": {"task_options": NOISY},
                 "opd_pg": {"task": "digits_bandit"},
                 "traj_group_pg": {"delay": 1}}
REASONS = "(needs|weighs|is defined|is for|takes one|trains on|has no KL)"


def test_every_preset_with_requirements_has_an_out_of_regime_case() -> None:
    # the other step kinds' presets: their rejections are tested with their kind
    # (tests/test_pedagogy.py, tests/test_vpo.py, rlscope.steps.base.common_errors)
    assert set(OUT_OF_REGIME) == {m for m in METHODS
                                  if METHODS[m].requires and METHODS[m].step == "rollout"}


@pytest.mark.parametrize("method", sorted(OUT_OF_REGIME))
def test_presets_are_rejected_outside_their_regime_with_the_reason(tmp_path: Path,
                                                                   method: str) -> None:
    with pytest.raises(ConfigError, match=f"method '{method}' {REASONS}"):
        validate(_cfg(tmp_path, method, **OUT_OF_REGIME[method]))
    assert not (tmp_path / method).exists()


@pytest.mark.parametrize("method", [m for m in ALL_METHODS if METHODS[m].step != "tree"])
def test_every_logged_metric_is_registered(tmp_path: Path, method: str) -> None:
    # the tree step's runs build a Hugging Face model and REPL sandboxes: tests/test_tree_step.py
    # checks that every metric it logs is registered
    result = train(_in_regime(_cfg(tmp_path, method, num_steps=3, eval_every=2, name=method)))
    metrics = read_jsonl(result.run_dir / "metrics.jsonl")
    evals = read_jsonl(result.run_dir / "eval.jsonl")
    assert len(metrics) == 3 and [e["step"] for e in evals] == [0, 2, 3]
    for row in metrics + evals:
        assert unregistered(row) == []
    # timing in the schema matches where the key was written
    for key in metrics[0]:
        if key != "step":
            assert metric_def(key).timing != "eval", key
    for key in evals[0]:
        if key != "step" and key != "time/eval":
            assert metric_def(key).timing == "eval", key


# The bandits and the text tasks have their own option sets and eval tests
# (test_digits_bandit, test_lm_bandit, test_arithmetic, test_reward_model; unique_path:
# test_learnability).
@pytest.mark.parametrize("task", [t for t in TASKS if t != "token_reversal" and t not in (
    "digits_bandit", "lm_bandit", "arithmetic", "length_target", "preference_rm",
    "unique_path", "twenty_questions_answerer")])
def test_task_eval_metrics_are_registered(tmp_path: Path, task: str) -> None:
    options = dataclasses.replace(SMALL_TASK, score_len=2)
    if task == "code_unit_tests":  # reads none of the token-sandbox options
        options = TaskConfig(eval_batches=1, eval_batch_size=4, code_completion_len=24)
    if task in ("guess_number", "twenty_questions", "calculator_tool", "code_repair"):
        options = TaskConfig(eval_batches=1, eval_batch_size=4, max_turns=2,
                             max_turn_tokens=8, max_episode_tokens=64)
    result = train(_cfg(tmp_path, "reinforce", task=task, task_options=options, num_steps=2,
                        eval_every=0))
    evals = read_jsonl(result.run_dir / "eval.jsonl")
    assert len(evals) == 1 and evals[0]["step"] == 2
    extra = {"masked_reversal": ["eval/test_error_unscored"],
             "chain_reversal": ["eval/chain_reward"], "chain_arithmetic": ["eval/chain_reward"],
             "format_answer": ["eval/chain_reward"],
             "code_unit_tests": ["eval/solved", "eval/sandbox_ok"],
             **{name: ["eval/success", "eval/turns", "eval/return"] for name in (
                 "guess_number", "twenty_questions", "calculator_tool", "code_repair")}}[task]
    for key in extra:
        assert key in evals[0]
    assert unregistered(evals[0]) == []


def test_unregistered_flags_unknown_names() -> None:
    assert unregistered({"step": 1, "reward/mean": 0.0, "made/up": 1.0}) == ["made/up"]


# ------------------------------------------------------------------------------ validation


def _error(cfg: TrainConfig) -> str:
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    with pytest.raises(ConfigError) as info_train:
        train(cfg)
    assert str(info.value) == str(info_train.value)
    return str(info.value)


def test_grouped_method_rejects_group_size_one(tmp_path: Path) -> None:
    for method in ("grpo", "dr_grpo", "dapo", "rloo"):
        msg = _error(_cfg(tmp_path / "runs", method, group_size=1))
        assert "group_size=1" in msg and "> 1" in msg
    # an ungrouped method with an explicit group of 1 is fine
    validate(_cfg(tmp_path / "runs", "reinforce", group_size=1))


def test_batch_not_divisible_by_group(tmp_path: Path) -> None:
    msg = _error(_cfg(tmp_path / "runs", "grpo", batch_size=16, group_size=3))
    assert "batch_size=16" in msg and "group_size=3" in msg and "divisible" in msg


def test_unknown_method_lists_valid_names(tmp_path: Path) -> None:
    msg = _error(_cfg(tmp_path / "runs", "nope"))
    assert "'nope'" in msg
    for name in METHODS:
        assert name in msg


def test_method_names_are_case_insensitive(tmp_path: Path) -> None:
    spec, _, _ = validate(_cfg(tmp_path / "runs", "DrGRPO"))
    assert spec == METHODS["dr_grpo"]


def test_unknown_task_lists_valid_names(tmp_path: Path) -> None:
    msg = _error(_cfg(tmp_path / "runs", task="nope"))
    assert "'nope'" in msg
    for name in TASKS:
        assert name in msg


def test_negative_clip_names_the_field(tmp_path: Path) -> None:
    msg = _error(_cfg(tmp_path / "runs", components=MethodConfig(clip_low=-0.1)))
    assert "clip_low=-0.1" in msg
    assert "clip_high" not in msg


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    msg = _error(_cfg(tmp_path / "runs", batch_size=16, group_size=3,
                      components=MethodConfig(clip_low=-0.1)))
    assert "group_size=3" in msg and "clip_low" in msg


def test_invalid_config_creates_no_run_directory(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for cfg in (_cfg(runs, "nope"), _cfg(runs, task="nope"), _cfg(runs, group_size=1),
                _cfg(runs, components=MethodConfig(clip_low=-0.1))):
        with pytest.raises(ConfigError):
            train(cfg)
    assert not runs.exists()


# ----------------------------------------------------------------------------------- delay


def test_delay_warms_up_on_the_fresh_batch_then_trains_off_policy(tmp_path: Path) -> None:
    result = train(_cfg(tmp_path, "grpo", delay=3, num_steps=8, eval_every=2))
    rows = read_jsonl(result.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(8))
    assert [r["step"] for r in result.metrics] == list(range(8))
    # evaluation starts once the queue is warm: steps 3, 5, 7, then after the last step
    assert [e["step"] for e in result.evals] == [3, 5, 7, 8]
    # the warm-up steps 0-2 train on their fresh batch: on-policy, and they do update
    for r in rows[:3]:
        assert r["policy/ratio_mean_first"] == pytest.approx(1.0, abs=1e-5)
        assert r["policy/kl_behaviour_k3_first"] == pytest.approx(0.0, abs=1e-6)
        assert r["optim/grad_norm"] > 0
    # from step 3 on, every batch was sampled 3 steps (and as many updates) ago
    for r in rows[3:]:
        assert r["policy/ratio_max_first"] > 1.0 + 1e-4
        assert r["policy/ratio_min_first"] < 1.0 - 1e-4
        assert r["policy/kl_behaviour_k3_first"] > 1e-6
    assert json.loads((result.run_dir / "status.json").read_text())["steps"] == 8


def test_no_delay_first_pass_is_on_policy(tmp_path: Path) -> None:
    result = train(_cfg(tmp_path, "grpo", num_steps=4))
    for r in result.metrics:
        assert r["policy/ratio_mean_first"] == pytest.approx(1.0, abs=1e-5)
        assert r["policy/ratio_max_first"] == pytest.approx(1.0, abs=1e-4)
        assert r["policy/ratio_min_first"] == pytest.approx(1.0, abs=1e-4)
        assert r["policy/clipfrac_region_first"] == 0.0


# -------------------------------------------------------------------------- dapo selection


def test_dapo_selection_metrics_are_consistent(tmp_path: Path) -> None:
    result = train(_cfg(tmp_path, "dapo", num_steps=6, batch_size=32, group_size=4))
    for r in result.metrics:
        mixed, retained, fallback = (r["group/mixed_rate"], r["group/retained_rate"],
                                     r["group/fallback"])
        assert 0.0 <= mixed <= 1.0 and 0.0 < retained <= 1.0
        assert fallback in (0.0, 1.0)
        if fallback:
            assert mixed == 0.0 and retained == 1.0
        else:
            assert retained == pytest.approx(mixed, abs=1e-7)
            # 8 groups of 4: both rates are multiples of 1/8
            assert (mixed * 8) == pytest.approx(round(mixed * 8), abs=1e-6)
    assert any(0.0 < r["group/mixed_rate"] for r in result.metrics)


def _constant_score(self: ReversalTask, batch: Any) -> Scores:
    zeros_BT = torch.zeros(batch.completion_tokens_BT.shape)
    return Scores(rewards_B=torch.zeros(batch.batch_size), token_rewards_BT=zeros_BT)


def test_dapo_stops_out_of_regime_when_no_group_is_mixed(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.setattr(ReversalTask, "score", _constant_score)
    result: RunResult = train(_cfg(tmp_path, "dapo", num_steps=30))
    assert result.status == "out_of_regime"
    # steps 0..8 fall back and are logged; the 10th fallback in a row stops the run
    assert [r["step"] for r in result.metrics] == list(range(OUT_OF_REGIME_STREAK - 1))
    for r in result.metrics:
        assert r["group/fallback"] == 1.0 and r["group/mixed_rate"] == 0.0
        assert r["group/retained_rate"] == 1.0
    # no final evaluation after the stop
    assert [e["step"] for e in result.evals] == [0, 5]
    status = json.loads((result.run_dir / "status.json").read_text())
    assert status["status"] == "out_of_regime" and status["steps"] == OUT_OF_REGIME_STREAK - 1
    assert (result.run_dir / "checkpoints" / "latest.pt").exists()


def test_ungrouped_method_ignores_constant_rewards(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ReversalTask, "score", _constant_score)
    result = train(_cfg(tmp_path, "reinforce", num_steps=12))
    assert result.status == "completed" and len(result.metrics) == 12
    assert all("group/fallback" not in r for r in result.metrics)


def test_label_trained_method_ignores_the_rollouts_kept_set(tmp_path: Path) -> None:
    """`ce` is teacher-forced on the targets, which may lie outside the rollout's top-k set:
    replaying that set would give log π = −inf and an infinite loss."""
    cfg = dataclasses.replace(_cfg(tmp_path, method="ce"),
                              sampling=SamplingConfig(top_k=1))
    rows = train(cfg).metrics
    assert all(torch.isfinite(torch.tensor(r["loss/total"])) for r in rows)
    assert rows[-1]["loss/total"] < rows[0]["loss/total"]


def test_float64_runs_compute_log_probs_in_float64(tmp_path: Path) -> None:
    """The sampler and the learner keep float64 (no silent float32 round trip), so an fp64
    on-policy first pass has a ratio equal to 1 far below float32 resolution."""
    cfg = dataclasses.replace(_cfg(tmp_path, method="reinforce"),
                              model=ModelConfig(dtype="float64"))
    first = train(cfg).metrics[0]
    assert abs(first["policy/ratio_mean_first"] - 1.0) < 1e-12
    assert first["sampler/logp_diff_max"] < 1e-12


def test_a_crash_keeps_finished_steps_and_records_the_failure(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """Steps logged before an exception stay on disk; status.json says the run failed."""
    original = ReversalTask.score
    calls = {"n": 0}

    def score_then_crash(self: ReversalTask, batch: Any) -> Scores:
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("reward server went away")
        return original(self, batch)

    monkeypatch.setattr(ReversalTask, "score", score_then_crash)
    cfg = _cfg(tmp_path, method="dg", name="crash", eval_every=0)
    with pytest.raises(RuntimeError, match="reward server"):
        train(cfg)
    run_dir = tmp_path / "crash"
    assert [row["step"] for row in read_jsonl(run_dir / "metrics.jsonl")] == [0, 1, 2]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "failed" and status["steps"] == 3
    assert "reward server went away" in status["error"]


def test_threads_option_does_not_leak_past_the_run(tmp_path: Path) -> None:
    before = torch.get_num_threads()
    train(_cfg(tmp_path, method="dg", num_steps=1, eval_every=0, threads=1))
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("method", sorted(m for m in METHODS if METHODS[m].grouped))
def test_grouped_presets_are_rejected_without_groups(tmp_path: Path, method: str) -> None:
    """Outside the grouped presets' regime: one sample per prompt, so nothing to compare."""
    with pytest.raises(ConfigError, match=r"run.group_size=1: this method compares samples "
                                          r"within a group, so group_size must be > 1"):
        validate(_cfg(tmp_path, method, group_size=1))


# ---------------------------------------------------------------------- overfit one batch


@pytest.mark.parametrize(("method", "final_below"), [("ce", 0.05), ("reinforce", -1.0)])
def test_overfit_batch_drives_the_loss_down_on_one_fixed_batch(
        tmp_path: Path, method: str, final_below: float) -> None:
    # Measured (seed 0, 30 steps, --embed_init balanced): ce 0.913 -> 0.008; reinforce
    # 0.071 -> -2.91. Pinned to balanced: the test checks --overfit_batch, and under the
    # reference init CE is slower on reversal (loss 0.522 at step 30, seed 0; issue 15).
    cfg = _cfg(tmp_path, method, num_steps=30, eval_every=0, overfit_batch=True,
               log_samples=0)
    result = train(dataclasses.replace(cfg, model=ModelConfig(embed_init="balanced")))
    losses = [m["loss/total"] for m in result.metrics]
    assert len(losses) == 30
    assert losses[-1] < final_below < losses[0]
    assert {m["reward/mean"] for m in result.metrics} == {result.metrics[0]["reward/mean"]}
    # The behaviour log-probs are those of the one sampling, so the ratios leave 1.
    assert abs(result.metrics[-1]["policy/ratio_mean"] - 1.0) > 0.05


@pytest.mark.parametrize("run_kw", [{"delay": 1}, {"fill_batch": True}])
def test_overfit_batch_rejects_stale_or_refilled_batches(tmp_path: Path,
                                                         run_kw: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="overfit_batch"):
        validate(_cfg(tmp_path, overfit_batch=True, **run_kw))
    cfg = dataclasses.replace(_cfg(tmp_path, overfit_batch=True),
                              replay=ReplayConfig(replay_capacity=2))
    with pytest.raises(ConfigError, match="overfit_batch"):
        validate(cfg)
