"""The one thread that runs model work, fed by a fair queue.

Every job belongs to a *client* (a training job to its model id, a sample request to its
sampling session). The worker takes work round-robin across clients, so one client's huge
request cannot starve the others: a sample request is split into chunks of at most
``--sample_chunk_rows`` sequences, each chunk a separate unit of work, and its result is
assembled when the last chunk is done. Per client, training jobs run in the order the app hands
them over (per model that is ``seq_id`` order: `rlscope.serve.futures.SeqOrderer` releases
them). A sample chunk picked up is merged with the other waiting chunks that share its weights
and sampling parameters, up to ``--max_sample_rows`` rows, into one decode batch (while other
clients wait, at most one chunk's worth of rows is the picked client's own); sample chunks may
run ahead of queued training jobs, which is safe because a sampler snapshot never changes.

`Worker.stop` (graceful shutdown) fails every queued request at once with a ``server`` error
and waits a bounded time for the running one.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlscope.serve.engine import Engine
from rlscope.serve.futures import FutureStore, Result
from rlscope.serve.sampling import PromptScores, SampledRow
from rlscope.serve.state import UserError, Weights
from rlscope.serve.wire import SampledSequenceOut, encode_sample_response

log = logging.getLogger("rlscope.serve")

SHUTDOWN_ERROR = "the server is shutting down; the request was not run"


@dataclass(frozen=True)
class Job:
    """A training (or other non-sample) request: ``run`` computes its result."""

    request_id: str
    run: Callable[[], Result]
    client: str = ""
    """Fairness key: the model id (or session) the job belongs to."""


@dataclass(frozen=True)
class SampleJob:
    """A validated ``asample`` request on ``weights`` (split into chunks, merged with other
    chunks into batches)."""

    request_id: str
    weights: Weights
    request: dict[str, Any]
    client: str = ""
    """Fairness key: the sampling session."""

    def key(self) -> tuple[int, float, int, float]:
        """Requests with the same key can share a decode batch."""
        r = self.request
        return (id(self.weights), r["temperature"], r["top_k"], r["top_p"])


@dataclass
class _Assembly:
    """The chunks of one sample request, collected until the last one is done."""

    parts: list[list[SampledRow] | None]
    prompt_scores: PromptScores | None = None
    failed: bool = False


@dataclass(frozen=True)
class _Chunk:
    job: SampleJob
    index: int
    start: int
    rows: int
    assembly: _Assembly = field(compare=False)

    def request(self) -> dict[str, Any]:
        """The request dict `Engine.sample_batch` reads, for this chunk's rows only."""
        return {**self.job.request, "num_samples": self.rows, "row_offset": self.start,
                "prompt_logprobs": self.job.request["prompt_logprobs"] and self.index == 0,
                "topk_prompt_logprobs": self.job.request.get("topk_prompt_logprobs", 0)
                if self.index == 0 else 0}


_Unit = Job | _Chunk


class FairQueue:
    """Units of work per client, handed out round-robin across clients (thread-safe)."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[_Unit]] = {}
        self._order: deque[str] = deque()
        self._cond = threading.Condition()
        self.closed = False

    def put(self, client: str, units: list[_Unit]) -> None:
        with self._cond:
            if client not in self._queues:
                self._queues[client] = deque()
                self._order.append(client)
            self._queues[client].extend(units)
            self._cond.notify()

    def __len__(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._queues.values())

    def take(self, max_rows: int, turn_rows: int | None = None) -> list[_Unit] | None:
        """The next client's next unit; blocks; None once closed.

        A sample chunk comes with the compatible chunks waiting anywhere, up to ``max_rows``
        rows; while other clients wait, the picked client's own chunks count at most
        ``turn_rows`` rows of that (one turn stays short, so a huge request cannot hold the
        worker), other clients' compatible chunks ride along. With nobody else waiting a
        client's small requests still merge up to ``max_rows``.
        """
        with self._cond:
            while not self._order and not self.closed:
                self._cond.wait()
            if self.closed:
                return None
            client = self._order.popleft()
            unit = self._queues[client].popleft()
            if isinstance(unit, Job):
                self._requeue(client)
                return [unit]
            own_limit = max_rows if not self._order or turn_rows is None \
                else min(turn_rows, max_rows)
            batch: list[_Unit] = [unit]
            rows = unit.rows
            key = unit.job.key()
            for other in [client, *self._order]:
                limit = own_limit if other == client else max_rows
                queue = self._queues[other]
                keep: deque[_Unit] = deque()
                while queue:
                    u = queue.popleft()
                    if isinstance(u, _Chunk) and u.job.key() == key and rows + u.rows <= limit:
                        batch.append(u)
                        rows += u.rows
                    else:
                        keep.append(u)
                self._queues[other] = keep
            self._requeue(client)
            for other in list(self._order):
                if not self._queues[other]:
                    self._order.remove(other)
                    del self._queues[other]
            return batch

    def _requeue(self, client: str) -> None:
        if self._queues[client]:
            self._order.append(client)
        else:
            del self._queues[client]

    def close(self) -> list[_Unit]:
        """Stop handing out work; returns every unit still queued."""
        with self._cond:
            self.closed = True
            left = [u for q in self._queues.values() for u in q]
            self._queues.clear()
            self._order.clear()
            self._cond.notify_all()
            return left


class Worker:
    """The one thread that runs model work, taking it round-robin across clients."""

    def __init__(self, engine: Engine, store: FutureStore) -> None:
        self.engine = engine
        self.store = store
        self.queue = FairQueue()
        self.largest_batch = 0
        """Most sample requests merged into one decode batch so far (observability, tests)."""
        self._thread = threading.Thread(target=self._loop, name="rlscope-serve-worker",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Fail every queued request (``server`` error), then wait at most ``timeout_s`` for
        the running job; whether the thread has ended."""
        for unit in self.queue.close():
            request_id = unit.request_id if isinstance(unit, Job) else unit.job.request_id
            self.store.set_result(request_id, Result.failed(SHUTDOWN_ERROR, "server"))
        self._thread.join(timeout=timeout_s)
        return not self._thread.is_alive()

    def put(self, job: Job | SampleJob) -> None:
        if self.queue.closed:
            self.store.set_result(job.request_id, Result.failed(SHUTDOWN_ERROR, "server"))
            return
        if isinstance(job, Job):
            self.queue.put(job.client, [job])
            return
        cfg = self.engine.cfg
        size = max(1, min(cfg.sample_chunk_rows, cfg.max_sample_rows))
        n = job.request["num_samples"]
        starts = list(range(0, n, size))
        assembly = _Assembly(parts=[None] * len(starts))
        self.queue.put(job.client, [_Chunk(job, i, s, min(size, n - s), assembly)
                                    for i, s in enumerate(starts)])

    def _loop(self) -> None:
        while True:
            cfg = self.engine.cfg
            units = self.queue.take(cfg.max_sample_rows, cfg.sample_chunk_rows)
            if units is None:
                return
            first = units[0]
            if isinstance(first, Job):
                self._run(first)
            else:
                self._sample_batch([u for u in units if isinstance(u, _Chunk)])

    def _run(self, job: Job) -> None:
        try:
            result = job.run()
        except UserError as e:
            result = Result.failed(str(e), "user")
        except Exception as e:
            log.error("request %s failed:\n%s", job.request_id, traceback.format_exc())
            result = Result.failed(f"{type(e).__name__}: {e}", "server")
        self.store.set_result(job.request_id, result)

    def _sample_batch(self, chunks: list[_Chunk]) -> None:
        chunks = [c for c in chunks if not c.assembly.failed]
        if not chunks:
            return
        self.largest_batch = max(self.largest_batch, len({c.job.request_id for c in chunks}))
        try:
            outs = self.engine.sample_batch(chunks[0].job.weights,
                                            [c.request() for c in chunks])
        except Exception as e:
            log.error("sampling failed:\n%s", traceback.format_exc())
            for c in chunks:
                c.assembly.failed = True
                self.store.set_result(c.job.request_id,
                                      Result.failed(f"{type(e).__name__}: {e}", "server"))
            return
        for c, (rows, prompt_lps) in zip(chunks, outs, strict=True):
            c.assembly.parts[c.index] = rows
            if c.index == 0:
                c.assembly.prompt_scores = prompt_lps
            if all(p is not None for p in c.assembly.parts):
                seqs = [SampledSequenceOut(r.tokens, r.logprobs, r.stop_reason)
                        for part in c.assembly.parts if part is not None for r in part]
                scores = c.assembly.prompt_scores
                self.store.set_result(c.job.request_id, Result(proto=encode_sample_response(
                    seqs, scores.logprobs if scores else None,
                    scores.topk_ids if scores else None,
                    scores.topk_logprobs if scores else None)))
