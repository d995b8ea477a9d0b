"""Off-policy corrections through the training loop: exact no-ops on-policy, active when the
learner does not replay the sampler's top-k set."""

from __future__ import annotations

from pathlib import Path

import torch

from rlscope.config import RunConfig, TrainConfig
from rlscope.methods import MethodConfig
from rlscope.policy import ModelConfig
from rlscope.sampling import SamplingConfig
from rlscope.tasks import TaskConfig
from rlscope.train import RunResult, train


def _run(tmp_path: Path, name: str, correction: str | None, replay: bool = True,
         **components: float) -> RunResult:
    return train(TrainConfig(
        method="dg", model=ModelConfig(dtype="float64"),
        task_options=TaskConfig(vocab=4, seq_len=4, eval_batches=1, eval_batch_size=8),
        sampling=SamplingConfig(top_k=2, replay_sampling_mask=replay),
        components=MethodConfig(is_correction=correction, **components),
        run=RunConfig(num_steps=3, batch_size=16, eval_every=0, name=name, progress=False,
                      device="cpu", runs_dir=str(tmp_path))))


def _params(result: RunResult) -> dict[str, torch.Tensor]:
    return torch.load(result.run_dir / "checkpoints" / "step_3.pt", weights_only=True)["policy"]


def test_on_policy_corrections_leave_the_update_unchanged(tmp_path: Path) -> None:
    """With the kept set replayed, π_learner_old = π_sampler up to fp64 rounding (the cached
    decode and the full forward sum in other orders): every weight is 1 to 1e-12 and the
    parameters match the uncorrected run to 1e-12."""
    plain = _params(_run(tmp_path, "plain", None))
    for correction in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        result = _run(tmp_path, correction, correction)
        assert all(abs(row["sampler/correction_weight_mean"] - 1.0) < 1e-12
                   for row in result.metrics)
        corrected = _params(result)
        for k, v in plain.items():
            torch.testing.assert_close(corrected[k], v, atol=1e-12, rtol=0, msg=correction)


def test_corrections_act_on_a_sampler_learner_mismatch(tmp_path: Path) -> None:
    """Without replay the learner's full-softmax log-probs sit below the sampler's top-2
    renormalised ones: ratios < 1, so a band starting at 0.9 drops tokens and truncation at
    0.95 caps the rest."""
    masked = _run(tmp_path, "mask", "token_mask", replay=False, is_band_low=0.9)
    row = masked.metrics[0]
    assert 0 < row["sampler/correction_active_frac"] <= 1
    assert row["sampler/correction_weight_mean"] == 1 - row["sampler/correction_active_frac"]
    uncorrected = _run(tmp_path, "off", None, replay=False)
    # the weights reach the loss: dropping tokens changes the policy loss of the same batch
    assert row["loss/policy"] != uncorrected.metrics[0]["loss/policy"]
    truncated = _run(tmp_path, "trunc", "token_truncate", replay=False, is_correction_cap=0.95)
    assert truncated.metrics[0]["sampler/correction_weight_mean"] < 0.95 + 1e-12
