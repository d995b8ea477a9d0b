"""The step-kind loop (`rlscope.train.kind_train`, `rlscope.steps`): dispatch, refusals, logs,
divergence and exact resume, driven by a small registered test kind (a linear regression
trained by SGD on a seeded stream)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from rlscope import steps
from rlscope.config import ConfigError, RunConfig, TrainConfig
from rlscope.methods import presets
from rlscope.methods.spec import MethodSpec
from rlscope.steps.base import StepKind
from rlscope.tasks import TaskConfig
from rlscope.train import train


class LineStep:
    """Fit y = 3x by SGD on fresh draws; ``lr`` from the config, NaN loss when lr > 100."""

    def __init__(self, cfg: TrainConfig, spec: MethodSpec, device: torch.device) -> None:
        self.w = torch.zeros(1, requires_grad=True)
        self.opt = torch.optim.SGD([self.w], lr=cfg.optim.lr)
        self.gen = torch.Generator().manual_seed(cfg.run.seed)
        self.blow_up = cfg.optim.lr > 100

    def train_step(self, step: int) -> dict[str, float]:
        x = torch.randn(8, generator=self.gen)
        loss = ((self.w * x - 3 * x) ** 2).mean()
        if self.blow_up:
            loss = loss * float("nan")
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return {"loss/total": float(loss.detach()), "reward/mean": float(self.w.detach())}

    def evaluate(self, step: int) -> dict[str, float]:
        return {"eval/test_error": abs(3.0 - float(self.w.detach()))}

    def state_dict(self) -> dict[str, Any]:
        return {"w": self.w.detach().clone(), "opt": self.opt.state_dict(),
                "gen": self.gen.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            self.w.copy_(state["w"])
        self.opt.load_state_dict(state["opt"])
        self.gen.set_state(state["gen"])

    def describe(self) -> str:
        return "fit y = 3x"


def line_errors(cfg: TrainConfig, spec: MethodSpec) -> list[str]:
    return ["--batch_size must be 8 for line_fit"] if cfg.run.batch_size != 8 else []


@pytest.fixture(autouse=True)
def line_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(steps.STEPS, "line", StepKind(
        tasks={"line_task": "fit a line"}, validate=line_errors, build=LineStep))
    monkeypatch.setitem(presets.METHODS, "line_fit", MethodSpec(
        description="test", source="test", regime="test", step="line"))
    monkeypatch.setitem(presets._LOOKUP, "linefit", "line_fit")


def config(tmp_path: Path, **run: Any) -> TrainConfig:
    return TrainConfig(method="line_fit", task="line_task", run=RunConfig(**{
        "num_steps": 6, "batch_size": 8, "eval_every": 2, "runs_dir": str(tmp_path / "runs"),
        "progress": False, "device": "cpu", **run}))


def records(run_dir: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


def test_a_method_and_a_task_of_different_kinds_are_refused_naming_both(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--method grpo trains with the 'rollout' step, but "
                                          r"--task line_task is a task of the 'line' step.*"
                                          r"line_fit"):
        steps.validate_run(TrainConfig(method="grpo", task="line_task"))
    with pytest.raises(ConfigError, match=r"'line' step, but --task token_reversal is a task "
                                          r"of the 'rollout' step.*line_task"):
        steps.validate_run(TrainConfig(method="line_fit", task="token_reversal"))
    assert steps.validate_run(TrainConfig(method="grpo", task="token_reversal")) == "rollout"
    assert steps.validate_run(config(tmp_path)) == "line"


def test_the_kind_checks_and_the_common_refusals_are_listed_together(tmp_path: Path) -> None:
    cfg = config(tmp_path, batch_size=4, delay=2)
    with pytest.raises(ConfigError) as error:
        steps.validate_run(cfg)
    assert "--delay is not supported by the 'line' step" in str(error.value)
    assert "--batch_size must be 8 for line_fit" in str(error.value)
    noisy = TrainConfig(method="line_fit", task="line_task", run=RunConfig(batch_size=8),
                        task_options=TaskConfig(reward_noise=0.1))
    with pytest.raises(ConfigError, match="--reward_noise is not supported"):
        steps.validate_run(noisy)


def test_a_kind_run_logs_every_step_evaluates_on_schedule_and_completes(tmp_path: Path) -> None:
    out = tmp_path / "out.csv"
    result = train(config(tmp_path, output=str(out)))
    assert result.status == "completed"
    assert [m["step"] for m in records(result.run_dir, "metrics.jsonl")] == list(range(6))
    assert [e["step"] for e in records(result.run_dir, "eval.jsonl")] == [0, 2, 4, 6]
    assert all(m["time/step"] > 0 for m in result.metrics)
    assert json.loads((result.run_dir / "status.json").read_text())["status"] == "completed"
    stored = json.loads((result.run_dir / "config.json").read_text())
    assert stored["task_description"] == "fit y = 3x"
    assert stored["method_spec"]["step"] == "line"
    assert len(out.read_text().splitlines()) == 1 + 4  # header + one row per evaluation
    # SGD on y = 3x moves w towards 3 from 0
    assert result.evals[-1]["eval/test_error"] < result.evals[0]["eval/test_error"] == 3.0


def test_a_kind_run_resumed_from_its_checkpoint_equals_the_uninterrupted_run(
        tmp_path: Path) -> None:
    whole = train(config(tmp_path / "a", checkpoint_every=3))
    first = train(config(tmp_path / "b", num_steps=3, checkpoint_every=3))
    resumed = train(config(tmp_path / "b", checkpoint_every=3, resume=str(first.run_dir)))
    assert resumed.status == "completed"
    assert [m["reward/mean"] for m in records(resumed.run_dir, "metrics.jsonl")] == \
        [m["reward/mean"] for m in whole.metrics]
    assert [e["step"] for e in records(resumed.run_dir, "eval.jsonl")] == [0, 2, 4, 6]
    assert resumed.evals[-1] == {**whole.evals[-1], "time/eval": resumed.evals[-1]["time/eval"]}


def test_a_non_finite_loss_stops_a_kind_run_as_diverged(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    cfg = TrainConfig(method=cfg.method, task=cfg.task, run=cfg.run,
                      optim=type(cfg.optim)(lr=1000.0))
    result = train(cfg)
    assert result.status == "diverged"
    assert result.reason == "loss/total = nan at step 0"
    assert len(result.metrics) == 1


def _parse_train(args: list[str]) -> TrainConfig:
    """``rlscope train ARGS`` parsed as the command line does: the flags over the step kind's
    own defaults."""
    from rlscope.cli import _train_parse

    cfg = _train_parse(args, TrainConfig())
    return steps.with_kind_defaults(cfg, lambda defaults: _train_parse(args, defaults))


def test_the_pedagogy_and_rlm_defaults_apply_to_the_options_not_given() -> None:
    ped = _parse_train(["--task", "teacher_student", "--method", "pedagogical_rl",
                        "--num_steps", "7"])
    assert (ped.run.num_steps, ped.run.batch_size, ped.run.group_size, ped.run.eval_every) == \
        (7, 96, 8, 20)
    rlm = _parse_train(["--task", "rlm_papers", "--method", "rlm_grpo", "--device", "cpu",
                        "--lora_rank", "4"])
    assert (rlm.run.num_steps, rlm.run.batch_size, rlm.run.group_size, rlm.run.eval_every,
            rlm.run.checkpoint_every, rlm.optim.lr, rlm.optim.weight_decay) == \
        (100, 4, 4, 25, 25, 1e-5, 0.0)
    assert (rlm.model.lora_rank, rlm.model.lora_alpha, rlm.model.autocast,
            rlm.model.gradient_checkpointing) == (4, 32, "none", False)
    assert "gate_proj" in rlm.model.lora_targets and "down_proj" in rlm.model.lora_targets
    on_gpu = _parse_train(["--task", "rlm_papers", "--method", "rlm_grpo", "--device", "cuda"])
    assert (on_gpu.model.autocast, on_gpu.model.gradient_checkpointing) == ("bf16", True)
