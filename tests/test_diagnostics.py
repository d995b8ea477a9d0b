"""Entropy and gradient diagnostics: present at evaluation steps, consistent, and invisible to
training (same seed, same training metrics with them on or off)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlscope.config import DiagnosticsConfig, RunConfig, TrainConfig
from rlscope.tasks import TaskConfig
from rlscope.train import RunResult, train

ALL_ON = DiagnosticsConfig(entropy_diagnostics=True, grad_diagnostics=True)


def _run(tmp_path: Path, method: str, diagnostics: DiagnosticsConfig, name: str,
         inner_epochs: int = 1) -> RunResult:
    return train(TrainConfig(
        method=method, diagnostics=diagnostics,
        task_options=TaskConfig(seq_len=5, eval_batches=1, eval_batch_size=16),
        run=RunConfig(num_steps=6, batch_size=32, inner_epochs=inner_epochs, eval_every=3,
                      name=name, progress=False, device="cpu", runs_dir=str(tmp_path))))


def _training(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: v for k, v in row.items() if not k.startswith(("diag/", "time/", "throughput/"))}
            for row in rows]


@pytest.mark.parametrize(("method", "inner_epochs"), [("dg", 1), ("grpo", 2)])
def test_diagnostics_do_not_perturb_training(tmp_path: Path, method: str,
                                             inner_epochs: int) -> None:
    off = _run(tmp_path, method, DiagnosticsConfig(), "off", inner_epochs)
    on = _run(tmp_path, method, ALL_ON, "on", inner_epochs)
    assert _training(on.metrics) == _training(off.metrics)
    assert [e["eval/test_error"] for e in on.evals] == [e["eval/test_error"] for e in off.evals]


def test_diagnostics_appear_at_evaluation_steps_only_and_are_consistent(tmp_path: Path) -> None:
    rows = _run(tmp_path, "dg", ALL_ON, "on").metrics
    with_diag = [row["step"] for row in rows if "diag/batch_entropy_before" in row]
    assert with_diag == [0, 3]
    for row in rows:
        if row["step"] in with_diag:
            assert row["diag/batch_entropy_delta"] == pytest.approx(
                row["diag/batch_entropy_after"] - row["diag/batch_entropy_before"], abs=1e-6)
            # before the update the batch entropy is the first pass's policy/entropy
            assert row["diag/batch_entropy_before"] == pytest.approx(row["policy/entropy"],
                                                                     abs=1e-5)
            assert -1.0 <= row["diag/grad_cos_ce_oracle"] <= 1.0
            assert row["diag/grad_norm_clipped"] == pytest.approx(
                min(row["diag/grad_norm"], 1.0), rel=1e-6)
            # one epoch, one minibatch: the diagnostic gradient is the update's gradient
            assert row["diag/grad_norm"] == pytest.approx(row["optim/grad_norm"], rel=1e-5)


def test_cross_entropy_method_gradient_is_the_oracle_gradient(tmp_path: Path) -> None:
    rows = _run(tmp_path, "ce", DiagnosticsConfig(grad_diagnostics=True), "ce").metrics
    cosines = [row["diag/grad_cos_ce_oracle"] for row in rows if "diag/grad_cos_ce_oracle" in row]
    assert cosines and all(c == pytest.approx(1.0, abs=1e-5) for c in cosines)
