"""The doctor on real rlscope runs (issue 5, "End to end"): pathological settings produce the
findings that explain them, with the cause; a healthy run stays quiet; the live doctor alerts
during training and writes findings.json; `rlscope doctor` reads the run directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlscope.cli import main
from rlscope.config import ModelConfig, OptimConfig, RunConfig, TrainConfig
from rlscope.doctor.diagnosis import Diagnosis, run_doctor
from rlscope.sampling import SamplingConfig
from rlscope.tasks import TaskConfig
from rlscope.train import RunResult, train

SMALL_EVAL = {"eval_batches": 1, "eval_batch_size": 64}


def _train(tmp_path: Path, method: str, steps: int, name: str, task: dict[str, Any] | None = None,
           **kw: Any) -> RunResult:
    run = RunConfig(num_steps=steps, eval_every=10, progress=False, device="cpu",
                    runs_dir=str(tmp_path), name=name, log_samples=0)
    # The findings' step numbers were measured under the balanced init (bit-identical to the
    # init before ModelConfig.embed_init existed); these tests check the doctor, not the init.
    kw.setdefault("model", ModelConfig(embed_init="balanced"))
    return train(TrainConfig(method=method, run=run,
                             task_options=TaskConfig(**{**SMALL_EVAL, **(task or {})}), **kw))


def _diagnosis(result: RunResult) -> Diagnosis:
    (d,) = run_doctor(result.run_dir)
    return d


def _ids(d: Diagnosis, severities: tuple[str, ...] = ("warning", "critical")) -> set[str]:
    return {f.id for f in d.findings if f.severity in severities}


def test_ppo_with_a_ten_times_larger_learning_rate(tmp_path: Path) -> None:
    """lr 1e-2 instead of 1e-3: the critic's loss spikes (value_instability) from the first
    steps; measured on these 30 steps: value-loss spikes at steps 2, 3, 4 and 11, robust z up
    to 30. The first three are one surge; a rolling median over only 7 points follows a
    3-step surge at the start of a 30-step run, which is why this test failed while the spike
    neighbourhood was fixed at 7 points (it is n/3 within [7, 15] now)."""
    d = _diagnosis(_train(tmp_path, "ppo", 30, "ppo_lr", optim=OptimConfig(lr=1e-2)))
    assert {"kl_runaway", "value_instability"} & _ids(d)


def test_top_p_without_mask_replay_is_a_sampler_mismatch_with_its_cause(tmp_path: Path) -> None:
    d = _diagnosis(_train(tmp_path, "grpo", 15, "topp",
                          sampling=SamplingConfig(top_p=0.9, replay_sampling_mask=False)))
    """The learner scores the sampled tokens under the unfiltered distribution while the
    sampler drew them from the renormalised top-p set, so the first pass is off by ~4%
    (measured ratio_mean_first ≈ 0.96); the finding names the recorded sampling config."""
    (f,) = [f for f in d.findings if f.id == "sampler_mismatch"]
    assert "top_p=0.9" in f.evidence["cause"]
    assert "replay_sampling_mask=False" in f.evidence["cause"]
    assert f.evidence["ratio_mean_first_abs_dev"] > 0.01


def test_grpo_on_an_easy_task_collapses_entropy_through_sigma_amplification(
        tmp_path: Path) -> None:
    """token_reversal with 5 tokens: solved within 80 steps; entropy crosses 0.1 nats at
    step ~43 and stays below from ~60 (measured), after the normalisation amplified tiny gaps
    ~8× from step 0."""
    d = _diagnosis(_train(tmp_path, "grpo", 80, "easy", task={"seq_len": 5}))
    (collapse,) = [f for f in d.findings if f.id == "entropy_collapse"]
    assert collapse.causes == ("sigma_amplification",)
    amp = next(f for f in d.findings if f.id == "sigma_amplification")
    assert amp.step is not None and collapse.step is not None and amp.step <= collapse.step


def test_a_short_healthy_grpo_run_only_shows_what_its_dynamics_justify(tmp_path: Path) -> None:
    """30 steps of grpo on the default token_reversal, still learning. The one warning its
    dynamics justify is sigma_amplification: rewards are fractions of 10 positions, groups of
    8 differ by a position or two, and z-scoring divides by that small spread (adv/amplification
    ~9–13 measured). Nothing else fires, and the verdict says it is improving."""
    d = _diagnosis(_train(tmp_path, "grpo", 30, "healthy"))
    assert _ids(d) <= {"sigma_amplification"}
    verdict = d.verdict
    assert verdict is not None and verdict.evidence["verdict"] == "improving"


def test_live_doctor_alerts_once_and_writes_findings(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    result = _train(tmp_path, "grpo", 20, "live")
    err = capsys.readouterr().err
    alerts = [line for line in err.splitlines() if line.startswith("doctor ")]
    assert any("sigma_amplification" in line for line in alerts)
    assert len(alerts) == len({line.split(":")[1] for line in alerts})  # each id once
    findings = json.loads((result.run_dir / "findings.json").read_text())
    assert findings["source"] == "live" and findings["format"] == "run"
    assert "sigma_amplification" in {f["id"] for f in findings["findings"]}
    # the CLI on the run directory agrees with what the loop wrote
    assert main(["doctor", str(result.run_dir), "--output", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [f["id"] for f in printed[0]["findings"]] == [f["id"] for f in findings["findings"]]
