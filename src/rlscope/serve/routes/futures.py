"""Futures (TINKER_PROTOCOL.md §1.3): ``retrieve_future`` long-polls a request's result."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from rlscope.serve.context import Context
from rlscope.serve.futures import Result
from rlscope.serve.http import PROTO, JsonBody
from rlscope.serve.validate import get_bool, get_str

router = APIRouter(prefix="/api/v1")


@router.post("/retrieve_future")
async def retrieve_future(body: JsonBody, ctx: Context) -> Response:
    """The result (protobuf or JSON, a failure as ``{"error", "category"}``), or 408
    ``try_again`` after ``--long_poll_s``."""
    request_id = get_str(body, "request_id", max_chars=64)
    get_bool(body, "allow_metadata_only", False)
    store = ctx.store
    if not store.known(request_id):
        return JSONResponse({"error": f"unknown or expired request_id {request_id!r}",
                             "category": "user"})
    try:
        result = await store.wait(request_id, ctx.cfg.long_poll_s)
    except KeyError:
        result = Result.failed(f"request_id {request_id!r} expired", "user")
    if result is None:
        return JSONResponse(status_code=408, content={
            "type": "try_again", "request_id": request_id, "queue_state": "active"})
    store.mark_retrieved(request_id)
    if result.error is not None:
        return JSONResponse({"error": result.error, "category": result.category})
    if result.proto is not None:
        return Response(content=result.proto, media_type=PROTO)
    return JSONResponse(result.json)
