"""The FastAPI application: the Tinker endpoints of SDK 0.38.0 on top of `Engine`.

`create_app` builds the server's shared parts (`ServerContext`: engine, future store,
``seq_id`` orderer, worker), its lifespan (warm-up, housekeeping, graceful shutdown), the guard
middleware and error handlers of `rlscope.serve.http`, and includes the routers of
`rlscope.serve.routes`, one per family of endpoints.

Request bodies are read as plain JSON (or protobuf for ``forward_backward``) and validated in
the routers, never bound to the SDK's own request types (they changed shape across SDK
versions). Mutating calls return an ``UntypedAPIFuture`` at once; their work runs on the
`Worker`, one job at a time, training requests released per model in ``seq_id`` order.

Hardening (docs/tinker.md, "Limits and security"): with an API key every request but
``healthz`` needs ``X-API-Key`` (401 otherwise, constant-time comparison); bodies over
``--max_body_bytes`` or inflating past ``--max_decompressed_bytes`` get 413 (zstd and gzip are
decompressed as a stream that stops at the cap); malformed fields, NaN/inf numbers and requests
over the size caps get 400 naming the field; a full future store gets 429; nothing answers with
a traceback or a server path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI

from rlscope.serve.config import ServeConfig
from rlscope.serve.context import ServerContext
from rlscope.serve.engine import Engine
from rlscope.serve.http import EXCEPTION_HANDLERS, GuardMiddleware
from rlscope.serve.routes import ROUTERS
from rlscope.serve.worker import Job

log = logging.getLogger("rlscope.serve")

Lifespan = Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]
"""What ``FastAPI(lifespan=...)`` takes."""

HOUSEKEEPING_S = 1.0
"""Seconds between releases of stale ``seq_id`` gaps and evictions of expired futures."""


def lifespan(ctx: ServerContext) -> Lifespan:
    """Start: queue the warm-up job, start the worker and the housekeeping task. Stop: fail
    every pending request (`ServerContext.begin_shutdown`), let the running job finish within
    half of ``--shutdown_timeout_s``, close the engine."""

    async def housekeeping() -> None:
        while True:
            await asyncio.sleep(HOUSEKEEPING_S)
            ctx.orderer.release_stale()
            ctx.store.evict()

    @contextlib.asynccontextmanager
    async def run(_: FastAPI) -> AsyncIterator[None]:
        ctx.worker.put(Job(ctx.store.create("WarmUp"), ctx.warm_up, ""))
        ctx.worker.start()
        task = asyncio.create_task(housekeeping())
        try:
            yield
        finally:
            task.cancel()
            ctx.begin_shutdown()
            grace_s = ctx.cfg.shutdown_timeout_s / 2
            if not await asyncio.to_thread(ctx.worker.stop, grace_s):
                log.warning("the running job did not finish within %.0f s; exiting anyway",
                            grace_s)
            ctx.engine.close()

    return run


def create_app(cfg: ServeConfig, engine: Engine | None = None) -> FastAPI:
    """The application for ``cfg`` (its engine is built here unless given)."""
    ctx = ServerContext(cfg, engine if engine is not None else Engine(cfg))
    app = FastAPI(title="rlscope serve (Tinker protocol)", lifespan=lifespan(ctx),
                  exception_handlers=EXCEPTION_HANDLERS)
    app.add_middleware(GuardMiddleware, api_key=cfg.resolved_api_key(),  # type: ignore[arg-type]
                       max_body_bytes=cfg.max_body_bytes)
    for router in ROUTERS:
        app.include_router(router)
    app.state.context = ctx
    app.state.worker = ctx.worker
    app.state.begin_shutdown = ctx.begin_shutdown
    app.state.warm = ctx.warm
    return app
