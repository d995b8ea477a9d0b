"""Environment workers (``--env_workers N``): a task's rewards scored in a pool of Ray actors.

A slow or unsafe reward (the code task runs every completion in a sandbox) should neither hold
the training process nor be able to take it down. With ``--env_workers N`` the loop's
``task.score(batch)`` goes to `RemoteScoredTask`, which splits the batch into chunks of rows
(``--env_chunk_size``, default one chunk per worker) and scores them in parallel on N actors
(`ScoringPool`), each holding its own copy of the task, built from the run's task name and
options (so any task's scoring function works; a task that reads the trained policy,
`WatchesPolicy`, is refused). Each actor asks Ray for one CPU. The chunks' `Scores` are
concatenated in row order, so without failures the rewards equal the in-process ones.

Failures never stop the run. A call that raises, whose actor dies (a crash, an OOM kill) or
that runs past ``--env_timeout_s`` (the actor is then killed) counts one error in the step's
``env/errors`` and its chunk is retried on a fresh or idle actor, at most ``--env_retries``
times; after that every row of the chunk gets the task's failure reward (its
``failure_reward`` attribute, else 0.0). ``--env_chunk_size 1`` makes that per sample. A worker
that fails to start (its task raises while being built, or it gets no CPU within `STARTUP_S`)
counts an error and is started again, at most ``--env_retries`` times; then the pool goes on
without it. Only a pool left with no worker stops the run, with the reason.

Not done: scoring does not overlap sampling (the sampler makes the whole batch before any row
is scored, and making it emit chunks means changing the sampler); evaluation
(``task.eval_metrics``) stays in the training process.

The actors live on the Ray cluster this process is connected to (a run inside a Ray sweep
task: the sweep's), else the one at ``RAY_ADDRESS``, else a local cluster started at the first
scored batch and shut down when the run ends (`rlscope.ray_cluster.ray_cluster`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch

from rlscope.batch import RolloutBatch
from rlscope.tasks.base import Interactive, Scores, Task, TaskConfig, WatchesPolicy

STARTUP_S = 180.0
"""How long a new actor may take to start (import torch, build its task) before the pool
gives up on it (a cluster without a free CPU for it never starts it)."""
ENV_ERRORS = "env/errors"


@dataclass(frozen=True)
class PoolOptions:
    """How the pool scores (the ``--env_*`` run options)."""

    workers: int
    """Actors in the pool."""
    timeout_s: float = 120.0
    """Seconds one chunk's call may take before its actor is killed and the chunk retried."""
    retries: int = 2
    """Retries of a chunk whose call failed; then its rows get the failure reward."""
    chunk_size: int = 0
    """Rows per call; 0 = the batch split evenly, one chunk per worker."""


def env_worker_errors(options: PoolOptions, task_name: str, task: Task) -> list[str]:
    """Why the ``--env_*`` options cannot run with ``task`` (empty when they can, or are off)."""
    if not options.workers:
        return []
    from rlscope.ray_cluster import ray_missing

    errors = [m for m in [ray_missing("run.env_workers")] if m]
    if isinstance(task, WatchesPolicy):
        errors.append(f"run.env_workers: task {task_name!r} scores with the trained policy, "
                      "which the workers do not have: drop --env_workers")
    if not options.timeout_s > 0:
        errors.append(f"run.env_timeout_s={options.timeout_s} must be > 0 (--env_timeout_s)")
    return errors


def chunk_slices(rows: int, workers: int, chunk_size: int) -> list[slice]:
    """Contiguous row ranges covering ``rows``: ``chunk_size`` each, or (0) ``workers`` near
    equal ones."""
    size = chunk_size or max(1, math.ceil(rows / workers))
    return [slice(a, min(a + size, rows)) for a in range(0, rows, size)]


def failure_scores(rows: int, width: int, reward: float, token_rewards: bool,
                   unshaped: bool) -> Scores:
    """``rows`` rows of the failure reward (dense rewards and unshaped rewards where the other
    chunks carry them: 0 per token, the failure reward)."""
    rewards_B = torch.full((rows,), reward, dtype=torch.float32)
    return Scores(rewards_B=rewards_B,
                  token_rewards_BT=torch.zeros(rows, width) if token_rewards else None,
                  unshaped_rewards_B=rewards_B.clone() if unshaped else None)


def concat_scores(parts: list[Scores | None], slices: list[slice], width: int, reward: float,
                  device: torch.device) -> Scores:
    """The chunks' scores in row order on ``device``; a failed chunk (None) gets
    `failure_scores`."""
    done = [p for p in parts if p is not None]
    dense = any(p.token_rewards_BT is not None for p in done)
    unshaped = any(p.unshaped_rewards_B is not None for p in done)
    valid = any(p.valid_mask_BT is not None for p in done)
    dtype = done[0].rewards_B.dtype if done else torch.float32
    filled = [p if p is not None else failure_scores(s.stop - s.start, width, reward, dense,
                                                     unshaped)
              for p, s in zip(parts, slices, strict=True)]

    def cat(tensors: list[torch.Tensor | None]) -> torch.Tensor:
        return torch.cat([cast(torch.Tensor, t).to(device) for t in tensors])

    return Scores(
        rewards_B=cat([p.rewards_B.to(dtype) for p in filled]),
        token_rewards_BT=cat([p.token_rewards_BT for p in filled]) if dense else None,
        unshaped_rewards_B=cat([p.unshaped_rewards_B if p.unshaped_rewards_B is not None
                                else p.rewards_B for p in filled]) if unshaped else None,
        # a failed chunk keeps every generated position (its reward is the failure reward)
        valid_mask_BT=cat([p.valid_mask_BT if p.valid_mask_BT is not None
                           else torch.ones(p.rewards_B.shape[0], width) for p in filled])
        if valid else None)


class Scorer:
    """The actor: one copy of the task, scoring the chunks it is sent."""

    def __init__(self, make: Callable[[], Task]) -> None:
        self.task = make()

    def ready(self) -> bool:
        """Answers once the task is built."""
        return True

    def score(self, batch: RolloutBatch) -> Scores:
        """The task's scores of ``batch`` (on CPU)."""
        s = self.task.score(batch)
        return Scores(s.rewards_B.cpu(),
                      None if s.token_rewards_BT is None else s.token_rewards_BT.cpu(),
                      None if s.unshaped_rewards_B is None else s.unshaped_rewards_B.cpu(),
                      None if s.valid_mask_BT is None else s.valid_mask_BT.cpu())


@dataclass
class _Slot:
    """One actor of the pool and what it is doing."""

    actor: Any
    ref: Any = None
    """Its pending call: ``ready`` while starting, ``score`` while busy, None when idle."""
    chunk: int = -1
    """The chunk it scores (-1: starting or idle)."""
    deadline: float = 0.0
    start_failures: int = 0
    """Starts of this slot's actor that failed (raised, or past `STARTUP_S`)."""


class ScoringPool:
    """``options.workers`` Ray actors, each holding ``make()``'s task (module docstring).
    Started on the first `score`; `close` kills them and leaves the cluster."""

    def __init__(self, make: Callable[[], Task], options: PoolOptions,
                 failure_reward: float = 0.0) -> None:
        self.make, self.options, self.failure_reward = make, options, failure_reward
        self.slots: list[_Slot] = []
        self._stack = contextlib.ExitStack()
        self._ray: Any = None

    def _start(self) -> None:
        from rlscope.ray_cluster import ray_cluster

        self._ray = self._stack.enter_context(ray_cluster())
        self._actor_class = self._ray.remote(num_cpus=1, max_restarts=0,
                                             max_task_retries=0)(Scorer)
        self.slots = [self._new_slot() for _ in range(self.options.workers)]

    def _new_slot(self) -> _Slot:
        actor = self._actor_class.remote(self.make)
        return _Slot(actor, actor.ready.remote(), -1, time.monotonic() + STARTUP_S)

    def _replace(self, slot: _Slot, kill: bool) -> None:
        if kill:
            self._ray.kill(slot.actor, no_restart=True)
        fresh = self._new_slot()
        slot.actor, slot.ref, slot.chunk, slot.deadline = (fresh.actor, fresh.ref, -1,
                                                           fresh.deadline)

    def _start_failed(self, slot: _Slot, why: str) -> None:
        """A start of ``slot``'s actor failed (counted as an error by the caller): start it
        again, at most ``--env_retries`` times; then drop the slot and score on the others.
        Only when no worker is left does the run stop, with the last reason."""
        slot.start_failures += 1
        if slot.start_failures <= self.options.retries:
            self._replace(slot, kill=True)
            return
        self._ray.kill(slot.actor, no_restart=True)
        self.slots.remove(slot)
        if not self.slots:
            raise RuntimeError(f"no environment worker could start ({slot.start_failures} "
                               f"tries each); the last: {why}")

    def score(self, batch: RolloutBatch) -> tuple[Scores, int]:
        """``batch``'s scores (rows in order, on its device) and the failed calls on the way."""
        if self._ray is None:
            self._start()
        ray, o = self._ray, self.options
        slices = chunk_slices(batch.batch_size, o.workers, o.chunk_size)
        cpu = batch.to("cpu")
        results: list[Scores | None] = [None] * len(slices)
        attempts = [0] * len(slices)
        queue = deque(range(len(slices)))
        errors = 0

        def failed(k: int) -> None:
            nonlocal errors
            errors += 1
            attempts[k] += 1
            if attempts[k] <= o.retries:
                queue.appendleft(k)

        while queue or any(s.chunk >= 0 for s in self.slots):
            for slot in self.slots:
                if slot.ref is None and queue:
                    k = queue.popleft()
                    rows = torch.arange(slices[k].start, slices[k].stop)  # a copy, not a
                    slot.ref = slot.actor.score.remote(cpu.select(rows))  # view of the batch
                    slot.chunk, slot.deadline = k, time.monotonic() + o.timeout_s
            pending = {s.ref: s for s in self.slots if s.ref is not None}
            wait = max(0.0, min(s.deadline for s in pending.values()) - time.monotonic())
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=wait)
            for ref in ready:
                slot = pending[ref]
                k, slot.ref, slot.chunk = slot.chunk, None, -1
                try:
                    value = ray.get(ref)
                except Exception as e:  # raised in the task, or the actor died
                    if k < 0:
                        errors += 1
                        lines = [ln for ln in str(e).splitlines() if ln.strip()] or [""]
                        self._start_failed(slot, f"{type(e).__name__}: {lines[-1].strip()}")
                        continue
                    if isinstance(e, ray.exceptions.RayActorError):
                        self._replace(slot, kill=False)
                    failed(k)
                else:
                    if k >= 0:
                        results[k] = value
            now = time.monotonic()
            for slot in list(self.slots):
                if slot.ref is not None and slot.ref not in ready and now >= slot.deadline:
                    if slot.chunk < 0:
                        errors += 1
                        self._start_failed(slot, f"it did not start in {STARTUP_S:.0f}s (does "
                                                 "the Ray cluster have a free CPU for each of "
                                                 "--env_workers?)")
                        continue
                    k = slot.chunk
                    self._replace(slot, kill=True)
                    failed(k)
        width = batch.completion_tokens_BT.shape[1]
        scores = concat_scores(results, slices, width, self.failure_reward,
                               batch.completion_tokens_BT.device)
        return scores, errors

    def close(self) -> None:
        """Kill the actors and leave (or shut down) the cluster."""
        if self._ray is not None:
            for slot in self.slots:
                with contextlib.suppress(Exception):
                    self._ray.kill(slot.actor, no_restart=True)
            self.slots, self._ray = [], None
        self._stack.close()


class RemoteScoredTask:
    """``task`` with its `score` done by a `ScoringPool`; every other attribute is the task's
    own. Counts the failed calls until `take_errors`."""

    def __init__(self, task: Task, pool: ScoringPool) -> None:
        self.task, self.pool, self.errors = task, pool, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.task, name)

    def score(self, batch: RolloutBatch) -> Scores:
        scores, errors = self.pool.score(batch)
        self.errors += errors
        return scores

    def take_errors(self) -> int:
        """The failed calls since the last take."""
        errors, self.errors = self.errors, 0
        return errors


def with_env_workers(task: Task, task_name: str, task_options: TaskConfig,
                     options: PoolOptions) -> Task:
    """``task`` itself, or with ``options.workers`` its `RemoteScoredTask`, whose workers build
    ``make_task(task_name, task_options)`` (they start at the first scored batch)."""
    if not options.workers:
        return task
    from rlscope.tasks import make_task

    pool = ScoringPool(functools.partial(make_task, task_name, task_options), options,
                       float(getattr(task, "failure_reward", 0.0)))
    return cast(Task, RemoteScoredTask(task, pool))


def env_metrics(task: Task, device: torch.device) -> dict[str, torch.Tensor]:
    """``env/errors`` since the last call, with environment workers; else nothing."""
    if not isinstance(task, RemoteScoredTask):
        return {}
    return {ENV_ERRORS: torch.tensor(float(task.take_errors()), device=device)}


def close_env_workers(task: Task) -> None:
    """Stop ``task``'s workers, if it has any (Ray scorers, or an interactive task's
    environment processes)."""
    if isinstance(task, RemoteScoredTask):
        task.pool.close()
    if isinstance(task, Interactive) and task.episode_pool is not None:
        task.episode_pool.close()


__all__ = ["ENV_ERRORS", "PoolOptions", "RemoteScoredTask", "ScoringPool", "chunk_slices",
           "close_env_workers", "concat_scores", "env_metrics",
           "env_worker_errors", "with_env_workers"]
