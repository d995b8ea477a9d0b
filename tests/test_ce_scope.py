"""The ``ce`` oracle's scope on ``masked_reversal`` (issue 15): the supervised oracle trains
every completion position toward the ground-truth reversal, scored or not, as in the
reference sandbox; the RL methods' inputs do not change (they still see the sampled tokens
and only the scored suffix carries reward)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import rlscope.learner as learner
from rlscope.config import RunConfig, TrainConfig, validate
from rlscope.learner import Denominators, micro_batch_loss, prepare
from rlscope.sampling.processors import SampledDistribution
from rlscope.tasks import TaskConfig
from rlscope.tasks.base import make_policy_for
from rlscope.train import sample_rollouts, score_rollouts

SEQ_LEN, SCORE_LEN = 6, 2
UNSCORED = SEQ_LEN - SCORE_LEN


def _logit_grads(tmp_path: Path, method: str, task: str,
                 monkeypatch: pytest.MonkeyPatch
                 ) -> tuple[torch.Tensor, torch.Tensor, Any, Any]:
    """Gradient of the method's loss w.r.t. the learner's completion logits [B, T, V], those
    logits, the prepared inputs and the scored batch, on one real batch of ``task``."""
    cfg = TrainConfig(method=method, task=task,
                      task_options=TaskConfig(seq_len=SEQ_LEN, score_len=SCORE_LEN,
                                              eval_batches=1, eval_batch_size=8),
                      run=RunConfig(num_steps=1, batch_size=16, eval_every=0, progress=False,
                                    device="cpu", runs_dir=str(tmp_path)))
    spec, task_obj, d = validate(cfg)
    torch.manual_seed(0)
    policy = make_policy_for(task_obj, cfg.model)
    g = torch.Generator().manual_seed(0)
    rollout = sample_rollouts(policy, task_obj, cfg, g, torch.device("cpu"), d.num_prompts,
                              d.group_size, d.max_new_tokens)
    batch = score_rollouts(rollout, policy, task_obj, cfg, False, 0)
    dist = SampledDistribution(1.0, False)
    inputs, _ = prepare(spec, batch, policy, None, None, 0.0, 1, dist)
    captured: list[torch.Tensor] = []
    original = learner.forward_completion

    def capturing(*args: Any, **kwargs: Any) -> learner.Forward:
        fwd = original(*args, **kwargs)
        fwd.logits_BTV.retain_grad()
        captured.append(fwd.logits_BTV)
        return fwd

    monkeypatch.setattr(learner, "forward_completion", capturing)
    den = Denominators(n_tokens=inputs.mask_BT.sum(), n_seqs=float(batch.batch_size),
                       max_len=inputs.tokens_BT.shape[1])
    micro_batch_loss(spec, policy, None, batch, inputs, den, 0.0, dist).loss.backward()
    grad = captured[0].grad
    assert grad is not None
    return grad, captured[0], inputs, batch


def test_ce_trains_the_unscored_positions_of_masked_reversal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    grad_BTV, logits_BTV, inputs, batch = _logit_grads(tmp_path, "ce", "masked_reversal",
                                                       monkeypatch)
    assert batch.score_mask_BT[:, :UNSCORED].sum() == 0, "positions planted as unscored"
    # every completion position is supervised, on the ground-truth tokens
    assert torch.equal(inputs.mask_BT, torch.ones_like(inputs.mask_BT))
    assert torch.equal(inputs.tokens_BT, batch.targets_BT)
    per_position_T = grad_BTV.abs().sum((0, 2))
    assert bool((per_position_T[:UNSCORED] > 0).all()), per_position_T
    # at an unscored position it is the CE gradient (softmax − onehot(label)) / n_tokens
    logits_V = logits_BTV[0, 0].detach()
    onehot_V = torch.nn.functional.one_hot(batch.targets_BT[0, 0], logits_V.shape[-1])
    expected_V = (logits_V.softmax(-1) - onehot_V) / inputs.mask_BT.numel()
    torch.testing.assert_close(grad_BTV[0, 0], expected_V, atol=1e-7, rtol=1e-5)


def test_ce_on_token_reversal_trains_every_position_as_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    grad_BTV, _, inputs, batch = _logit_grads(tmp_path, "ce", "token_reversal", monkeypatch)
    assert torch.equal(inputs.mask_BT, batch.score_mask_BT.to(inputs.mask_BT.dtype))
    assert bool((grad_BTV.abs().sum((0, 2)) > 0).all())


def test_an_rl_method_still_sees_only_the_scored_suffix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """self_distill_dg's per-token credit and label term live on the scored suffix: its
    gradient at the unscored positions is exactly zero, as before the CE change."""
    grad_BTV, _, inputs, batch = _logit_grads(tmp_path, "self_distill_dg", "masked_reversal",
                                           monkeypatch)
    assert torch.equal(inputs.tokens_BT, batch.completion_tokens_BT)
    assert torch.equal(inputs.mask_BT, batch.completion_mask_BT)
    assert torch.count_nonzero(grad_BTV[:, :UNSCORED]) == 0
    assert torch.count_nonzero(grad_BTV[:, UNSCORED:]) > 0


def test_dg_on_masked_reversal_keeps_the_sampled_tokens_and_completion_mask(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, inputs, batch = _logit_grads(tmp_path, "dg", "masked_reversal", monkeypatch)
    assert torch.equal(inputs.tokens_BT, batch.completion_tokens_BT)
    assert torch.equal(inputs.mask_BT, batch.completion_mask_BT)
