"""`MethodSpec`: a method preset as data — one component per axis, plus what it needs.

A preset picks an advantage estimator, a gate, an objective, a token aggregation, KL and entropy
regularisers, an optional critic and a selection rule. The loop reads the derived ``needs_*``
properties, which read the components' records (`rlscope.methods.component.Component`), and
never compares method or component names. The component configs live in
`rlscope.methods.configs` and are re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlscope.methods.advantages import ADVANTAGES
from rlscope.methods.component import Component, record
from rlscope.methods.configs import (
    AdvantageConfig,
    EntropyConfig,
    GateConfig,
    KLConfig,
    ObjectiveConfig,
    OverlongConfig,
    ValueConfig,
)
from rlscope.methods.corrections import CORRECTIONS, CorrectionConfig
from rlscope.methods.gates import GATES
from rlscope.methods.objectives import OBJECTIVES
from rlscope.methods.pedagogy import TwoViewRule
from rlscope.methods.selection import OVERLONG, SELECTIONS

__all__ = ["AdvantageConfig", "CorrectionConfig", "EntropyConfig", "GateConfig", "KLConfig",
           "MethodSpec", "ObjectiveConfig", "OverlongConfig", "ValueConfig"]


@dataclass(frozen=True)
class MethodSpec:
    """One method preset. Fields are components; properties say what the loop must provide."""

    description: str
    source: str
    regime: str
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    agg: str = "token_mean"
    kl: KLConfig = field(default_factory=KLConfig)
    entropy_coef: float = 0.0
    """Entropy bonus c: the loss gains −c·agg(H_t) (the initial c under adaptive control)."""
    entropy: EntropyConfig = field(default_factory=EntropyConfig)
    """How c moves during the run (fixed unless adaptive)."""
    value: ValueConfig = field(default_factory=ValueConfig)
    selection: str = "none"
    """``none``, ``mixed_groups`` (keep groups whose rewards differ) or ``kondo`` (keep samples
    by their delight before any learner forward)."""
    keep_ratio: float = 0.5
    """``kondo`` selection: the mean keep probability the threshold λ is solved for."""
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    """Masking or reward shaping of completions truncated at the length limit."""
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)
    """Sampler-vs-learner importance correction multiplied into the per-token loss."""
    grouped: bool = False
    """Needs grouped sampling (group_size > 1, batch divisible by the group size)."""
    requires: tuple[str, ...] = ()
    """What the run must provide (checked by `rlscope.config.validate`): ``replay`` (a replay
    buffer), ``staleness`` (delay or replay), ``token_rewards`` (a task with clean, non-binary
    rewards that decompose over tokens), ``binary_rewards``, ``clean_rewards`` (no reward
    noise), ``bandit`` (a one-action task), ``on_policy`` (no delay, no replay),
    ``single_epoch`` (one inner epoch of one minibatch), ``token_labels`` (a sequence task with
    per-token labels), ``no_kl`` (the method is defined without a KL term), ``one_epoch``
    (one inner epoch), ``no_selection`` (selection ``none``), ``critic_pretrain`` (a value
    head and critic_pretrain_steps >= 1)."""
    pos_nll_coef: float = 0.0
    """μ of VAPO's positive-example LM loss (``pos_nll``): + μ · Σ_{i∈S,t} m(−ℓ_t) /
    Σ_{i∈S,t} m over the optimizer batch's successful rows S (r_i ≥ 1, the sandbox tasks'
    r_max; 0 = off)."""
    step: str = "rollout"
    """The step kind that trains it: ``rollout`` (sample completions, score, one update of the
    policy; the loop of `rlscope.train`) or a kind of `rlscope.steps.STEPS` (``set``,
    ``two_view``, ``tree``: their own models, batch and update). A method trains only on the
    tasks of its step kind."""
    two_view: TwoViewRule = field(default_factory=TwoViewRule)
    """The ``two_view`` step's teacher reward and student update (`rlscope.methods.pedagogy`;
    COMPANIONS.md §3); read by no other step kind."""
    fp32_head: bool = False
    """Run the LM head matmul and log-softmax in float32 under mixed precision (learner and,
    where it shares the policy's forward, the sampler); a no-op for a float32 model."""

    @property
    def advantage_component(self) -> Component[Any, Any]:
        return record(ADVANTAGES, self.advantage.name)

    @property
    def gate_component(self) -> Component[Any, Any]:
        return record(GATES, self.gate.name)

    @property
    def objective_component(self) -> Component[Any, Any]:
        return record(OBJECTIVES, self.objective.name)

    @property
    def selection_component(self) -> Component[Any, Any]:
        return record(SELECTIONS, self.selection)

    @property
    def overlong_component(self) -> Component[Any, Any]:
        return record(OVERLONG, self.overlong.name)

    @property
    def correction_component(self) -> Component[Any, Any]:
        return record(CORRECTIONS, self.correction.name)

    @property
    def needs_groups(self) -> bool:
        """The preset or one of its components compares the samples of a group."""
        return self.grouped or any(c.grouped for c in (
            self.advantage_component, self.objective_component, self.selection_component))

    @property
    def needs_value(self) -> bool:
        return self.advantage_component.needs_value_head

    @property
    def needs_reference(self) -> bool:
        return self.kl.coef > 0 and self.kl.target == "ref"

    @property
    def needs_candidates(self) -> bool:
        """The loop samples K = group_size next-token candidates per generated position."""
        return self.objective_component.candidates

    @property
    def needs_token_labels(self) -> bool:
        """The objective reads the task's labels next to the actor's own tokens."""
        return self.objective_component.token_labels

    @property
    def needs_whole_groups(self) -> bool:
        """The objective couples the rows of a group (micro-batches hold whole groups)."""
        return self.objective_component.whole_groups

    @property
    def needs_greedy_baseline(self) -> bool:
        """The loop decodes each prompt greedily once and attaches its reward (ReMax)."""
        return self.advantage_component.greedy_baseline

    @property
    def needs_behaviour_sum_p2(self) -> bool:
        """The sampler records Σ_v μ(v | prefix)² (kondo's baseline when E[r | x] is not
        exposed)."""
        return self.selection_component.behaviour_sum_p2

    @property
    def uses_expected_reward(self) -> bool:
        """The advantage's baseline is E[r | x] where the task exposes it."""
        return self.advantage_component.expected_reward_baseline

    def needs_learner_probs(self, expected_reward_known: bool) -> bool:
        """The advantage reads the current learner's distribution (always, or as the fallback
        baseline when E[r | x] is not known)."""
        adv = self.advantage_component
        return adv.needs_learner_probs or (adv.expected_reward_baseline
                                           and not expected_reward_known)

    @property
    def corrected(self) -> bool:
        """A sampler-vs-learner correction is in force (it costs one learner forward)."""
        return not self.correction_component.identity

    @property
    def uses_entropy_bonus(self) -> bool:
        """The loss has an entropy term (its coefficient may start at 0 and move)."""
        return self.entropy_coef > 0 or self.entropy.control == "adaptive"

    @property
    def reads_learner_distribution(self) -> bool:
        """The loss reads the learner's whole distribution over the vocabulary (an objective
        that does, or the ``full`` KL in the loss), not only the chosen tokens' log-probs and
        entropies: the packed learner then keeps full logits (`rlscope.learner_packed`)."""
        return self.objective_component.reads_distribution or (
            self.kl.exact and self.kl.coef > 0 and self.kl.place == "loss")

    @property
    def batch_statistic_component(self) -> Component[Any, Any] | None:
        """The gate or objective whose token selection is a batch statistic (computed over the
        whole optimizer minibatch before its update, `rlscope.methods.batch_stats`), or
        None."""
        return next((c for c in (self.gate_component, self.objective_component)
                     if c.batch_statistic is not None), None)

    @property
    def needs_batch_statistic(self) -> bool:
        """The update runs one no-grad forward per optimizer step for a batch statistic."""
        return self.batch_statistic_component is not None

    @property
    def needs_teacher(self) -> bool:
        """A component reads a frozen teacher's scores of the student's samples
        (`rlscope.methods.teacher`; ``--teacher_path``)."""
        return any(c.needs_teacher or c.needs_teacher_distribution for c in (
            self.advantage_component, self.objective_component))

    @property
    def needs_teacher_distribution(self) -> bool:
        """The objective reads the teacher's whole distribution (top-k teachers rejected)."""
        return self.objective_component.needs_teacher_distribution

    @property
    def builtin_teacher(self) -> bool:
        """The teacher is a built-in analytic one over the task's targets (``--teacher``), not
        ``--teacher_path`` (the OPD presets of COMPANIONS.md §1)."""
        return any(c.builtin_teacher for c in (self.advantage_component,
                                               self.objective_component))

    @property
    def reads_step(self) -> bool:
        """The objective reads the update's step (a warm-up switch, ``--opd_warmup_steps``)."""
        return self.objective_component.reads_step

    @property
    def needs_labels(self) -> bool:
        """The learner is teacher-forced on the task's ground truth instead of the rollout."""
        return self.objective_component.teacher_forced
