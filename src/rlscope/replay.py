"""Prioritised replay of whole rollout batches (METHODS.md, "Training protocol", Replay).

Protocol, per step of the loop: `ReplayBuffer.push` the fresh batch at age 0 (every stored batch
ages by one, the oldest beyond ``capacity`` is dropped), then `ReplayBuffer.sample` with the run's
``delay``: ``None`` while no stored batch has age ≥ delay (the loop then trains on the fresh
batch), otherwise one batch among those with age ≥ delay, drawn with probability ∝ its priority
(uniform when every priority is 0). The sampled batch comes back with ``age_B`` set to its age,
so the off-policy corrections and the ``freshness`` gate see its staleness.

Ages are counted in pushes (= optimizer steps): after ``n`` pushes the stored ages are exactly
``0, 1, ..., min(n, capacity) - 1``. Hence ``capacity > delay`` is needed for staleness to be
exposed, and ``capacity = delay + 1`` leaves a single candidate, the batch sampled ``delay`` steps
ago (no random draw is spent on it, so the generator stream matches the staleness queue's).

Priorities (scalar, ≥ 0, computed once at push time from detached tensors and stored as Python
floats, so a checkpoint restores them exactly; ``fresh_delight`` adds its age factor at sample
time), as in the reference sandbox. With ``r = rewards_B``, the advantage ``A`` and the
behaviour surprisal ``s_t = -ℓ_μ,t = -logp_sampler_BT`` (means over the valid tokens of
``completion_mask_BT`` where a quantity is per token):

- ``uniform``: 1.
- ``reward``: ``mean_B |r|``.
- ``advantage``: ``mean |A|``.
- ``surprisal``: ``mean_t s_t``.
- ``delight``: ``mean_t max(A · s_t, 0)`` (surprising successes: Delightful Policy Gradient).
- ``fresh_delight`` (default): ``exp(-replay_age_decay · age) · delight``.

``A`` is the ``advantages`` passed to `push` (``adv_B`` or ``adv_BT``) when given; the loop
pushes before the method computes advantages, so otherwise ``A = r - b`` with ``b`` the
reference sandbox's behaviour baseline: the exact E[r | x] under the behaviour policy where the
batch carries it (``expected_reward_B``), else the behaviour policy's per-token Σ_v μ(v)²
(``sum_p2_sampler_BT``, which the loop records whenever a priority reads ``A``), so ``A_t = r -
Σμ²_t`` as in DG's ``expected`` baseline; only a batch with neither falls back to the mean
reward of the row's group (``group_id_B``) when groups have more than one row, else the batch
mean reward.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from rlscope.batch import RolloutBatch

PRIORITIES = ("uniform", "reward", "advantage", "surprisal", "delight", "fresh_delight")
ADVANTAGE_PRIORITIES = ("advantage", "delight", "fresh_delight")
"""The priorities that read the push-time advantage (and so the behaviour's Σμ²)."""


@dataclass(frozen=True)
class ReplayConfig:
    """Replay buffer of whole rollout batches (the staleness ``delay`` lives in ``RunConfig``)."""

    replay_capacity: int = 0
    """Stored batches, the fresh one included (0 = replay off). With delay > 0 it must exceed
    the delay."""
    replay_priority: str = "fresh_delight"
    """How the batch trained on is drawn among those with age >= delay, probability ∝ priority:
    uniform; reward (mean |r|); advantage (mean |A|); surprisal (mean -log μ); delight
    (mean max(A·(-log μ), 0)); fresh_delight (exp(-replay_age_decay·age) × delight). Uniform
    when every priority is 0 (docs/training.md, "Replay")."""
    replay_age_decay: float = 0.02
    """λ_age (``replay_age_decay``): fresh_delight weighs a batch by exp(-λ_age · age), and the
    freshness gate its update by the same factor."""


def validate_replay(cfg: ReplayConfig, delay: int) -> list[str]:
    """Every problem with ``cfg`` (and its combination with the run's ``delay``), as messages
    that name the field and what to change; empty when the configuration can run."""
    errors: list[str] = []
    if cfg.replay_capacity < 0:
        errors.append(f"replay_capacity={cfg.replay_capacity} must be >= 0 (0 turns replay off)")
    if cfg.replay_priority not in PRIORITIES:
        errors.append(f"replay_priority={cfg.replay_priority!r} is unknown; use one of "
                      f"{', '.join(PRIORITIES)}")
    if not cfg.replay_age_decay >= 0 or math.isinf(cfg.replay_age_decay):
        errors.append(f"replay_age_decay={cfg.replay_age_decay} must be a finite number >= 0")
    if cfg.replay_capacity > 0 and delay > 0 and cfg.replay_capacity <= delay:
        errors.append(f"replay_capacity={cfg.replay_capacity} with run.delay={delay}: replay with "
                      f"delay > 0 needs capacity > delay (otherwise staleness is never exposed, "
                      f"since stored ages only reach capacity - 1); set replay_capacity >= "
                      f"{delay + 1} or lower run.delay")
    return errors


def _masked_mean(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    """Mean of ``x_BT`` over every valid token of the batch (0 when there is none)."""
    valid_BT = mask_BT.bool()
    return float(torch.where(valid_BT, x_BT.double(), 0.0).sum() / valid_BT.sum().clamp_min(1))


def batch_priority(priority: str, batch: RolloutBatch,
                   advantages: torch.Tensor | None = None) -> float:
    """The push-time priority of ``batch`` (see the module docstring); for ``fresh_delight`` the
    age-free ``delight`` part.

    ``advantages``: ``adv_B`` ``[B]`` or ``adv_BT`` ``[B, T]`` (masked by
    ``completion_mask_BT``), read only by ``advantage``.
    """
    if priority not in PRIORITIES:
        raise ValueError(f"unknown replay priority {priority!r}; use one of "
                         f"{', '.join(PRIORITIES)}")
    if priority == "uniform":
        return 1.0
    mask_BT = batch.completion_mask_BT.detach()
    surprisal_BT = -batch.logp_sampler_BT.detach().double()
    if priority == "surprisal":
        return max(0.0, _finite(_masked_mean(surprisal_BT, mask_BT), priority))
    if batch.rewards_B is None:
        raise ValueError(f"replay priority {priority!r} needs rewards: push scored batches")
    r_B = batch.rewards_B.detach().double()
    if priority == "reward":
        return _finite(float(r_B.abs().mean()), priority)
    adv = _push_advantages(batch, r_B) if advantages is None else advantages.detach().double()
    if adv.dim() == 2 and adv.shape != mask_BT.shape:
        raise ValueError(f"advantages of shape {tuple(adv.shape)} do not match "
                         f"completion_mask_BT {tuple(mask_BT.shape)}: pass adv_B or adv_BT")
    adv_BT = adv if adv.dim() == 2 else adv[:, None].expand(mask_BT.shape)
    if priority == "advantage":
        value = _masked_mean(adv_BT.abs(), mask_BT) if adv.dim() == 2 else float(adv.abs().mean())
    else:
        # surprisal is +inf off the mask (log μ = -inf there): mask before the product
        delight_BT = torch.where(mask_BT.bool(), adv_BT * surprisal_BT, 0.0).clamp_min(0.0)
        value = _masked_mean(delight_BT, mask_BT)
    return max(0.0, _finite(value, priority))


def _push_advantages(batch: RolloutBatch, r_B: torch.Tensor) -> torch.Tensor:
    """``A = r - b`` at push time (module docstring): ``A_B`` with ``b`` = ``expected_reward_B``
    where present; else ``A_BT`` with the behaviour's per-token ``b_t = Σμ²_t``
    (``sum_p2_sampler_BT``); else ``A_B`` with the group mean reward when groups have several
    rows, else the batch mean."""
    if batch.expected_reward_B is not None:
        return r_B - batch.expected_reward_B.detach().double()
    if batch.sum_p2_sampler_BT is not None:
        return r_B[:, None] - batch.sum_p2_sampler_BT.detach().double()
    groups_B = batch.group_id_B.detach()
    _, inverse_B, counts_G = torch.unique(groups_B, return_inverse=True, return_counts=True)
    if int(counts_G.max()) > 1:
        sums_G = torch.zeros(len(counts_G), dtype=r_B.dtype).index_add_(0, inverse_B.cpu(),
                                                                         r_B.cpu())
        return r_B - (sums_G / counts_G.to(r_B.dtype))[inverse_B.cpu()].to(r_B.device)
    return r_B - r_B.mean()


def _finite(value: float, priority: str) -> float:
    if not math.isfinite(value):
        raise ValueError(f"replay priority {priority!r} of a pushed batch is {value}: its "
                         f"rewards or behaviour log-probs are not finite")
    return value


def _age_bins(capacity: int) -> list[tuple[int, int]]:
    """Log2 bins covering ages ``0 .. capacity - 1``: [0], [1], [2, 3], [4, 7], ...; age ``a``
    falls in bin ``a.bit_length()``."""
    return [(0 if k == 0 else 2 ** (k - 1), min(2**k - 1, capacity - 1))
            for k in range((capacity - 1).bit_length() + 1)]


@dataclass(frozen=True)
class _Entry:
    batch: RolloutBatch
    age: int
    priority: float


class ReplayBuffer:
    """Up to ``cfg.replay_capacity`` rollout batches with their ages and push-time priorities.

    Stored batches stay where they were pushed (device included): memory grows with
    ``capacity × batch``. Entries are kept youngest first, so ``ages`` reads ``0, 1, 2, ...``.
    """

    def __init__(self, cfg: ReplayConfig) -> None:
        errors = validate_replay(cfg, 0)
        if cfg.replay_capacity < 1:
            errors.append("a ReplayBuffer needs replay_capacity >= 1 (0 means replay off: do "
                          "not build one)")
        if errors:
            raise ValueError("invalid replay configuration:\n  - " + "\n  - ".join(errors))
        self.cfg = cfg
        self._entries: list[_Entry] = []
        self._bins = _age_bins(cfg.replay_capacity)
        self._hist = [0] * len(self._bins)
        self._n_trained = 0
        self._age_sum = 0
        self._last_age = 0
        self._last_priority = 0.0
        self._last_eligible = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def ages(self) -> list[int]:
        """Ages of the stored batches, youngest first."""
        return [e.age for e in self._entries]

    @property
    def priorities(self) -> list[float]:
        """Push-time priorities, youngest first (for ``fresh_delight``, without the age
        factor)."""
        return [e.priority for e in self._entries]

    def push(self, batch: RolloutBatch, advantages: torch.Tensor | None = None) -> None:
        """Store ``batch`` at age 0, age every stored batch by one, drop the oldest beyond
        capacity. ``advantages`` (``adv_B`` or ``adv_BT``) feeds the ``advantage`` priority."""
        priority = batch_priority(self.cfg.replay_priority, batch, advantages)
        aged = [dataclasses.replace(e, age=e.age + 1) for e in self._entries]
        self._entries = [_Entry(batch, 0, priority), *aged][: self.cfg.replay_capacity]

    def candidates(self, delay: int) -> list[tuple[int, float]]:
        """``(age, weight)`` of every batch eligible at ``delay`` (age ≥ delay), youngest first;
        the draw is ∝ weight, uniform when all weights are 0."""
        return [(self._entries[i].age, w) for i, w in self._eligible(delay)]

    def _eligible(self, delay: int) -> list[tuple[int, float]]:
        if delay < 0:
            raise ValueError(f"run.delay={delay} must be >= 0")
        decay = self.cfg.replay_age_decay if self.cfg.replay_priority == "fresh_delight" else 0.0
        return [(i, math.exp(-decay * e.age) * e.priority if decay else e.priority)
                for i, e in enumerate(self._entries) if e.age >= delay]

    def sample(self, delay: int, generator: torch.Generator
               ) -> tuple[RolloutBatch, int] | None:
        """One stored batch with age ≥ ``delay`` and its age, or None while there is none (the
        loop then trains on the fresh batch, which the statistics count as age 0 with the
        youngest stored batch's priority).

        Draws by inverse CDF from one float64 ``torch.rand`` on ``generator``, spent only when
        there are at least two candidates; the batch comes back with ``age_B`` set to its age.
        """
        eligible = self._eligible(delay)
        self._last_eligible = len(eligible)
        if not eligible:
            fresh = self._entries[0].priority if self._entries else 0.0
            self._record(0, fresh)
            return None
        pick = 0
        if len(eligible) > 1:
            weights = [w for _, w in eligible]
            if sum(weights) <= 0.0:
                weights = [1.0] * len(weights)
            u = torch.rand((), generator=generator, dtype=torch.float64,
                           device=generator.device).item()
            target, cum = u * math.fsum(weights), 0.0
            # rounding can leave target ≥ the running sum: fall back to the last positive weight
            pick = max(i for i, w in enumerate(weights) if w > 0)
            for i, w in enumerate(weights):
                cum += w
                if target < cum:
                    pick = i
                    break
        entry = self._entries[eligible[pick][0]]
        self._record(entry.age, eligible[pick][1])
        return _with_age(entry.batch, entry.age), entry.age

    def _record(self, age: int, priority: float) -> None:
        self._last_age, self._last_priority = age, priority
        self._n_trained += 1
        self._age_sum += age
        self._hist[age.bit_length()] += 1

    def stats(self) -> dict[str, float]:
        """``replay/`` metrics as Python floats (a fixed key set for a given capacity).

        Over the stored batches: ``size``, ``age_mean``, ``age_max``, ``priority_mean``. Of the
        last `sample` call: ``eligible`` (candidates), ``age`` (age of the batch the loop trains
        on; 0 when it falls back to the fresh batch) and ``priority`` (that batch's draw weight,
        the age factor of ``fresh_delight`` included). Over all `sample` calls so
        far: ``trained_age_mean`` and ``age_hist_<lo>_<hi>`` (``age_hist_<a>`` for one-age
        bins), cumulative counts of trained-batch ages in log2 bins [0], [1], [2, 3], [4, 7],
        ... up to capacity - 1 (a histogram of stored ages would be trivial: one per age).
        """
        ages = self.ages
        out = {
            "replay/size": float(len(ages)),
            "replay/age_mean": sum(ages) / len(ages) if ages else 0.0,
            "replay/age_max": float(max(ages, default=0)),
            "replay/priority_mean": (math.fsum(self.priorities) / len(ages)) if ages else 0.0,
            "replay/eligible": float(self._last_eligible),
            "replay/age": float(self._last_age),
            "replay/priority": float(self._last_priority),
            "replay/trained_age_mean": self._age_sum / max(self._n_trained, 1),
        }
        for (lo, hi), count in zip(self._bins, self._hist, strict=True):
            out[f"replay/age_hist_{lo}" if lo == hi else f"replay/age_hist_{lo}_{hi}"] = \
                float(count)
        return out

    def state_dict(self) -> dict[str, Any]:
        """Everything a checkpoint needs for a bit-exact resume (batches as dicts of their
        fields, like the staleness queue in `rlscope.checkpoint`); tensors are not copied."""
        return {
            "config": dataclasses.asdict(self.cfg),
            "batches": [{f.name: getattr(e.batch, f.name) for f in dataclasses.fields(e.batch)}
                        for e in self._entries],
            "ages": self.ages, "priorities": self.priorities,
            "age_hist": list(self._hist), "n_trained": self._n_trained,
            "age_sum": self._age_sum, "last_age": self._last_age,
            "last_priority": self._last_priority, "last_eligible": self._last_eligible,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict`; the buffer must have been built with the same config."""
        saved = ReplayConfig(**state["config"])
        if saved != self.cfg:
            raise ValueError(f"replay checkpoint was written with {saved}, this run has "
                             f"{self.cfg}: resume with the same replay settings")
        self._entries = [_Entry(RolloutBatch(**fields), int(age), float(priority))
                         for fields, age, priority in zip(state["batches"], state["ages"],
                                                          state["priorities"], strict=True)]
        self._hist = [int(c) for c in state["age_hist"]]
        self._n_trained = int(state["n_trained"])
        self._age_sum = int(state["age_sum"])
        self._last_age = int(state["last_age"])
        self._last_priority = float(state.get("last_priority", 0.0))  # absent in older checkpoints
        self._last_eligible = int(state["last_eligible"])


def _with_age(batch: RolloutBatch, age: int) -> RolloutBatch:
    """``batch`` with ``age_B`` = ``age`` on every row (dtype and device of the existing
    ``age_B``, else float32 beside the completions)."""
    if batch.age_B is not None:
        return dataclasses.replace(batch, age_B=torch.full_like(batch.age_B, age))
    age_B = torch.full((batch.batch_size,), float(age),
                       device=batch.completion_tokens_BT.device)
    return dataclasses.replace(batch, age_B=age_B)


Collect = Callable[[int], RolloutBatch]
"""The loop's collect stage: a fresh scored batch for the step."""


class BatchSource(Protocol):
    """Where the batch a step trains on comes from (METHODS.md, "Training protocol"), chosen
    once per run by `batch_source`. ``next(step)`` collects what it needs (through the loop's
    collect stage) and returns the batch to train on (every step trains: the staleness queue's
    warm-up and replay before any batch is old enough use the fresh batch). Its state is part
    of the checkpoint, under the keys ``queue`` and ``replay``."""

    def next(self, step: int) -> RolloutBatch: ...

    def stats(self) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _fields(batch: RolloutBatch) -> dict[str, Any]:
    return {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}


class DelayQueue:
    """Staleness (``delay = k``): a queue of the last k + 1 fresh batches; from step k on the
    step trains on the batch sampled k steps ago (``age_B`` = k). During the k warm-up steps,
    while the queue fills, it trains on the fresh batch (age 0), as the reference sandbox does;
    k = 0 is always the fresh batch."""

    def __init__(self, delay: int, collect: Collect) -> None:
        self.delay, self.collect = delay, collect
        self.queue: deque[RolloutBatch] = deque()

    def next(self, step: int) -> RolloutBatch:
        fresh = self.collect(step)
        self.queue.append(fresh)
        if len(self.queue) <= self.delay:
            return fresh
        oldest = self.queue.popleft()
        return _with_age(oldest, self.delay) if self.delay else oldest

    def stats(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"queue": [_fields(b) for b in self.queue], "replay": None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.queue = deque(RolloutBatch(**b) for b in state["queue"])


class OverfitBatch(DelayQueue):
    """``--overfit_batch``: the first collected batch is trained on at every step; nothing more
    is collected (it is checkpointed as the head of the queue)."""

    def __init__(self, collect: Collect) -> None:
        super().__init__(0, collect)

    def next(self, step: int) -> RolloutBatch:
        if not self.queue:
            self.queue.append(self.collect(step))
        return self.queue[0]


class ReplaySource:
    """Replay (``replay_capacity > 0``): push the fresh batch, then train on one drawn from the
    `ReplayBuffer` with age ≥ delay, or on the fresh batch while there is none."""

    def __init__(self, cfg: ReplayConfig, delay: int, collect: Collect,
                 generator: torch.Generator) -> None:
        self.buffer, self.delay = ReplayBuffer(cfg), delay
        self.collect, self.generator = collect, generator

    def next(self, step: int) -> RolloutBatch:
        fresh = self.collect(step)
        self.buffer.push(fresh)
        drawn = self.buffer.sample(self.delay, self.generator)
        return fresh if drawn is None else drawn[0]

    def stats(self) -> dict[str, float]:
        return self.buffer.stats()

    def state_dict(self) -> dict[str, Any]:
        return {"queue": [], "replay": self.buffer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state["replay"])


def batch_source(cfg: ReplayConfig, delay: int, overfit: bool, collect: Collect,
                 generator: torch.Generator) -> BatchSource:
    """The run's batch source: replay where ``replay_capacity > 0``, the fixed batch of
    ``--overfit_batch``, else the staleness queue (the config rejects combining them)."""
    if cfg.replay_capacity > 0:
        return ReplaySource(cfg, delay, collect, generator)
    return OverfitBatch(collect) if overfit else DelayQueue(delay, collect)


__all__ = ["PRIORITIES", "BatchSource", "DelayQueue", "OverfitBatch", "ReplayBuffer",
           "ReplayConfig", "ReplaySource", "batch_priority", "batch_source", "validate_replay"]
