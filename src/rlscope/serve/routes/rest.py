"""RestClient endpoints (TINKER_PROTOCOL.md §1.5, "REST"): training runs and their
checkpoints on disk, read-only (read on the thread pool, never on the event loop)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from rlscope.serve import checkpoints
from rlscope.serve.context import Context
from rlscope.serve.state import UserError

router = APIRouter(prefix="/api/v1")


@router.get("/training_runs")
async def training_runs(ctx: Context) -> dict[str, Any]:
    runs = await asyncio.to_thread(checkpoints.list_runs, ctx.engine.root)
    return {"training_runs": runs,
            "cursor": {"offset": 0, "limit": len(runs), "total_count": len(runs)}}


@router.get("/training_runs/{run_id}/checkpoints")
async def run_checkpoints(run_id: str, ctx: Context) -> dict[str, Any]:
    ckpts = await asyncio.to_thread(checkpoints.list_checkpoints, ctx.engine.root, run_id)
    return {"checkpoints": ckpts,
            "cursor": {"offset": 0, "limit": len(ckpts), "total_count": len(ckpts)}}


@router.get("/training_runs/{run_id}")
async def training_run(run_id: str, ctx: Context) -> JSONResponse:
    """404 for an unknown run."""
    try:
        return JSONResponse(await asyncio.to_thread(ctx.engine.training_run, run_id))
    except UserError as e:
        return JSONResponse(status_code=404, content={"detail": str(e)})
