"""The endpoints of `rlscope serve`, one router per family of TINKER_PROTOCOL.md: `session`
(bootstrap, heartbeats, health), `futures` (``retrieve_future``), `training` (training
clients and the ``seq_id``-ordered model calls), `sampling`, `rest` (training runs and
checkpoints). Each endpoint gets what it shares with the others as FastAPI dependencies: the
server (`rlscope.serve.context.Context`) and the capped body (`rlscope.serve.http.RawBody`,
`rlscope.serve.http.JsonBody`); errors map to status codes in
`rlscope.serve.http.EXCEPTION_HANDLERS`."""

from __future__ import annotations

from fastapi import APIRouter

from rlscope.serve.routes import futures, rest, sampling, session, training

ROUTERS: tuple[APIRouter, ...] = (session.router, futures.router, training.router,
                                  sampling.router, rest.router)
"""Every router, in the order they are included."""
