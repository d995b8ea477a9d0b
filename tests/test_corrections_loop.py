"""Off-policy corrections through the training loop: exact no-ops on-policy, active when the
learner does not replay the sampler's top-k set."""

from __future__ import annotations

from pathlib import Path

import pytest
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


def _params(result: RunResult, step: int = 3) -> dict[str, torch.Tensor]:
    return torch.load(result.run_dir / "checkpoints" / f"step_{step}.pt",
                      weights_only=True)["policy"]


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


def _preset(tmp_path: Path, method: str, sampling: SamplingConfig) -> RunResult:
    return train(TrainConfig(
        method=method, task_options=TaskConfig(vocab=4, seq_len=4, eval_batches=1,
                                               eval_batch_size=8),
        sampling=sampling,
        run=RunConfig(num_steps=2, batch_size=16, group_size=4, eval_every=0, name=method,
                      progress=False, device="cpu", runs_dir=str(tmp_path))))


def test_correction_presets_equal_grpo_bit_for_bit_when_the_learner_samples(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """METHODS_2026.md §3: ℓ_s = ℓ_o gives w ≡ 1, so grpo_tis, grpo_mis and icepop are grpo.
    The uncached sampler recomputes each prefix with the learner's float32 forward, so ℓ_s =
    ℓ_o exactly (the cached decode differs by rounding; see the test above) and the losses and
    final weights are bit-for-bit grpo's; the run warns that the correction does nothing."""
    sampling = SamplingConfig(use_cache=False)
    plain = _preset(tmp_path, "grpo", sampling)
    assert "warning: method" not in capsys.readouterr().err
    for method in ("grpo_tis", "grpo_mis", "icepop"):
        result = _preset(tmp_path, method, sampling)
        assert f"warning: method {method!r}" in capsys.readouterr().err
        assert [r["loss/total"] for r in result.metrics] == \
            [r["loss/total"] for r in plain.metrics], method
        for k, v in _params(plain, 2).items():
            assert torch.equal(_params(result, 2)[k], v), (method, k)
        row = result.metrics[0]
        assert (row["sampler/is_min"], row["sampler/is_max"], row["sampler/correction_ess"],
                row["sampler/masked_frac"], row["sampler/seq_log_ratio"]) == (1, 1, 1, 0, 0)


def test_correction_presets_act_on_an_unreplayed_top_k_set(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Top-2 of 4 symbols without replaying the kept set: every ρ_c ≤ 1 (the learner's full
    softmax gives a sampled token less mass than the sampler's renormalised top-2), so nothing
    is above a cap or band, the metrics agree with each other, no warning is printed, and the
    weights reach the loss."""
    sampling = SamplingConfig(top_k=2, replay_sampling_mask=False)
    plain = _preset(tmp_path, "grpo", sampling).metrics[0]
    for method in ("grpo_tis", "grpo_mis", "icepop"):
        row = _preset(tmp_path, method, sampling).metrics[0]
        assert "warning: method" not in capsys.readouterr().err
        assert row["sampler/is_max"] <= 1 + 1e-6 and row["sampler/is_mean"] < 1 - 1e-3
        assert row["sampler/frac_high"] == 0 and row["sampler/k3"] > 0
        assert row["sampler/seq_log_ratio"] < 0 and row["sampler/chi2_token"] < 0
        assert row["sampler/masked_frac"] == row["sampler/frac_low"]
        assert row["loss/policy"] != plain["loss/policy"], method
    # icepop's band [0.5, 5] drops the tokens with ρ_c < 0.5 here (is_min ≈ 0.49)
    assert 0 < row["sampler/masked_frac"] < 1
    assert row["sampler/correction_weight_mean"] < row["sampler/is_mean"]
