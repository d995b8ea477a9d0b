"""ServiceClient and session endpoints (TINKER_PROTOCOL.md §1.2 and §1.5, "ServiceClient and
session"): the bootstrap (``client/config``, ``create_session``), heartbeats, telemetry, the
session's close, health and capabilities."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from rlscope.serve.context import Context
from rlscope.serve.http import JsonBody, read_body
from rlscope.serve.validate import get_str

log = logging.getLogger("rlscope.serve")

TESTED_SDK = "0.38.0"

router = APIRouter(prefix="/api/v1")


@router.post("/client/config")
async def client_config(_: JsonBody, ctx: Context) -> dict[str, Any]:
    # the transport is left to the SDK (its default, pyqwest): see docs/tinker.md
    out: dict[str, Any] = {"pjwt_auth_enabled": False}
    if ctx.cfg.fwdbwd_max_chunk_len:
        out["fwdbwd_max_chunk_len"] = ctx.cfg.fwdbwd_max_chunk_len
    return out


@router.post("/client/dynamic_config")
async def dynamic_config(_: JsonBody) -> dict[str, Any]:
    return {}


@router.post("/create_session")
async def create_session(body: JsonBody) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "create_session", "session_id": uuid.uuid4().hex[:16]}
    version = get_str(body, "sdk_version", "", max_chars=64)
    if version and version != TESTED_SDK:
        out["warning_message"] = (f"rlscope serve was tested with tinker {TESTED_SDK}; "
                                  f"this client is {version}")
    return out


@router.post("/session_heartbeat", dependencies=[Depends(read_body)])
async def heartbeat() -> dict[str, Any]:
    return {"type": "session_heartbeat"}


@router.post("/telemetry", dependencies=[Depends(read_body)])
async def telemetry() -> dict[str, Any]:
    return {"status": "accepted"}


@router.post("/sessions/{session_id}/finish", dependencies=[Depends(read_body)])
async def finish(session_id: str, ctx: Context) -> Response:
    log.info("session %s finished", session_id)
    await asyncio.to_thread(ctx.engine.finish_session, session_id)
    return Response(status_code=200)


@router.get("/healthz")
async def healthz() -> dict[str, Any]:
    return {"status": "ok"}


@router.get("/get_server_capabilities")
async def capabilities(ctx: Context) -> dict[str, Any]:
    return {"supported_models": ctx.engine.capabilities()}
