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


class StoreFullError(RuntimeError):
    """Every slot of the `FutureStore` holds a pending request (the app answers 429)."""


@dataclass
class _Entry:
    kind: str
    created: float
    result: Result | None = None
    finished: float = 0.0
    retrieved: float | None = None
    waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[Result]]] = field(
        default_factory=list)


class FutureStore:
    """Request ids → results; thread-safe (results are set from the engine's worker).

    Memory is bounded: a result is dropped ``retrieved_ttl_s`` after the client retrieved it
    (the grace covers the SDK re-polling after a lost response), a finished result nobody
    retrieved after ``ttl_s``, and at most ``max_entries`` entries are held (the oldest
    finished ones go first; when every entry is pending, `create` raises `StoreFullError`).
    """

    def __init__(self, ttl_s: float = 3600.0, retrieved_ttl_s: float = 60.0,
                 max_entries: int = 10000) -> None:
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._counter = itertools.count(1)
        self.ttl_s = ttl_s
        self.retrieved_ttl_s = retrieved_ttl_s
        self.max_entries = max_entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def create(self, kind: str) -> str:
        """A new pending request id (a decimal string: the SDK needs a JSON string)."""
        with self._lock:
            self._evict_locked(time.monotonic())
            if len(self._entries) >= self.max_entries:
                raise StoreFullError(f"{len(self._entries)} requests are pending; retry later")
            request_id = str(next(self._counter))
            self._entries[request_id] = _Entry(kind=kind, created=time.monotonic())
        return request_id

    def mark_retrieved(self, request_id: str) -> None:
        """The client has received the result: drop it after ``retrieved_ttl_s``."""
        with self._lock:
            entry = self._entries.get(request_id)
            if entry is not None and entry.retrieved is None:
                entry.retrieved = time.monotonic()

    def evict(self) -> int:
        """Drop expired results (called periodically and on every `create`); how many."""
        with self._lock:
            return self._evict_locked(time.monotonic())

    def _evict_locked(self, now: float) -> int:
        expired = [rid for rid, e in self._entries.items() if e.result is not None and (
            (e.retrieved is not None and now - e.retrieved >= self.retrieved_ttl_s)
            or now - e.finished >= self.ttl_s)]
        for rid in expired:
            del self._entries[rid]
        excess = len(self._entries) - self.max_entries + 1
        if excess > 0:
            finished = sorted((e.finished, rid) for rid, e in self._entries.items()
                              if e.result is not None and not e.waiters)
            for _, rid in finished[:excess]:
                del self._entries[rid]
            expired.extend(rid for _, rid in finished[:excess])
        return len(expired)

    def fail_pending(self, error: str) -> int:
        """Fail every pending request with ``error`` (category ``server``), waking its long
        polls (shutdown); how many."""
        with self._lock:
            pending = [rid for rid, e in self._entries.items() if e.result is None]
        for rid in pending:
            self.set_result(rid, Result.failed(error, "server"))
        return len(pending)

    def known(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._entries

    def set_result(self, request_id: str, result: Result) -> None:
        """Store the result and wake every long poll waiting on it (idempotent: the first
        result wins)."""
        with self._lock:
            entry = self._entries.get(request_id)
            if entry is None or entry.result is not None:
                return
            entry.result = result
            entry.finished = time.monotonic()
            waiters, entry.waiters = entry.waiters, []
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_resolve, fut, result)

    def peek(self, request_id: str) -> Result | None:
        """The result if finished, else None (also None for an unknown id)."""
        with self._lock:
            entry = self._entries.get(request_id)
            return None if entry is None else entry.result

    async def wait(self, request_id: str, timeout_s: float) -> Result | None:
        """The result of ``request_id``, waiting at most ``timeout_s`` seconds (None on
        timeout). Raises KeyError for an unknown id."""
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._entries.get(request_id)
            if entry is None:
                raise KeyError(request_id)
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


SEEN_WINDOW = 1024
"""Per model, how many already-run seq_ids are remembered to deduplicate retries."""


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
            if len(self._seen) > 2 * SEEN_WINDOW * max(len(self._queues), 1):
                self._prune_seen()
        for job in ready:
            job()
        return request_id

    def _prune_seen(self) -> None:
        """Forget retries older than ``SEEN_WINDOW`` seq_ids behind each model's next one
        (bounded memory: a retry arrives within seconds, never a thousand requests late)."""
        self._seen = {(m, s): v for (m, s), v in self._seen.items()
                      if m not in self._queues or s >= self._queues[m].next_seq - SEEN_WINDOW}

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
