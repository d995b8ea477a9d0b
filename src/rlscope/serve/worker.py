"""The one thread that runs model work, and the jobs it runs.

Training jobs run one at a time in the order the app hands them over (per model, that is
``seq_id`` order: `rlscope.serve.futures.SeqOrderer` releases them). Sample jobs that are
waiting together are merged into decode batches (same weights and sampling parameters, up to
``--max_sample_rows`` rows) and run ahead of the queued training jobs, which keep their order;
that is safe because a sampler snapshot never changes.
"""

from __future__ import annotations

import logging
import queue
import threading
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlscope.serve.engine import Engine
from rlscope.serve.futures import FutureStore, Result
from rlscope.serve.state import UserError, Weights
from rlscope.serve.wire import SampledSequenceOut, encode_sample_response

log = logging.getLogger("rlscope.serve")


@dataclass(frozen=True)
class Job:
    """A training (or other non-sample) request: ``run`` computes its result."""

    request_id: str
    run: Callable[[], Result]


@dataclass(frozen=True)
class SampleJob:
    """A validated ``asample`` request on ``weights`` (merged with others into batches)."""

    request_id: str
    weights: Weights
    request: dict[str, Any]

    def key(self) -> tuple[int, float, int, float]:
        """Requests with the same key can share a decode batch."""
        r = self.request
        return (id(self.weights), r["temperature"], r["top_k"], r["top_p"])


class Worker:
    """The one thread that runs model work. Sample jobs waiting together are merged into
    batches (same weights and sampling parameters) and run ahead of queued training jobs,
    which keep their order."""

    def __init__(self, engine: Engine, store: FutureStore) -> None:
        self.engine = engine
        self.store = store
        self.queue: queue.Queue[Job | SampleJob | None] = queue.Queue()
        self.largest_batch = 0
        """Most sample requests merged into one decode batch so far (observability, tests)."""
        self._thread = threading.Thread(target=self._loop, name="rlscope-serve-worker",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.queue.put(None)
        self._thread.join(timeout=30)

    def put(self, job: Job | SampleJob) -> None:
        self.queue.put(job)

    def _loop(self) -> None:
        backlog: deque[Job | SampleJob | None] = deque()
        while True:
            job = backlog.popleft() if backlog else self.queue.get()
            if job is None:
                return
            if isinstance(job, Job):
                self._run(job)
                continue
            samples = [job]
            while True:
                try:
                    nxt = self.queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(nxt, SampleJob):
                    samples.append(nxt)
                else:
                    backlog.append(nxt)
            self._run_samples(samples)

    def _run(self, job: Job) -> None:
        try:
            result = job.run()
        except UserError as e:
            result = Result.failed(str(e), "user")
        except Exception as e:
            log.error("request %s failed:\n%s", job.request_id, traceback.format_exc())
            result = Result.failed(f"{type(e).__name__}: {e}", "server")
        self.store.set_result(job.request_id, result)

    def _run_samples(self, jobs: list[SampleJob]) -> None:
        groups: dict[tuple[int, float, int, float], list[SampleJob]] = {}
        for job in jobs:
            groups.setdefault(job.key(), []).append(job)
        limit = self.engine.cfg.max_sample_rows
        for group in groups.values():
            batch: list[SampleJob] = []
            rows = 0
            for job in group:
                if batch and rows + job.request["num_samples"] > limit:
                    self._sample_batch(batch)
                    batch, rows = [], 0
                batch.append(job)
                rows += job.request["num_samples"]
            self._sample_batch(batch)

    def _sample_batch(self, jobs: list[SampleJob]) -> None:
        self.largest_batch = max(self.largest_batch, len(jobs))
        try:
            outs = self.engine.sample_batch(jobs[0].weights, [j.request for j in jobs])
        except Exception as e:
            log.error("sampling failed:\n%s", traceback.format_exc())
            for job in jobs:
                self.store.set_result(job.request_id,
                                      Result.failed(f"{type(e).__name__}: {e}", "server"))
            return
        for job, (rows, prompt_lps) in zip(jobs, outs, strict=True):
            seqs = [SampledSequenceOut(r.tokens, r.logprobs, r.stop_reason) for r in rows]
            self.store.set_result(job.request_id,
                                  Result(proto=encode_sample_response(seqs, prompt_lps)))
