"""`Component`: one registry entry — a function and what it reads and needs, as data.

Every registry of update-rule components (`advantages.ADVANTAGES`, `gates.GATES`,
`objectives.OBJECTIVES`, `corrections.CORRECTIONS`, `selection.SELECTIONS`,
`selection.OVERLONG`) maps a name to a `Component` written next to its function. The record
says which fields of its axis's config the function reads (each mapped to its command-line
flag once, by `rlscope.methods.resolve.FLAGS`) and what the loop must provide for it;
`MethodSpec` reads these records, so the loop, the validation and the catalog never test a
component's name. A new component is its function plus its record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class Component(Generic[P, R]):
    """A registered component; calling it calls ``fn``. Flags default to "needs nothing"."""

    fn: Callable[P, R]
    settings: tuple[str, ...] = ()
    """Fields of the axis's config that ``fn`` reads (its knobs), in display order."""
    grouped: bool = False
    """Compares the samples of a group: group_size > 1, the batch divisible by it."""
    ungrouped: bool = False
    """Keeps or drops single samples, which would break groups: needs group_size 1."""
    whole_groups: bool = False
    """Couples the rows of a group in the loss: micro-batches must hold whole groups."""
    needs_value_head: bool = False
    """Reads critic values: the loop trains a value head beside the policy."""
    needs_learner_probs: bool = False
    """Reads the current learner's distribution at the completion (one no-grad forward)."""
    expected_reward_baseline: bool = False
    """Its baseline is E[r | x] under the behaviour policy where the task exposes it, else the
    learner's Σπ² (which then costs the forward of ``needs_learner_probs``)."""
    greedy_baseline: bool = False
    """Reads the reward of one greedy rollout per prompt (the loop decodes it)."""
    candidates: bool = False
    """Reads K next-token candidates per generated position (a `CandidateBatch`)."""
    token_labels: bool = False
    """Reads the task's labels at the actor's own prefixes."""
    reads_distribution: bool = False
    """Reads the learner's whole distribution over the vocabulary (``logp_BTV``), not only
    the chosen tokens' log-probs: the packed learner then keeps the full logits."""
    teacher_forced: bool = False
    """The learner is teacher-forced on the task's ground truth instead of the rollout."""
    own_aggregation: str | None = None
    """The token aggregation the component is defined with (any other is rejected)."""
    own_credit: bool = False
    """Computes its own credit from rewards or labels; the advantage is only logged."""
    behaviour_sum_p2: bool = False
    """Reads Σ_v μ(v | prefix)², which the sampler then records."""
    shapes_reward: bool = False
    """Changes the rewards before advantages are computed."""
    masks_rows: bool = False
    """Drops rows from the loss after selection."""
    drops_groups: bool = False
    """A selection that drops whole groups, so the loop can sample more to refill the batch
    (``--fill_batch``)."""
    needs_teacher: bool = False
    """Reads a frozen teacher's log-probs of the student's samples (`methods.teacher`)."""
    needs_teacher_distribution: bool = False
    """Reads the teacher's whole distribution over the vocabulary (top-k teachers rejected)."""
    builtin_teacher: bool = False
    """Its teacher is a built-in analytic one over the task's targets (``--teacher``,
    `rlscope.methods.teacher.TargetTeacher`), not a frozen model (COMPANIONS.md §1)."""
    reads_step: bool = False
    """Reads the optimizer step of the update (``PolicyTerms.step``: a warm-up switch)."""
    sampler_mismatch: bool = False
    """Acts only where the sampler's log-probs differ from the learner's (a no-op, warned
    about, when the learner samples on-policy)."""
    identity: bool = False
    """Changes nothing (the axis's ``none``): the loop may skip the work it would cost."""
    batch_statistic: Callable[..., Any] | None = None
    """Selects tokens over the whole optimizer minibatch before its update
    (`rlscope.methods.batch_stats`): `rlscope.learner.update` calls it once per optimizer
    step and passes its selection to ``fn`` as ``select_BT``."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)


def _unknown(*args: object, **kwargs: object) -> None:
    raise ValueError("unknown component (rlscope.methods.validate_method names the valid ones)")


UNKNOWN: Component[..., None] = Component(_unknown)
"""What `record` returns for a name no registry holds: it needs nothing, so the properties of
a misconfigured `MethodSpec` stay readable until `validate_method` reports the name."""


def record(registry: Mapping[str, Component[Any, Any]], name: str) -> Component[Any, Any]:
    """``registry[name]``, or `UNKNOWN` for a name it does not hold."""
    return registry.get(name, UNKNOWN)
