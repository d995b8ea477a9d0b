"""rlscope sft: the completion-only loss by hand, prompt tokens carry no loss, SFT learns
arithmetic, and rlscope train --init starts from the SFT model (same first evaluation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlscope.cli import main
from rlscope.config import ModelConfig, OptimConfig, RunConfig, TrainConfig
from rlscope.supervised.sft import SftConfig, sft, sft_batch, sft_loss
from rlscope.tasks import TaskConfig
from rlscope.train import train

SMALL_EVAL = TaskConfig(eval_batches=1, eval_batch_size=100)


# The measured numbers quoted below are under the balanced init (bit-identical to the init before
# ModelConfig.embed_init existed); these tests check SFT and the warm start, not the init.
BALANCED = ModelConfig(embed_init="balanced")


def _sft(tmp_path: Path, steps: int, **kw: object) -> SftConfig:
    kw.setdefault("model", BALANCED)
    return SftConfig(num_steps=steps, batch_size=64, eval_every=0, device="cpu", threads=1,
                     progress=False, runs_dir=str(tmp_path), name="sft",
                     task_options=SMALL_EVAL, **kw)  # type: ignore[arg-type]


def test_sft_loss_by_hand() -> None:
    logits_BLV = torch.log(torch.tensor([[[0.5, 0.5], [0.25, 0.75], [0.9, 0.1]]]))
    targets_BL = torch.tensor([[0, 1, 0]])
    loss, m = sft_loss(logits_BLV, targets_BL, torch.tensor([[0.0, 1.0, 1.0]]))
    assert float(loss) == pytest.approx(-(torch.log(torch.tensor(0.75))
                                          + torch.log(torch.tensor(0.9))).item() / 2)
    assert float(m["sft/tokens"]) == 2


def test_batch_layout_masks_the_prompt() -> None:
    tokens, attention, targets, mask = sft_batch([([7, 8], [1, 10]), ([5, 6, 7], [2, 3, 10])],
                                                 prompt_len=3, completion_len=4, pad=10)
    assert tokens.tolist() == [[10, 7, 8, 1, 10, 10, 10], [5, 6, 7, 2, 3, 10, 10]]
    assert attention.tolist() == [[0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]]
    # position j predicts token j + 1; only the completion's own tokens count
    assert mask.tolist() == [[0, 0, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 0, 0]]
    assert targets[0, 2:4].tolist() == [1, 10] and targets[1, 2:5].tolist() == [2, 3, 10]
    with pytest.raises(ValueError, match="must fit"):
        sft_batch([([1, 2, 3, 4], [1])], prompt_len=3, completion_len=4, pad=10)


def test_prompt_targets_carry_no_loss() -> None:
    """Changing the targets (and logits) at prompt positions changes neither loss nor
    gradient."""
    g = torch.Generator().manual_seed(0)
    _, _, targets, mask = sft_batch([([7, 8], [1, 10]), ([5, 6, 7], [2, 3, 10])], 3, 4, 10)
    logits = torch.randn(2, 7, 12, generator=g, requires_grad=True)
    loss, _ = sft_loss(logits, targets, mask)
    (grad,) = torch.autograd.grad(loss, logits)
    other = torch.where(mask.bool(), targets, torch.randint(0, 12, targets.shape, generator=g))
    assert not torch.equal(other, targets)
    loss2, _ = sft_loss(logits, other, mask)
    (grad2,) = torch.autograd.grad(loss2, logits)
    assert float(loss2.detach()) == float(loss.detach()) and torch.equal(grad, grad2)
    assert (grad[~mask.bool()] == 0).all()


def test_sft_reduces_arithmetic_loss_and_error(tmp_path: Path) -> None:
    """Measured (seed 0, 300 steps of 64, lr 3e-3, 2-core CPU): held-out loss 6.10 → 0.86,
    greedy error 1.00 → 0.89, format error 1.00 → 0.00; thresholds leave a wide margin."""
    result = sft(_sft(tmp_path, 300))
    assert len(result.evals) == 1 and len(result.metrics) == 300
    losses = [m["sft/loss"] for m in result.metrics]
    assert losses[0] > 5.0 and sum(losses[-10:]) / 10 < 1.5  # ln 256 = 5.55 at init
    final = result.evals[-1]
    assert final["sft/heldout_loss"] < 1.5
    assert final["eval/format_error"] < 0.1 and final["eval/test_error"] < 0.99
    payload = torch.load(result.out_dir / "sft.pt", weights_only=True)
    assert payload["task"] == "arithmetic" and payload["model"]["d_model"] == 64
    lines = (result.out_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 301 and "sft/loss" in json.loads(lines[0])


def test_sft_reads_jsonl(tmp_path: Path) -> None:
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"{a}+1=", "completion": f"{a + 1}\n"})
                              for a in range(50)))
    result = sft(_sft(tmp_path, 40, data=str(data), lr=1e-2))
    assert result.metrics[-1]["sft/loss"] < result.metrics[0]["sft/loss"] / 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": 1}\n')
    with pytest.raises(ValueError, match="expected"):
        sft(_sft(tmp_path, 1, data=str(bad)))


def test_train_init_starts_from_the_sft_model(tmp_path: Path) -> None:
    result = sft(_sft(tmp_path, 150))
    run = train(TrainConfig(
        task="arithmetic", task_options=SMALL_EVAL,
        run=RunConfig(num_steps=0, progress=False, device="cpu", threads=1,
                      runs_dir=str(tmp_path), init=str(result.out_dir))))
    sft_eval, rl_eval = result.evals[-1], run.evals[0]
    for key in ("eval/test_error", "eval/format_error", "eval/entropy"):
        assert rl_eval[key] == pytest.approx(sft_eval[key], abs=1e-6), key


def test_init_with_other_shapes_is_a_clear_error(tmp_path: Path) -> None:
    result = sft(_sft(tmp_path, 1))
    cfg = TrainConfig(task="arithmetic", task_options=TaskConfig(difficulty=3),
                      run=RunConfig(num_steps=0, progress=False, device="cpu",
                                    runs_dir=str(tmp_path), init=str(result.out_dir)))
    with pytest.raises(ValueError, match=r"does not fit this policy.*same model"):
        train(cfg)


def test_sft_warm_start_then_grpo_end_to_end(tmp_path: Path) -> None:
    """CPU end to end: difficulty 1, a short warm start, then a few GRPO steps from it log
    finite metrics."""
    result = sft(_sft(tmp_path, 150))
    run = train(TrainConfig(
        task="arithmetic", method="grpo", task_options=SMALL_EVAL, optim=OptimConfig(lr=1e-3),
        run=RunConfig(num_steps=4, batch_size=64, eval_every=2, progress=False, device="cpu",
                      threads=1, runs_dir=str(tmp_path), init=str(result.out_dir))))
    assert run.status in ("completed", "out_of_regime") and len(run.metrics) == 4
    for row in run.metrics + run.evals:
        assert all(torch.isfinite(torch.tensor(v)) for v in row.values()), row
    assert run.metrics[0]["reward/mean"] > 0  # the warm start already answers some right


def test_sft_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sft", "--num_steps", "2", "--device", "cpu", "--no_progress",
                 "--eval_batches", "1", "--eval_batch_size", "8", "--runs_dir", str(tmp_path),
                 "--name", "x"]) == 0
    assert (tmp_path / "x" / "sft.pt").exists()
    assert main(["sft", "--task", "lm_bandit", "--num_steps", "1"]) == 2


def _warm_start_then_grpo(tmp_path: Path, seed: int) -> list[float]:
    """SFT 500 steps (lr 3e-3), then GRPO 200 steps (lr 3e-4, batch 64, group 8) from it;
    the greedy error on 500 held-out problems at steps 0, 50, ..., 200."""
    evals = TaskConfig(eval_batches=5, eval_batch_size=100)
    warm = sft(SftConfig(num_steps=500, batch_size=64, lr=3e-3, eval_every=0, device="cpu",
                         threads=1, progress=False, runs_dir=str(tmp_path), seed=seed,
                         name=f"sft{seed}", task_options=evals, model=BALANCED))
    run = train(TrainConfig(
        task="arithmetic", method="grpo", task_options=evals, optim=OptimConfig(lr=3e-4),
        model=BALANCED,
        run=RunConfig(num_steps=200, batch_size=64, eval_every=50, progress=False,
                      device="cpu", threads=1, seed=seed, runs_dir=str(tmp_path),
                      init=str(warm.out_dir), doctor_every=0, name=f"grpo{seed}")))
    errors = [e["eval/test_error"] for e in run.evals]
    assert errors[0] == pytest.approx(warm.evals[-1]["eval/test_error"], abs=1e-6)
    return errors


def test_grpo_raises_arithmetic_accuracy_from_the_warm_start(tmp_path: Path) -> None:
    """Measured on the 2-core CPU, seed 0: error 0.714 at the warm start, then 0.650, 0.588,
    0.640, 0.640 (mean of the last two 0.074 below the start; the evaluation's standard error
    is about 0.02). The threshold keeps half of that margin."""
    errors = _warm_start_then_grpo(tmp_path, seed=0)
    assert len(errors) == 5
    assert sum(errors[-2:]) / 2 <= errors[0] - 0.04
    assert min(errors) <= errors[0] - 0.08


@pytest.mark.slow
def test_grpo_raises_arithmetic_accuracy_on_every_seed(tmp_path: Path) -> None:
    """Seeds 0–2, measured: 0.714 → 0.640, 0.696 → 0.636, 0.928 → 0.898 (start → mean of the
    last two evaluations); the mean gain is 0.055."""
    gains = []
    for seed in range(3):
        errors = _warm_start_then_grpo(tmp_path, seed)
        gains.append(errors[0] - sum(errors[-2:]) / 2)
    assert all(g > 0 for g in gains) and sum(gains) / 3 >= 0.03
