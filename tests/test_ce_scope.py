"""The ``ce`` oracle's scope on ``masked_reversal`` (issue 15): the supervised oracle trains
every completion position toward the ground-truth reversal, scored or not, as in the
reference sandbox; the RL methods' inputs do not change (they still see the sampled tokens
and only the scored suffix carries reward)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

import rlscope.learner as learner
from rlscope.config import RunConfig, TrainConfig, validate
from rlscope.learner import Denominators, micro_batch_loss, prepare
from rlscope.methods.configs import ObjectiveConfig
from rlscope.methods.objectives import OBJECTIVES
from rlscope.methods.terms import PolicyTerms
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


def test_self_distill_dg_distills_the_unscored_positions_at_half_gate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """self_distill_dg's token advantage is 0 off the scored suffix, so its gate is σ(0) = 1/2
    there and the label CE still trains those positions (METHODS.md and the reference put no
    score mask on the CE term)."""
    grad_BTV, _, inputs, batch = _logit_grads(tmp_path, "self_distill_dg", "masked_reversal",
                                              monkeypatch)
    assert torch.equal(inputs.tokens_BT, batch.completion_tokens_BT)
    assert torch.equal(inputs.mask_BT, batch.completion_mask_BT)
    assert torch.count_nonzero(inputs.adv_BT[:, :UNSCORED]) == 0
    assert bool((grad_BTV[:, :UNSCORED].abs().sum((0, 2)) > 0).all())


def _terms(tokens: list[int], labels: list[int], scored: list[float],
           gate: list[float]) -> PolicyTerms:
    """π at two positions [[.6, .4], [.3, .7]]; weight 0 (only the label terms move)."""
    logp_BTV = torch.tensor([[[0.6, 0.4], [0.3, 0.7]]], dtype=torch.float64).log()
    tokens_BT = torch.tensor([tokens])
    return PolicyTerms(logp_BT=logp_BTV.gather(-1, tokens_BT[..., None])[..., 0],
                       logp_old_BT=torch.zeros(1, 2, dtype=torch.float64),
                       weight_BT=torch.zeros(1, 2, dtype=torch.float64),
                       mask_BT=torch.ones(1, 2, dtype=torch.float64), logp_BTV=logp_BTV,
                       tokens_BT=tokens_BT, targets_BT=torch.tensor([labels]),
                       label_mask_BT=torch.tensor([scored], dtype=torch.float64),
                       gate_BT=torch.tensor([gate], dtype=torch.float64))


def test_self_distill_ce_covers_unscored_positions_by_hand() -> None:
    """Position 0 unscored (gate 1/2 there): loss_0 = .5·.5·(−ln .6), loss_1 = .5·.4·(−ln .7)."""
    x = _terms([0, 0], [0, 1], [0.0, 1.0], [0.5, 0.4])
    loss_BT, _ = OBJECTIVES["self_distill"](x, ObjectiveConfig(distill_alpha=0.5))
    assert loss_BT[0].tolist() == pytest.approx(
        [0.25 * -math.log(0.6), 0.2 * -math.log(0.7)], abs=1e-12)


def test_scope_lite_suffix_opens_at_an_unscored_error_by_hand() -> None:
    """Actor [1, 1] vs labels [0, 1], position 0 unscored: the first wrong token is the
    unscored one, so the suffix [0, 1] ∩ scored [0, 1] corrects t = 1 with .5·(−ln .7)."""
    x = _terms([1, 1], [0, 1], [0.0, 1.0], [0.5, 0.5])
    loss_BT, stats = OBJECTIVES["scope_lite"](x, ObjectiveConfig(distill_alpha=0.5))
    assert loss_BT[0].tolist() == pytest.approx([0.0, 0.5 * -math.log(0.7)], abs=1e-12)
    assert stats["first_error_frac"][0].tolist() == [0.0, 1.0]
    clean = _terms([0, 1], [0, 1], [0.0, 1.0], [0.5, 0.5])
    loss_BT, _ = OBJECTIVES["scope_lite"](clean, ObjectiveConfig(distill_alpha=0.5))
    assert loss_BT[0].tolist() == [0.0, 0.0]


def test_dg_on_masked_reversal_keeps_the_sampled_tokens_and_completion_mask(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, inputs, batch = _logit_grads(tmp_path, "dg", "masked_reversal", monkeypatch)
    assert torch.equal(inputs.tokens_BT, batch.completion_tokens_BT)
    assert torch.equal(inputs.mask_BT, batch.completion_mask_BT)
