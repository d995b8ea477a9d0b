"""The RLM tree step's update (`rlscope.steps.tree_update`, `segment_weighted`): hand-computed
values, and the identity "rlm_grpo with no children equals GRPO on the root turns"
(COMPANIONS.md §4 and §6)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rlscope.batch import RolloutBatch
from rlscope.learner import Denominators, LearnerInputs, forward_completion, micro_batch_loss
from rlscope.methods.aggregation import segment_weighted
from rlscope.methods.configs import KLConfig
from rlscope.methods.presets import METHODS
from rlscope.policy.hf import HFPolicy, tiny_hf_model
from rlscope.sampling import SampledDistribution
from rlscope.steps.tree_update import (
    TreeSegment,
    UpdateOptions,
    segment_objective,
    segment_tensors,
    token_logprobs,
    tree_advantages,
    update_on_segments,
)


def test_segment_weighted_is_the_weighted_sum_of_segment_token_means_over_trees() -> None:
    # segment 0: tokens (1, 3), mean 2, weight 1/2; segment 1: tokens (4, 6, 8), mean 6,
    # weight 1/4; segment 2: token (10), mean 10, weight 1/4; 2 trees:
    # (2/2 + 6/4 + 10/4) / 2 = (1 + 1.5 + 2.5) / 2 = 2.5
    loss_BT = torch.tensor([[1.0, 3.0, 99.0], [4.0, 6.0, 8.0], [10.0, 99.0, 99.0]])
    mask_BT = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    weight_B = torch.tensor([0.5, 0.25, 0.25])
    assert segment_weighted(loss_BT, mask_BT, weight_B, 2).item() == pytest.approx(2.5)
    # micro-batches of one row sum to the whole: the denominator N_trees is global
    shares = sum(segment_weighted(loss_BT[i:i + 1], mask_BT[i:i + 1], weight_B[i:i + 1], 2)
                 for i in range(3))
    assert float(shares) == pytest.approx(2.5)
    with pytest.raises(ValueError, match="n_trees=0"):
        segment_weighted(loss_BT, mask_BT, weight_B, 0)


def test_segment_objective_by_hand() -> None:
    # token 0: ρ = e^{0.5} ≈ 1.6487 > 1.2, A = 1 → clipped: −1.2; token 1: ρ = e^{-0.1} ≈
    # 0.904837, A = 1 → −0.904837. k3 with ℓ_ref − ℓ = d: e^d − d − 1; token 0: d = 0 → 0;
    # token 1: d = 0.2 → e^{0.2} − 1.2 = 0.0214028. β = 0.5.
    logp = torch.tensor([[-1.0, -2.0]])
    old = torch.tensor([[-1.5, -1.9]])
    ref = torch.tensor([[-1.0, -1.8]])
    loss_BT, stats = segment_objective(logp, old, ref, torch.tensor([1.0]), 0.2, 0.2, 0.5)
    k3 = math.exp(0.2) - 1.2
    assert loss_BT.tolist()[0] == pytest.approx([-1.2, -math.exp(-0.1) + 0.5 * k3])
    assert stats["clipfrac_region"].tolist() == [[1.0, 0.0]]
    assert stats["kl_ref_k3"].tolist()[0] == pytest.approx([0.0, k3])
    # A < 0: min(ρA, clip(ρ)A) takes the larger |.|: ρ = e^{0.5}, A = −1 → −(−1.6487) = 1.6487
    loss_BT, _ = segment_objective(logp, old, logp, torch.tensor([-1.0]), 0.2, 0.2, 0.5)
    assert loss_BT[0, 0].item() == pytest.approx(math.exp(0.5))


def test_tree_advantages_by_hand() -> None:
    # group (1, 0, 0, 1): mean 0.5, population std 0.5 → ±1; group (0.3, 0.3): std 0 → 0
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert tree_advantages(rewards, 4, True).tolist() == pytest.approx([1, -1, -1, 1], abs=1e-6)
    assert tree_advantages(rewards, 4, False).tolist() == [0.5, -0.5, -0.5, 0.5]
    flat = torch.tensor([0.3, 0.3, 1.0, 0.0])
    assert tree_advantages(flat, 2, True).tolist() == pytest.approx([0, 0, 1, -1], abs=1e-6)
    assert tree_advantages(flat, 2, False).tolist() == [0.0, 0.0, 0.5, -0.5]


def test_segment_tensors_mask_the_context_and_keep_the_generated_ids() -> None:
    a = TreeSegment(0, -1, 0, (5, 6, 7), (8, 9), 1.0, 1.0)
    b = TreeSegment(0, 0, 0, (5,), (4,), 1.0, 0.5)
    tokens_BL, mask_BT = segment_tensors([a, b])
    assert tokens_BL.tolist() == [[5, 6, 7, 8, 9], [5, 4, 0, 0, 0]]
    # position t predicts token t + 1: a's generated ids sit at 3, 4 → mask at 2, 3
    assert mask_BT.tolist() == [[0, 0, 1, 1], [1, 0, 0, 0]]


def _models() -> tuple[HFPolicy, HFPolicy]:
    policy = HFPolicy(tiny_hf_model("qwen2", 16, seed=0, hidden_size=16, num_layers=1,
                                    num_heads=2, max_len=32)).double()
    reference = HFPolicy(tiny_hf_model("qwen2", 16, seed=1, hidden_size=16, num_layers=1,
                                       num_heads=2, max_len=32)).double()
    return policy, reference


def test_rlm_grpo_with_no_children_equals_grpo_on_the_root_turns() -> None:
    """Four one-turn trees of one prompt, no children: the tree update's step (SGD, lr 1, no
    clipping, so the parameter change is −∇) equals −∇ of the grpo objective of
    `rlscope.learner.micro_batch_loss` (ppo_clip, k3 KL to the reference with β = 0.01 in the
    loss, each row's token mean averaged over rows)."""
    policy, reference = _models()
    prompt = (1, 2, 3)
    completions = [(4, 5, 6), (7, 8), (9, 10, 11, 12), (13,)]
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0])
    adv_B = tree_advantages(rewards, 4, True).double()
    segments = [TreeSegment(i, -1, 0, prompt, c, float(adv_B[i]), 1.0)
                for i, c in enumerate(completions)]

    # the grpo path: a RolloutBatch of the root turns, right-padded completions
    T = max(len(c) for c in completions)
    tokens_BT = torch.tensor([list(c) + [0] * (T - len(c)) for c in completions])
    mask_BT = torch.tensor([[1.0] * len(c) + [0.0] * (T - len(c)) for c in completions],
                           dtype=torch.float64)
    zeros = torch.zeros(4, T, dtype=torch.float64)
    batch = RolloutBatch(prompt_tokens_BP=torch.tensor([prompt] * 4), prompt_mask_BP=None,
                         completion_tokens_BT=tokens_BT, completion_mask_BT=mask_BT,
                         logp_sampler_BT=zeros, logp_raw_BT=zeros,
                         finished_by_stop_B=torch.ones(4, dtype=torch.bool),
                         group_id_B=torch.zeros(4, dtype=torch.long), rewards_B=rewards)
    dist = SampledDistribution()
    with torch.no_grad():
        logp_old = forward_completion(policy, batch, tokens_BT, dist).logp_BT
        logp_ref = forward_completion(reference, batch, tokens_BT, dist).logp_BT
    spec = dataclasses.replace(METHODS["grpo"], agg="seq_mean_token_mean", kl=KLConfig(
        coef=0.01, estimator="k3", target="ref", place="loss"))
    inputs = LearnerInputs(adv_BT=adv_B[:, None] * mask_BT, mask_BT=mask_BT,
                           tokens_BT=tokens_BT, logp_old_BT=logp_old, ref_logp_BT=logp_ref)
    grpo = micro_batch_loss(spec, policy, None, batch, inputs,
                            Denominators.of(inputs, 0, 4, T), 0.01, dist)
    grpo.loss.backward()
    grads = [p.grad.clone() for p in policy.parameters()]
    policy.zero_grad()

    before = [p.detach().clone() for p in policy.parameters()]
    params = list(policy.parameters())
    metrics = update_on_segments(
        policy, reference, torch.optim.SGD(params, lr=1.0), params, segments, 4,
        UpdateOptions(clip_low=0.2, clip_high=0.2, kl_coef=0.01, micro_batch_size=1, grad_clip=0.0),
        torch.Generator().manual_seed(0))
    assert metrics["loss/total"] == pytest.approx(grpo.loss.item(), rel=1e-10)
    assert metrics["policy/ratio_mean"] == pytest.approx(1.0)
    for g, p, p0 in zip(grads, policy.parameters(), before, strict=True):
        torch.testing.assert_close(p.detach() - p0, -g, rtol=1e-9, atol=1e-12)


def test_child_segments_of_weight_zero_change_nothing() -> None:
    """--no_train_child_trajectories: the child segments get weight 0, so the update equals the
    one on the root segments alone; micro-batch size does not change it either."""
    prompt = (1, 2, 3)
    roots = [TreeSegment(0, -1, 0, prompt, (4, 5), 1.0, 1.0),
             TreeSegment(1, -1, 0, prompt, (6,), -1.0, 1.0)]
    child = TreeSegment(0, 0, 0, (7, 8), (9, 10, 11), 1.0, 0.0)
    deltas = []
    for segments, micro in ((roots, 1), ([*roots, child], 1), ([child, *roots], 3)):
        policy, reference = _models()
        params = list(policy.parameters())
        before = [p.detach().clone() for p in params]
        update_on_segments(policy, reference, torch.optim.SGD(params, lr=0.1), params, segments,
                           2, UpdateOptions(micro_batch_size=micro, grad_clip=0.0),
                           torch.Generator().manual_seed(0))
        deltas.append(torch.cat([(p.detach() - b).flatten() for p, b in zip(params, before,
                                                                           strict=True)]))
    assert deltas[0].abs().sum() > 0
    torch.testing.assert_close(deltas[1], deltas[0], rtol=0, atol=0)
    torch.testing.assert_close(deltas[2], deltas[0], rtol=1e-9, atol=1e-12)


def test_repeated_updates_raise_the_rewarded_turn_and_lower_the_other() -> None:
    """Behaviour: two trees of one prompt, the first rewarded (A = +1) and the second not
    (A = −1), each a root turn and a child turn: after a few AdamW steps the policy puts more
    log-probability on both segments of the first tree and less on the second's."""
    policy, reference = _models()
    prompt, child_prompt = (1, 2, 3), (4, 5)
    good = [TreeSegment(0, -1, 0, prompt, (6, 7), 1.0, 1.0),
            TreeSegment(0, 0, 0, child_prompt, (8,), 1.0, 1.0)]
    bad = [TreeSegment(1, -1, 0, prompt, (9, 10), -1.0, 1.0),
           TreeSegment(1, 0, 0, child_prompt, (11,), -1.0, 1.0)]

    def logp(segment: TreeSegment) -> float:
        tokens_BL, mask_BT = segment_tensors([segment])
        with torch.no_grad():
            return float((token_logprobs(policy, tokens_BL) * mask_BT).sum())

    before = [logp(s) for s in good + bad]
    params = list(policy.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    for _ in range(5):
        update_on_segments(policy, reference, optimizer, params, good + bad, 2,
                           UpdateOptions(), torch.Generator().manual_seed(0))
    after = [logp(s) for s in good + bad]
    assert after[0] > before[0] and after[1] > before[1]
    assert after[2] < before[2] and after[3] < before[3]


def test_chunked_log_probs_at_the_generated_positions_equal_the_full_logits() -> None:
    """token_logprobs with a mask reads only the generated positions from the final hidden
    states, in chunks; the values (and 0 elsewhere) match the full-logits path."""
    policy, _ = _models()
    segments = [TreeSegment(0, -1, 0, (1, 2, 3), (4, 5, 6), 1.0, 1.0),
                TreeSegment(0, 0, 0, (7,), (8, 9), 1.0, 0.5)]
    tokens_BL, mask_BT = segment_tensors(segments)
    full_BT = token_logprobs(policy, tokens_BL)
    chunked_BT = token_logprobs(policy, tokens_BL, mask_BT)
    torch.testing.assert_close(chunked_BT, full_BT * mask_BT, rtol=1e-12, atol=1e-12)
    assert bool((chunked_BT[mask_BT > 0] < 0).all())
