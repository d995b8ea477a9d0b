"""Futures, long polls and per-model ``seq_id`` ordering (TINKER_PROTOCOL.md §1.3–1.4).

Every mutating call returns a request id at once; the work runs later on the engine's worker
and its `Result` is stored here until the client's ``retrieve_future`` collects it.
``FutureStore.wait`` is the long poll: it answers as soon as the result exists, or None after
the timeout (the app then answers 408, which the SDK re-polls quietly).

`SeqOrderer` releases each training client's requests in ``seq_id`` order 1, 2, 3, ...:
requests that arrive early (the chunks of one ``forward_backward`` are posted concurrently,
first chunk last) wait in a buffer, and a retry of an already-seen ``(model_id, seq_id)`` gets
the original request id back. A gap that stays open longer than ``gap_timeout_s`` (a request
the client never managed to send) is skipped with a warning rather than blocking the model.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("rlscope.serve")


@dataclass(frozen=True)
class Result:
    """The outcome of one request: a JSON object, protobuf bytes, or a failure.

    A failure carries ``error`` (the message) and ``category`` (``user`` for bad input, else
    ``server``), the ``RequestFailedResponse`` shape the SDK turns into ``RequestFailedError``.
    """

    json: dict[str, Any] | None = None
    proto: bytes | None = None
    error: str | None = None
    category: str = "server"

    @staticmethod
    def failed(error: str, category: str = "server") -> Result:
        return Result(error=error, category=category)


@dataclass
class _Entry:
    kind: str
    created: float
    result: Result | None = None
    waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[Result]]] = field(
        default_factory=list)


class FutureStore:
    """Request ids → results; thread-safe (results are set from the engine's worker)."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._counter = itertools.count(1)

    def create(self, kind: str) -> str:
        """A new pending request id (a decimal string: the SDK needs a JSON string)."""
        with self._lock:
            request_id = str(next(self._counter))
            self._entries[request_id] = _Entry(kind=kind, created=time.monotonic())
        return request_id

    def known(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._entries

    def set_result(self, request_id: str, result: Result) -> None:
        """Store the result and wake every long poll waiting on it (idempotent: the first
        result wins)."""
        with self._lock:
            entry = self._entries[request_id]
            if entry.result is not None:
                return
            entry.result = result
            waiters, entry.waiters = entry.waiters, []
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_resolve, fut, result)

    def peek(self, request_id: str) -> Result | None:
        with self._lock:
            return self._entries[request_id].result

    async def wait(self, request_id: str, timeout_s: float) -> Result | None:
        """The result of ``request_id``, waiting at most ``timeout_s`` seconds (None on
        timeout). Raises KeyError for an unknown id."""
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._entries[request_id]
            if entry.result is not None:
                return entry.result
            fut: asyncio.Future[Result] = loop.create_future()
            entry.waiters.append((loop, fut))
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except asyncio.TimeoutError:
            return None
        finally:
            with self._lock:
                entry.waiters = [w for w in entry.waiters if w[1] is not fut]


def _resolve(fut: asyncio.Future[Result], result: Result) -> None:
    if not fut.done():
        fut.set_result(result)


def body_digest(body: bytes) -> str:
    """Fingerprint of a request body, to tell a retry from a conflicting reuse of a seq_id."""
    return hashlib.blake2b(body, digest_size=16).hexdigest()


class SeqConflictError(ValueError):
    """The same ``(model_id, seq_id)`` arrived twice with different bodies."""


@dataclass
class _Queue:
    next_seq: int = 1
    pending: dict[int, tuple[str, Callable[[], None]]] = field(default_factory=dict)
    waiting_since: float | None = None


class SeqOrderer:
    """Releases each model's training requests in ``seq_id`` order, deduplicating retries.

    ``submit`` registers a request and calls ``dispatch`` callbacks (each hands a job to the
    engine's FIFO worker) for every request that is now next in line. ``seq_id`` 0 (unset)
    bypasses ordering.
    """

    def __init__(self, gap_timeout_s: float = 30.0) -> None:
        self.gap_timeout_s = gap_timeout_s
        self._queues: dict[str, _Queue] = {}
        self._seen: dict[tuple[str, int], tuple[str, str]] = {}
        self._lock = threading.Lock()

    def lookup(self, model_id: str, seq_id: int, digest: str) -> str | None:
        """The request id already given to this ``(model_id, seq_id)`` (a retry), else None;
        raises `SeqConflictError` if it came before with a different body."""
        with self._lock:
            seen = self._seen.get((model_id, seq_id))
        if seen is None:
            return None
        if seen[1] != digest:
            raise SeqConflictError(f"seq_id {seq_id} of model {model_id} was already used by "
                                   "a different request")
        return seen[0]

    def submit(self, model_id: str, seq_id: int, digest: str, request_id: str,
               dispatch: Callable[[], None]) -> str:
        """Register ``request_id`` as ``(model_id, seq_id)``; returns the request id to answer
        with (the original one for a retry, in which case ``dispatch`` is never called)."""
        ready: list[Callable[[], None]] = []
        with self._lock:
            if seq_id > 0:
                seen = self._seen.get((model_id, seq_id))
                if seen is not None:
                    if seen[1] != digest:
                        raise SeqConflictError(
                            f"seq_id {seq_id} of model {model_id} was already used by a "
                            "different request")
                    return seen[0]
                self._seen[(model_id, seq_id)] = (request_id, digest)
            queue = self._queues.setdefault(model_id, _Queue())
            if seq_id <= 0:
                ready.append(dispatch)
            elif seq_id < queue.next_seq:
                log.warning("model %s: seq_id %d arrived after seq_id %d ran; running it now",
                            model_id, seq_id, queue.next_seq - 1)
                ready.append(dispatch)
            else:
                queue.pending[seq_id] = (request_id, dispatch)
                ready.extend(self._drain(queue))
                if queue.pending and queue.waiting_since is None:
                    queue.waiting_since = time.monotonic()
        for job in ready:
            job()
        return request_id

    def _drain(self, queue: _Queue) -> list[Callable[[], None]]:
        ready = []
        while queue.next_seq in queue.pending:
            ready.append(queue.pending.pop(queue.next_seq)[1])
            queue.next_seq += 1
            queue.waiting_since = None
        return ready

    def release_stale(self) -> None:
        """Skip gaps older than ``gap_timeout_s`` (called periodically by the app)."""
        ready: list[Callable[[], None]] = []
        now = time.monotonic()
        with self._lock:
            for model_id, queue in self._queues.items():
                if not queue.pending or queue.waiting_since is None \
                        or now - queue.waiting_since < self.gap_timeout_s:
                    continue
                first = min(queue.pending)
                log.warning("model %s: seq_id %d..%d never arrived after %.0f s; skipping to %d",
                            model_id, queue.next_seq, first - 1, self.gap_timeout_s, first)
                queue.next_seq = first
                ready.extend(self._drain(queue))
                queue.waiting_since = now if queue.pending else None
        for job in ready:
            job()
