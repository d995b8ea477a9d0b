"""The learner side of a step: teacher-forced log-probs and the loss of one micro-batch.

``prepare`` runs the no-grad forwards a method declares it needs (critic values, reference
log-probs, the Σπ² baseline) and computes advantages for the whole batch. ``micro_batch_loss``
composes the method's components for one micro-batch; its result summed over micro-batches is
the minibatch loss (denominators are global, see `methods.aggregation`). ``update`` runs the
inner epochs, minibatches and micro-batches of one step (`rlscope.learner_graphs` replays the
same from CUDA graphs).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from rlscope.batch import CandidateBatch, RolloutBatch, _map_tensors
from rlscope.distributed import full
from rlscope.learner_packed import (
    PackedForward,
    PackedLearner,
    chunk_applies,
    chunkable,
    host_masks,
    packed_forward,
    row_token_counts,
    token_budget_slices,
)
from rlscope.methods.advantages import (
    AdvantageInputs,
    advantage_extra_metrics,
    advantages_with_returns,
    compute_advantages,
)
from rlscope.methods.aggregation import TOKEN_MEAN, aggregate, count_groups, group_token_counts
from rlscope.methods.batch_stats import BatchStatInputs
from rlscope.methods.corrections import correction_metrics
from rlscope.methods.gates import GateInputs, probs_mean_BT, reward_uncertainty_B
from rlscope.methods.objectives import PolicyTerms
from rlscope.methods.regularizers import (
    entropy_from_logp,
    kl_estimate,
    kl_full,
    kl_is_corrected,
    value_loss,
)
from rlscope.methods.spec import MethodSpec
from rlscope.methods.teacher import Teacher, sampled_logp_BT
from rlscope.metrics.estimators import masked_mean, value_metrics
from rlscope.policy.base import Policy
from rlscope.policy.value_head import ValueHead
from rlscope.sampling.processors import SampledDistribution

if TYPE_CHECKING:
    from rlscope.distributed import DataParallel


def wants_expected_reward(spec: MethodSpec, top_k: int, top_p: float) -> bool:
    """Whether scoring should compute the exact E[r | x] under the behaviour policy.

    Only with unfiltered sampling: under top-k/top-p the behaviour distribution at the
    target's prefixes is not known (the kept sets were recorded along the sampled prefixes),
    so the Σπ² baseline is used instead.
    """
    return spec.uses_expected_reward and top_k == 0 and top_p >= 1.0


@dataclass(frozen=True)
class LearnerInputs:
    """Per-row tensors fixed for the whole update (computed once by `prepare`).

    ``adv_BT``: advantages. ``mask_BT``: the loss mask the objective uses (the score mask for
    label-trained methods). ``tokens_BT``: the completion the learner is teacher-forced on.
    ``logp_old_BT``: behaviour log-probs. ``ref_logp_BT``, ``old_values_BT`` and
    ``returns_BT`` are present when the method needs them. ``uncertainty_B`` (per-sample reward
    std, `methods.gates.reward_uncertainty_B`) and ``age_B`` (staleness in optimizer steps)
    feed the gates that read them; ``rewards_B`` and ``baseline_B`` (E[r | x] where exposed,
    else the batch mean reward) feed the objectives that read sequence rewards (pmd_mean,
    log_growth's success flag r ≥ 1).
    """

    adv_BT: torch.Tensor
    mask_BT: torch.Tensor
    tokens_BT: torch.Tensor
    logp_old_BT: torch.Tensor
    ref_logp_BT: torch.Tensor | None = None
    ref_logp_BTV: torch.Tensor | None = None
    """The reference's whole processed distribution (B·T·V numbers; ``full`` KL only)."""
    old_values_BT: torch.Tensor | None = None
    returns_BT: torch.Tensor | None = None
    uncertainty_B: torch.Tensor | None = None
    age_B: torch.Tensor | None = None
    rewards_B: torch.Tensor | None = None
    baseline_B: torch.Tensor | None = None
    is_weight_BT: torch.Tensor | None = None
    """Off-policy correction weight multiplied into the per-token loss (None = none)."""
    candidates_BTK: torch.Tensor | None = None
    """Next-token candidates of a `CandidateBatch` (``tpo_token``, ``grpo_token``), with their
    behaviour log-probs ``cand_logp_old_BTK`` and dense rewards ``cand_rewards_BTK``."""
    cand_logp_old_BTK: torch.Tensor | None = None
    cand_rewards_BTK: torch.Tensor | None = None
    labels_BT: torch.Tensor | None = None
    """The task's labels at the actor's positions and ``label_mask_BT`` its scored positions
    (``self_distill``, ``scope_lite``)."""
    label_mask_BT: torch.Tensor | None = None
    select_BT: torch.Tensor | None = None
    """The batch statistic's token selection for the rows of the current optimizer step
    (set by `update`, `rlscope.methods.batch_stats`)."""
    draw_seed: torch.Tensor | None = None
    """Seed of the batch statistic's random draws (Clip-Cov), a 0-d CPU integer tensor from
    the run seed and step (None = 0)."""
    group_tokens_B: torch.Tensor | None = None
    """Valid tokens of each row's whole group (the ``prompt_mean`` aggregation)."""
    teacher_logp_BTV: torch.Tensor | None = None
    """The teacher's distribution at each completion position (objectives that read it)."""
    step: torch.Tensor | None = None
    """The run's step of this update, a 0-d CPU integer tensor (objectives that read it: a
    warm-up switch); None = not read."""

    @property
    def batch_size(self) -> int:
        return int(self.adv_BT.shape[0])

    def select(self, index_B: torch.Tensor | slice) -> LearnerInputs:
        return _map_tensors(self, lambda t: t[index_B], batched_only=True)


@dataclass(frozen=True)
class Forward:
    """One teacher-forced forward at the completion positions: log-probs of the completion under
    the sampling distribution, that distribution, the raw logits and the hidden states."""

    logp_BT: torch.Tensor
    logp_BTV: torch.Tensor
    hidden_BTD: torch.Tensor
    logits_BTV: torch.Tensor


# The `RolloutBatch` fields `forward_completion` (hence the loss) reads: the CUDA-graph
# learner copies only these into its static batch.
FIELDS_READ = ("prompt_tokens_BP", "prompt_mask_BP", "keep_mask_BTV")


def forward_completion(policy: Policy, batch: RolloutBatch, tokens_BT: torch.Tensor,
                       dist: SampledDistribution, group_size: int = 1) -> Forward:
    """Teacher-forced forward over prompt + ``tokens_BT``; log-probs at completion positions.

    The distribution is ``dist``, the one the sampler drew from: logits / temperature, and the
    top-k/top-p kept set of the rollout when ``dist.replay_keep``. With ``group_size > 1`` the
    rows must be whole contiguous groups sharing one prompt; on CPU a policy with
    ``forward_shared_prefix`` then runs each unpadded prompt once per group (the same function,
    about half the learner's work at the sandbox's group size 8).
    """
    P, T = batch.prompt_len, tokens_BT.shape[1]
    # Only on CPU, where the tiny model is bound by arithmetic; on CUDA it is bound by kernel
    # launches, and the prompt and continuation paths launch twice as many kernels.
    shared = (group_size > 1 and T > 1 and batch.prompt_mask_BP is None
              and batch.batch_size % group_size == 0 and tokens_BT.device.type == "cpu"
              and hasattr(policy, "forward_shared_prefix"))
    if shared:
        logits_BTV, hidden_BTD = policy.forward_shared_prefix(  # type: ignore[attr-defined]
            batch.prompt_tokens_BP[::group_size], tokens_BT[:, :-1])
    else:
        full_BL = torch.cat([batch.prompt_tokens_BP, tokens_BT], 1)
        mask_BL = None
        if batch.prompt_mask_BP is not None:
            mask_BL = torch.cat([batch.prompt_mask_BP, torch.ones_like(tokens_BT)], 1)
        logits_BLV, hidden_BLD = policy.forward(full_BL, mask_BL)
        logits_BTV = logits_BLV[:, P - 1:P - 1 + T]
        hidden_BTD = hidden_BLD[:, P - 1:P - 1 + T]
    logp_BTV = dist.logprobs(logits_BTV, batch.keep_mask_BTV)
    logp_BT = logp_BTV.gather(-1, tokens_BT[..., None]).squeeze(-1)
    return Forward(logp_BT, logp_BTV, hidden_BTD, logits_BTV)


@torch.no_grad()
def prepare(spec: MethodSpec, batch: RolloutBatch, policy: Policy, value_head: ValueHead | None,
            ref: Policy | None, beta: float, group_size: int, dist: SampledDistribution,
            candidates: CandidateBatch | None = None, packed: PackedLearner | None = None,
            teacher: Teacher | None = None
            ) -> tuple[LearnerInputs, dict[str, torch.Tensor]]:
    """Advantages and every fixed per-row quantity of the update, plus rollout metrics.

    ``candidates`` (rows aligned with ``batch``) feed the candidate objectives. ``packed``
    runs the forwards that read only the chosen tokens' log-probs and hidden states (critic
    values, corrections, sampled-token KL to the reference) through the packed learner
    (`rlscope.learner_packed`); values past a row's last loss position are then not computed
    (every reader masks them). ``teacher`` scores the student's tokens for the methods that
    read a teacher (`rlscope.methods.teacher`)."""
    assert batch.rewards_B is not None
    metrics: dict[str, torch.Tensor] = {}
    if spec.needs_labels:
        # The supervised oracle trains every completion position toward the ground truth,
        # scored or not (masked_reversal scores a suffix only; the reference's CE trains all).
        assert batch.targets_BT is not None
        tokens_BT = batch.targets_BT
        mask_BT = torch.ones_like(tokens_BT, dtype=batch.logp_raw_BT.dtype)
    else:
        tokens_BT, mask_BT = batch.completion_tokens_BT, batch.completion_mask_BT
    needs_probs = spec.needs_learner_probs(batch.expected_reward_B is not None)
    corrected = spec.corrected
    sum_p2_BT = values_BT = ref_logp_BT = ref_logp_BTV = token_rewards_BT = is_weight_BT = None
    chunked = packed is not None and packed.logprob_chunk > 0 and chunkable(batch, dist)
    if needs_probs or spec.needs_value or corrected:
        fwd: Forward | PackedForward | None = None if packed is None or needs_probs \
            else packed_forward(policy, packed, batch, tokens_BT, mask_BT,
                                batch.logp_sampler_BT, dist, chunked)
        if fwd is None:
            fwd = forward_completion(policy, batch, tokens_BT, dist, group_size)
        if needs_probs:  # only the Σπ² baselines read it; a critic or correction does not
            assert fwd.logp_BTV is not None  # the padded forward: packing skips needs_probs
            sum_p2_BT = fwd.logp_BTV.exp().square().sum(-1)
        if value_head is not None:
            values_BT = value_head(fwd.hidden_BTD) * mask_BT
        if corrected:
            is_weight_BT, is_stats = spec.correction_component(
                fwd.logp_BT, batch.logp_sampler_BT, mask_BT, spec.correction)
            metrics |= correction_metrics(fwd.logp_BT, batch.logp_sampler_BT, mask_BT,
                                          is_weight_BT, is_stats)
    if ref is not None:
        # the reference packs too when it has a plain linear head (`resolve_learner` checked
        # the policy's only)
        ref_packs = hasattr(ref, "final_hidden") and ref.output_head() is not None  # type: ignore[attr-defined]
        ref_fast = None if packed is None or spec.kl.exact or not ref_packs \
            else packed_forward(ref, packed, batch, tokens_BT, mask_BT,
                                batch.logp_sampler_BT, dist, chunked)
        if ref_fast is None:
            ref_fwd = forward_completion(ref, batch, tokens_BT, dist, group_size)
            ref_logp_BT = ref_fwd.logp_BT
            if spec.kl.exact:
                ref_logp_BTV = ref_fwd.logp_BTV
        else:
            ref_logp_BT = ref_fast.logp_BT
        kl1_BT = (batch.logp_sampler_BT - ref_logp_BT) * mask_BT
        metrics["policy/kl_ref_k1"] = masked_mean(kl1_BT, mask_BT)
        metrics["policy/kl_ref_k3"] = masked_mean(torch.expm1(-kl1_BT) + kl1_BT, mask_BT)
        metrics["policy/kl_ref_seq_k1"] = kl1_BT.sum(-1).mean()
        if spec.kl.place == "reward":
            token_rewards_BT = -beta * kl_estimate(batch.logp_sampler_BT, ref_logp_BT,
                                                   spec.kl.estimator) * mask_BT
    teacher_logp_BT = teacher_logp_BTV = None
    if spec.needs_teacher:
        if teacher is None:
            raise ValueError(f"method components {spec.advantage.name!r}/{spec.objective.name!r} "
                             "read a teacher: set --teacher_path")
        teacher_logp_BTV = teacher.logp_BTV(batch).to(batch.logp_sampler_BT.dtype)
        teacher_logp_BT = sampled_logp_BT(teacher_logp_BTV, tokens_BT)
        rkl_BT = (batch.logp_sampler_BT - teacher_logp_BT) * mask_BT
        metrics["distill/teacher_rkl"] = masked_mean(rkl_BT, mask_BT)
        metrics["distill/teacher_rkl_seq"] = rkl_BT.sum(-1).mean()
    x = AdvantageInputs(rewards_B=batch.rewards_B, mask_BT=mask_BT, group_size=group_size,
                        expected_reward_B=batch.expected_reward_B, sum_p2_BT=sum_p2_BT,
                        score_mask_BT=batch.score_mask_BT, values_BT=values_BT,
                        token_rewards_BT=token_rewards_BT,
                        token_correct_BT=batch.token_rewards_BT, completion_tokens_BT=tokens_BT,
                        greedy_rewards_B=batch.greedy_rewards_B,
                        teacher_logp_BT=teacher_logp_BT,
                        behaviour_logp_BT=batch.logp_sampler_BT)
    returns_BT = None
    if spec.needs_value:
        adv_BT, returns_BT = advantages_with_returns(x, spec.advantage)
        assert values_BT is not None
        metrics |= value_metrics(values_BT, returns_BT, mask_BT)
    else:
        adv_BT = compute_advantages(x, spec.advantage)
    metrics |= advantage_extra_metrics(x, spec.advantage)
    age_B = batch.age_B if batch.age_B is not None else torch.zeros_like(batch.rewards_B)
    inputs = LearnerInputs(adv_BT=adv_BT, mask_BT=mask_BT, tokens_BT=tokens_BT,
                           logp_old_BT=batch.logp_sampler_BT, ref_logp_BT=ref_logp_BT,
                           ref_logp_BTV=ref_logp_BTV,
                           old_values_BT=values_BT, returns_BT=returns_BT,
                           uncertainty_B=reward_uncertainty_B(batch.rewards_B, group_size),
                           age_B=age_B, rewards_B=batch.rewards_B,
                           baseline_B=batch.expected_reward_B if batch.expected_reward_B
                           is not None else batch.rewards_B.mean().expand_as(batch.rewards_B),
                           is_weight_BT=is_weight_BT,
                           group_tokens_B=group_token_counts(mask_BT, group_size),
                           teacher_logp_BTV=teacher_logp_BTV
                           if spec.needs_teacher_distribution else None)
    if candidates is not None:
        inputs = dataclasses.replace(
            inputs, candidates_BTK=candidates.candidates_BTK,
            cand_logp_old_BTK=candidates.logp_old_BTK, cand_rewards_BTK=candidates.rewards_BTK)
        metrics["candidates/reward_mean"] = masked_mean(candidates.rewards_BTK.mean(-1), mask_BT)
    if spec.needs_token_labels:
        if batch.targets_BT is None:
            raise ValueError(f"objective {spec.objective.name!r} needs the task's labels")
        label_mask_BT = batch.score_mask_BT if batch.score_mask_BT is not None \
            else torch.ones_like(mask_BT)
        inputs = dataclasses.replace(inputs, labels_BT=batch.targets_BT,
                                     label_mask_BT=label_mask_BT.to(mask_BT.dtype))
    return inputs, metrics


@dataclass(frozen=True)
class Denominators:
    """Global counts of the optimizer batch (so micro-batching never changes the update).

    ``n_seqs`` is a 0-d tensor under CUDA graphs, which would bake a Python float in.
    """

    n_tokens: torch.Tensor
    n_seqs: float | torch.Tensor
    max_len: int
    n_groups: float | torch.Tensor = 1.0
    """Groups with a valid token (``prompt_mean``)."""
    n_pos_tokens: float | torch.Tensor = 1.0
    """Valid tokens of the successful rows (r ≥ 1; the ``pos_nll`` term)."""

    @staticmethod
    def of(inputs: LearnerInputs, start: int, stop: int, max_len: int,
           n_seqs: float | torch.Tensor | None = None) -> Denominators:
        """The denominators of the optimizer batch ``inputs[start:stop]`` (whole groups)."""
        mask_BT = inputs.mask_BT[start:stop]
        n_groups: float | torch.Tensor = 1.0
        if inputs.group_tokens_B is not None:
            n_groups = count_groups(mask_BT, inputs.group_tokens_B[start:stop])
        n_pos: float | torch.Tensor = 1.0
        if inputs.rewards_B is not None:
            success_B = (inputs.rewards_B[start:stop] >= 1.0).to(mask_BT.dtype)
            n_pos = (mask_BT * success_B[:, None]).sum()
        return Denominators(n_tokens=mask_BT.sum(),
                            n_seqs=float(stop - start) if n_seqs is None else n_seqs,
                            max_len=max_len, n_groups=n_groups, n_pos_tokens=n_pos)


@dataclass(frozen=True)
class MicroResult:
    loss: torch.Tensor
    logp_BT: torch.Tensor
    entropy_BT: torch.Tensor
    stats: dict[str, torch.Tensor]
    """Per-token detached statistics of the objective, value loss and gate."""
    parts: dict[str, torch.Tensor]
    """This micro-batch's share of ``loss/policy``, ``loss/kl``, ``loss/entropy``,
    ``loss/value`` (before coefficients), detached."""


def micro_batch_loss(spec: MethodSpec, policy: Policy, value_head: ValueHead | None,
                     batch: RolloutBatch, inputs: LearnerInputs, den: Denominators,
                     beta: float | torch.Tensor, dist: SampledDistribution,
                     group_size: int = 1,
                     entropy_coef: float | torch.Tensor | None = None,
                     packed: PackedLearner | None = None,
                     masks_BL: torch.Tensor | None = None) -> MicroResult:
    """The method's loss on one micro-batch: objective + KL + entropy + value terms.

    ``beta`` (the KL coefficient) and ``entropy_coef`` (the entropy bonus c in force; None =
    the spec's fixed ``entropy_coef``) may be 0-d tensors, as CUDA graphs need. The ``full``
    KL estimator compares the learner's processed distribution (temperature, replayed kept
    set) with the reference's, ``inputs.ref_logp_BTV``, processed the same way. ``group_size
    > 1`` promises whole contiguous groups (see `forward_completion`). ``packed`` (a Hugging
    Face policy only) runs the forward packed and/or with chunked log-probs
    (`rlscope.learner_packed`): the same loss without padding tokens or full logits;
    ``masks_BL`` are these rows' `host_masks` (None: read from the device).
    """
    mask_BT = inputs.mask_BT
    fast = None if packed is None else packed_forward(
        policy, packed, batch, inputs.tokens_BT, mask_BT, inputs.logp_old_BT, dist,
        chunked=packed.logprob_chunk > 0 and chunk_applies(spec, batch, dist),
        masks_BL=masks_BL)
    entropy_BT: torch.Tensor | None = None
    logp_BTV: torch.Tensor | None
    if fast is None:
        fwd = forward_completion(policy, batch, inputs.tokens_BT, dist, group_size)
        logp_BT, logp_BTV, hidden_BTD = fwd.logp_BT, fwd.logp_BTV, fwd.hidden_BTD
    else:
        logp_BT, logp_BTV, hidden_BTD = fast.logp_BT, fast.logp_BTV, fast.hidden_BTD
        entropy_BT = fast.entropy_BT

    def agg(x_BT: torch.Tensor) -> torch.Tensor:
        return aggregate(x_BT, mask_BT, spec.agg, den.n_tokens, den.n_seqs, den.max_len,
                         inputs.group_tokens_B, den.n_groups)

    logp_d_BT = logp_BT.detach()
    gate_in = GateInputs(inputs.adv_BT, logp_d_BT, inputs.uncertainty_B,
                         probs_mean_BT(logp_d_BT, policy.vocab_size if logp_BTV is None
                                       else logp_BTV.shape[-1]), inputs.age_B,
                         inputs.select_BT, logp_sampler_BT=inputs.logp_old_BT, mask_BT=mask_BT)
    weight_BT, stats = spec.gate_component(gate_in, spec.gate)
    terms = PolicyTerms(logp_BT, inputs.logp_old_BT, weight_BT, mask_BT,
                        success_B=None if inputs.rewards_B is None else inputs.rewards_B >= 1.0,
                        rewards_B=inputs.rewards_B, baseline_B=inputs.baseline_B,
                        logp_BTV=logp_BTV, group_size=group_size,
                        candidates_BTK=inputs.candidates_BTK,
                        cand_logp_old_BTK=inputs.cand_logp_old_BTK,
                        cand_rewards_BTK=inputs.cand_rewards_BTK, tokens_BT=inputs.tokens_BT,
                        targets_BT=inputs.labels_BT, label_mask_BT=inputs.label_mask_BT,
                        gate_BT=stats.get("gate_mean"), select_BT=inputs.select_BT,
                        teacher_logp_BTV=inputs.teacher_logp_BTV, step=inputs.step)
    obj_BT, obj_stats = spec.objective_component(terms, spec.objective)
    if inputs.is_weight_BT is not None:
        obj_BT = obj_BT * inputs.is_weight_BT
    stats = stats | obj_stats
    policy_loss = agg(obj_BT)
    loss = policy_loss
    parts = {"loss/policy": policy_loss.detach()}
    # Only the entropy bonus differentiates H_t; otherwise it is a metric: record no graph.
    if entropy_BT is None:
        assert logp_BTV is not None
        entropy_BT = entropy_from_logp(logp_BTV if spec.uses_entropy_bonus
                                       else logp_BTV.detach())
    elif not spec.uses_entropy_bonus:
        entropy_BT = entropy_BT.detach()
    if spec.uses_entropy_bonus:
        entropy_term = agg(entropy_BT)
        loss = loss - (spec.entropy_coef if entropy_coef is None else entropy_coef) * entropy_term
        parts["loss/entropy"] = entropy_term.detach()
    if spec.kl.coef > 0 and spec.kl.place == "loss":
        if spec.kl.exact:
            assert inputs.ref_logp_BTV is not None and logp_BTV is not None
            kl_BT = kl_full(logp_BTV, inputs.ref_logp_BTV)
        elif spec.kl.importance_corrected:
            assert inputs.ref_logp_BT is not None
            kl_BT = kl_is_corrected(logp_BT, inputs.ref_logp_BT, inputs.logp_old_BT)
            stats = stats | {"kl_ref_is": kl_BT.detach()}
        else:
            target_BT = inputs.ref_logp_BT if spec.kl.target == "ref" else inputs.logp_old_BT
            assert target_BT is not None
            kl_BT = kl_estimate(logp_BT, target_BT, spec.kl.estimator)
        kl_term = agg(kl_BT)
        loss = loss + beta * kl_term
        parts["loss/kl"] = kl_term.detach()
    if spec.pos_nll_coef > 0 and inputs.rewards_B is not None:
        success_B = (inputs.rewards_B >= 1.0).to(mask_BT.dtype)
        n_pos = den.n_pos_tokens
        pos_term = (-logp_BT * mask_BT * success_B[:, None]).sum() / (
            n_pos.clamp_min(1.0) if isinstance(n_pos, torch.Tensor) else max(n_pos, 1.0))
        loss = loss + spec.pos_nll_coef * pos_term
        parts["loss/pos_nll"] = pos_term.detach()
    if value_head is not None:
        assert inputs.old_values_BT is not None and inputs.returns_BT is not None
        values_BT = value_head(hidden_BTD)
        v_loss_BT, v_stats = value_loss(values_BT, inputs.old_values_BT, inputs.returns_BT,
                                        spec.value)
        v_term = aggregate(v_loss_BT, mask_BT, TOKEN_MEAN, den.n_tokens, den.n_seqs,
                           den.max_len)
        loss = loss + spec.value.coef * v_term
        parts["loss/value"] = v_term.detach()
        stats = stats | v_stats
    return MicroResult(loss=loss, logp_BT=logp_d_BT, entropy_BT=entropy_BT.detach(),
                       stats=stats, parts=parts)


def concat_results(results: list[MicroResult]) -> MicroResult:
    """Stitch micro-batch results of one pass back into full-batch tensors (loss summed)."""
    first = results[0]
    return dataclasses.replace(
        first,
        loss=torch.stack([r.loss.detach() for r in results]).sum(),
        logp_BT=torch.cat([r.logp_BT for r in results]),
        entropy_BT=torch.cat([r.entropy_BT for r in results]),
        stats={k: torch.cat([r.stats[k] for r in results]) for k in first.stats},
        parts={k: torch.stack([r.parts[k] for r in results]).sum() for k in first.parts},
    )


@dataclass(frozen=True)
class UpdatePlan:
    """How one batch becomes optimizer steps (fixed for a run; see `update`)."""

    spec: MethodSpec
    inner_epochs: int
    num_minibatches: int
    micro_batch_size: int
    """Rows per forward/backward, at most the minibatch."""
    max_len: int
    """Completion length L of the ``seq_mean_token_sum_norm`` aggregation."""
    grad_clip: float
    """Global gradient-norm clip (0 = off)."""
    dist: SampledDistribution
    """The distribution the sampler drew from (temperature, replayed kept set)."""
    group_size: int = 1
    """Rollouts per prompt; rows of a group are contiguous and share their prompt."""
    packed: PackedLearner | None = None
    """The packed learner of a Hugging Face policy (`rlscope.learner_packed`); None = the
    padded learner."""
    token_budget: int = 0
    """Micro-batches of whole rows within this many packed tokens (0 = ``micro_batch_size``
    rows)."""
    parallel: DataParallel | None = None
    """Data-parallel ranks (`rlscope.distributed`): each takes its rows of every minibatch
    and the gradients are summed over ranks before clipping; None = one process."""


@dataclass(frozen=True)
class UpdateResult:
    """The first and last passes over the batch (micro-batches stitched by `concat_results`)
    and the pre-clip gradient norm of every optimizer step, ``grad_norms_S`` (non-finite where
    the step was skipped)."""

    first: MicroResult
    last: MicroResult
    grad_norms_S: torch.Tensor
    stat_metrics: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    """The batch statistic's metrics at the first optimizer step (`batch_statistic`)."""


def minibatch_rows(n_rows: int, num_minibatches: int, group_size: int) -> int:
    """Rows per minibatch: the batch split into ``num_minibatches``, in whole groups whenever
    the rows are whole groups (selection keeps whole groups), so no group straddles two
    optimizer steps; the last minibatch may be smaller."""
    if group_size > 1 and n_rows % group_size == 0:
        groups = n_rows // group_size
        return group_size * max(-(-groups // num_minibatches), 1)
    return max(n_rows // num_minibatches, 1)


def micro_group_size(micro: int, mb_rows: int, group_size: int) -> int:
    """The group size a micro-batch may promise `micro_batch_loss`: ``group_size`` when both
    slice widths are multiples of it (every micro-batch then holds whole groups), else 1."""
    return group_size if micro % group_size == 0 and mb_rows % group_size == 0 else 1


@torch.no_grad()
def batch_statistic(spec: MethodSpec, policy: Policy, batch: RolloutBatch,
                    inputs: LearnerInputs, rows: slice, dist: SampledDistribution,
                    group_size: int = 1, optimizer_step: int = 0
                    ) -> tuple[LearnerInputs, dict[str, torch.Tensor]]:
    """``inputs`` with the method's batch-statistic selection of the optimizer step over
    ``rows`` (METHODS_2026.md §1), and its metrics.

    One no-grad forward over every row of the minibatch gives the current ℓ and H (at the
    first optimizer step of a rollout step, ℓ_o and the step-start logits); the component's
    selection function (`rlscope.methods.batch_stats`) then chooses tokens over all of them,
    so the micro-batches slice one selection. Random draws are seeded from
    ``inputs.draw_seed`` and the optimizer step.
    """
    component = spec.batch_statistic_component
    assert component is not None and component.batch_statistic is not None
    sub = inputs.select(rows)
    n = sub.batch_size
    group = group_size if n % group_size == 0 else 1
    fwd = forward_completion(policy, batch.select(rows), sub.tokens_BT, dist, group)
    cfg = spec.gate if component is spec.gate_component else spec.objective
    seed = 0 if inputs.draw_seed is None else int(inputs.draw_seed)
    generator = torch.Generator().manual_seed((seed * 1_000_003 + optimizer_step) % 2**32)
    select_BT, metrics = component.batch_statistic(BatchStatInputs(
        adv_BT=sub.adv_BT, logp_BT=fwd.logp_BT, logp_old_BT=sub.logp_old_BT,
        entropy_BT=entropy_from_logp(fwd.logp_BTV), mask_BT=sub.mask_BT,
        generator=generator), cfg)
    full_BT = torch.zeros_like(inputs.adv_BT)
    full_BT[rows] = select_BT.to(full_BT.dtype)
    return dataclasses.replace(inputs, select_BT=full_BT), metrics


def update(plan: UpdatePlan, policy: Policy, value_head: ValueHead | None,
           optimizer: torch.optim.Optimizer, batch: RolloutBatch, inputs: LearnerInputs,
           beta: float | torch.Tensor,
           entropy_coef: float | torch.Tensor | None = None) -> UpdateResult:
    """``inner_epochs`` passes over the batch, each split into ``num_minibatches`` optimizer
    steps, each accumulated over micro-batches (METHODS.md, "Training protocol").
    ``entropy_coef``: the entropy bonus in force (None = the spec's fixed coefficient)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    n_rows = batch.batch_size
    mb_rows = minibatch_rows(n_rows, plan.num_minibatches, plan.group_size)
    micro = min(plan.micro_batch_size, mb_rows)
    shared_group = micro_group_size(micro, mb_rows, plan.group_size)
    # the packed learner plans each micro-batch on the host: one copy of the masks for all
    masks_BL = None if plan.packed is None else host_masks(batch, inputs.mask_BT)
    counts_B = None
    if plan.token_budget > 0:
        counts_B = row_token_counts(batch, inputs.mask_BT)
        unit = plan.group_size if plan.spec.needs_whole_groups else 1
        shared_group = plan.group_size if unit == plan.group_size and \
            mb_rows % plan.group_size == 0 else 1
    first: list[tuple[int, MicroResult]] = []
    grad_norms: list[torch.Tensor] = []
    stat_metrics: dict[str, torch.Tensor] = {}
    dp = plan.parallel
    for epoch in range(plan.inner_epochs):
        last: list[tuple[int, MicroResult]] = []  # (first row, result)
        for start in range(0, n_rows, mb_rows):
            stop = min(start + mb_rows, n_rows)
            # Denominators of the whole minibatch, also when this rank computes a part of it
            den = Denominators.of(inputs, start, stop, plan.max_len)
            lo, hi = (start, stop) if dp is None else dp.rank_rows(start, stop, plan.group_size)
            group = shared_group if lo % plan.group_size == 0 \
                and (hi - lo) % plan.group_size == 0 else 1
            step_inputs = inputs
            if plan.spec.needs_batch_statistic:
                step_inputs, m = batch_statistic(plan.spec, policy, batch, inputs,
                                                 slice(start, stop), plan.dist,
                                                 plan.group_size, len(grad_norms))
                stat_metrics = stat_metrics or m
            optimizer.zero_grad(set_to_none=True)

            def micro_slices(lo: int, hi: int) -> list[slice]:
                return [slice(s, min(s + micro, hi)) for s in range(lo, hi, micro)] \
                    if counts_B is None else \
                    token_budget_slices(counts_B, lo, hi, plan.token_budget, unit)

            slices = micro_slices(lo, hi)
            for rows in slices:
                res = micro_batch_loss(plan.spec, policy, value_head, batch.select(rows),
                                       step_inputs.select(rows), den, beta, plan.dist,
                                       group, entropy_coef, plan.packed,
                                       None if masks_BL is None else masks_BL[rows])
                res.loss.backward()
                last.append((rows.start, res))
            if dp is not None and dp.sharded:
                # FSDP's gathers and reductions are collectives: every rank runs as many
                # forwards and backwards as the busiest, the extra ones weighted zero
                busiest = max(len(micro_slices(*dataclasses.replace(dp, rank=r).rank_rows(
                    start, stop, plan.group_size))) for r in range(dp.world_size))
                for _ in range(busiest - len(slices)):
                    rows = slice(start, start + 1)
                    res = micro_batch_loss(plan.spec, policy, value_head, batch.select(rows),
                                           step_inputs.select(rows), den, beta, plan.dist, 1,
                                           entropy_coef, plan.packed)
                    (res.loss * 0).backward()
            elif dp is not None:  # each rank holds its share of the global gradient: sum them
                dp.sum_grads(params)
            # sharded gradients (FSDP, reduced as sums): the norm is the global one
            norm = full(torch.nn.utils.clip_grad_norm_(
                params, plan.grad_clip if plan.grad_clip > 0 else float("inf")))
            grad_norms.append(norm)
            # A non-finite gradient would turn every weight into NaN for good: skip that step
            # (as loss scalers do) and let optim/nonfinite_steps report it. One host read per
            # optimizer step; the CUDA-graphed learner (tiny model) has no such guard.
            if torch.isfinite(norm):
                optimizer.step()
            else:
                optimizer.zero_grad(set_to_none=True)
        if epoch == 0:
            first = last
    if dp is not None:  # every rank's rows: the whole batch's pass, as in one process
        device = inputs.adv_BT.device
        return UpdateResult(first=concat_results(dp.gather_results(first, device)),
                            last=concat_results(dp.gather_results(last, device)),
                            grad_norms_S=torch.stack(grad_norms), stat_metrics=stat_metrics)
    return UpdateResult(first=concat_results([r for _, r in first]),
                        last=concat_results([r for _, r in last]),
                        grad_norms_S=torch.stack(grad_norms), stat_metrics=stat_metrics)
