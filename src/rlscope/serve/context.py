"""What every endpoint of `rlscope serve` shares: the engine, the future store, the ``seq_id``
orderer, the worker, and the ways a request becomes a future.

`ServerContext` is built once per application (`rlscope.serve.app.create_app`) and handed to
the routers (`rlscope.serve.routes`) as the FastAPI dependency `Context`, read from
``app.state.context``. Mutating calls return an ``UntypedAPIFuture`` (`future`) at once; their
work runs on the `Worker`, one job at a time, training requests released per model in
``seq_id`` order by `SeqOrderer`. Failures are stored as ``{"error", "category"}`` results,
which the SDK raises as ``RequestFailedError`` (``category`` is ``user`` for bad input).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, Request

from rlscope.serve.config import ServeConfig
from rlscope.serve.engine import Engine
from rlscope.serve.futures import FutureStore, Result, SeqConflictError, SeqOrderer, body_digest
from rlscope.serve.sampling import SampleLimits
from rlscope.serve.worker import Job, Worker

log = logging.getLogger("rlscope.serve")

MAX_CREATE_KEYS = 100_000
"""Create-client requests remembered for retries (the oldest are forgotten)."""

Run = Callable[[], dict[str, Any] | bytes]
"""A job's work: its result as protobuf (bytes) or JSON (a dict)."""


def future(request_id: str, model_id: str | None = None,
           sample_sequence_ids: list[str] | None = None) -> dict[str, Any]:
    """The ``UntypedAPIFuture`` answered for ``request_id``."""
    out: dict[str, Any] = {"request_id": request_id}
    if model_id is not None:
        out["model_id"] = model_id
    if sample_sequence_ids is not None:
        out["sample_sequence_ids"] = sample_sequence_ids
    return out


def _as_result(run: Run) -> Callable[[], Result]:
    """``run`` with its output wrapped as a `Result` (bytes are protobuf, dicts JSON)."""

    def wrapped() -> Result:
        out = run()
        return Result(proto=out) if isinstance(out, bytes) else Result(json=out)

    return wrapped


class ServerContext:
    """The parts of one server and the request → future plumbing the endpoints share."""

    def __init__(self, cfg: ServeConfig, engine: Engine) -> None:
        self.cfg = cfg
        self.engine = engine
        self.store = FutureStore(cfg.future_ttl_s, cfg.retrieved_ttl_s, cfg.max_futures)
        self.orderer = SeqOrderer(cfg.seq_gap_timeout_s)
        self.worker = Worker(engine, self.store)
        self.limits = SampleLimits(cfg.max_num_samples, cfg.max_sample_tokens,
                                   cfg.max_batch_tokens, cfg.max_topk_logprobs)
        self.warm = threading.Event()
        """Set once the warm-up job has run (`warm_up`)."""
        self._create_keys: OrderedDict[tuple[str, int], str] = OrderedDict()
        """(session, model_seq_id) → the request that creates that client (retries get it
        back); the oldest are forgotten past `MAX_CREATE_KEYS`."""
        self._keys_lock = threading.Lock()

    def warm_up(self) -> Result:
        """The first job: build the engine's lazy parts, then set `warm`."""
        try:
            self.engine.warm_up()
        finally:
            self.warm.set()
        return Result(json={})

    def begin_shutdown(self) -> None:
        """Stop taking work and fail every queued or pending request at once, so long polls
        answer now (called on SIGTERM/SIGINT before uvicorn drains connections)."""
        self.worker.queue.close()
        failed = self.store.fail_pending("the server is shutting down; the request was not run")
        log.info("shutting down: %d pending request(s) failed", failed)

    def fail_now(self, kind: str, error: str, category: str = "user",
                 model_id: str | None = None) -> dict[str, Any]:
        """A future that is already a failure."""
        request_id = self.store.create(kind)
        self.store.set_result(request_id, Result.failed(error, category))
        return future(request_id, model_id)

    def submit(self, kind: str, run: Run, client: str) -> str:
        """``run`` queued on the worker for ``client``; its request id."""
        request_id = self.store.create(kind)
        self.worker.put(Job(request_id, _as_result(run), client))
        return request_id

    def submit_ordered(self, kind: str, model_id: str, seq_id: int, body: bytes,
                       run: Run) -> dict[str, Any]:
        """A training request on ``model_id``, released in ``seq_id`` order; a retry (same
        ``seq_id``, same ``body``) gets the first request's future back."""
        if model_id not in self.engine.models:
            return self.fail_now(kind, f"unknown model_id {model_id!r}", model_id=model_id)
        digest = body_digest(body)
        try:
            existing = self.orderer.lookup(model_id, seq_id, digest) if seq_id > 0 else None
        except SeqConflictError as e:
            return self.fail_now(kind, str(e), model_id=model_id)
        if existing is not None:
            return future(existing, model_id)
        request_id = self.store.create(kind)
        job = Job(request_id, _as_result(run), model_id)
        try:
            answer = self.orderer.submit(model_id, seq_id, digest, request_id,
                                         lambda: self.worker.put(job))
        except SeqConflictError as e:
            self.store.set_result(request_id, Result.failed(str(e), "user"))
            answer = request_id
        return future(answer, model_id)

    def create_client(self, kind: str, session_id: str, model_seq_id: int, run: Run,
                      refusal: str | None = None) -> dict[str, Any]:
        """A request that creates training client ``model_seq_id`` of ``session_id``, run
        once: a retry gets the first request's future back; ``refusal`` (checked after that)
        fails it at once instead."""
        key = (session_id, model_seq_id)
        model_id = f"{session_id}:train:{model_seq_id}"
        with self._keys_lock:
            if key in self._create_keys:
                return future(self._create_keys[key], model_id)
            if refusal is not None:
                return self.fail_now(kind, refusal)
            request_id = self.submit(kind, run, session_id)
            self._create_keys[key] = request_id
            while len(self._create_keys) > MAX_CREATE_KEYS:
                self._create_keys.popitem(last=False)
        return future(request_id, model_id)


async def context_of(request: Request) -> ServerContext:
    """The application's `ServerContext` (a FastAPI dependency; async, so it runs on the event
    loop rather than in a thread pool)."""
    ctx: ServerContext = request.app.state.context
    return ctx


Context = Annotated[ServerContext, Depends(context_of)]
"""An endpoint parameter: the application's `ServerContext`."""
