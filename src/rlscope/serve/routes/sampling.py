"""Sampling endpoints (TINKER_PROTOCOL.md §1.5, "Sampling"): ``create_sampling_session``,
``samplers/{id}``, and ``asample``, validated here and batched by the worker."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import APIRouter

from rlscope.serve import checkpoints
from rlscope.serve.context import Context, future
from rlscope.serve.http import JsonBody
from rlscope.serve.sampling import parse_sample_request
from rlscope.serve.state import UserError
from rlscope.serve.validate import get_int, get_str
from rlscope.serve.wire import WireError, tokens_from_model_input
from rlscope.serve.worker import SampleJob

router = APIRouter(prefix="/api/v1")
log = logging.getLogger("rlscope.serve")

_CLAMP_WARNED: set[str] = set()
"""Sampling sessions already warned that their ``max_tokens`` was clamped to the context (one
warning per session, so a recipe sampling thousands of times does not flood the log)."""
MAX_CLAMP_WARNED = 10_000


@router.post("/create_sampling_session")
async def create_sampling_session(body: JsonBody, ctx: Context) -> dict[str, Any]:
    model_path = get_str(body, "model_path", None)
    if model_path:
        checkpoints.parse_tinker_path(model_path)
    return await asyncio.to_thread(ctx.engine.create_sampling_session, model_path,
                                   get_str(body, "base_model", None))


@router.get("/samplers/{sampler_id:path}")
async def get_sampler(sampler_id: str, ctx: Context) -> dict[str, Any]:
    return ctx.engine.get_sampler(sampler_id)


@router.post("/asample")
async def asample(body: JsonBody, ctx: Context) -> dict[str, Any]:
    """A future with one ``sample_sequence_id`` per sample; the result is a protobuf
    ``SampleResponse``."""
    get_int(body, "num_samples", 1, lo=1, hi=ctx.cfg.max_num_samples)
    sampler_id = get_str(body, "sampling_session_id", None)
    model_path = get_str(body, "model_path", None)
    if sampler_id is not None:
        weights = ctx.engine.sampler(sampler_id)
    elif model_path:
        checkpoints.parse_tinker_path(model_path)
        weights = await asyncio.to_thread(ctx.engine.weights_for_path, model_path)
    else:
        raise UserError("asample needs a sampling_session_id")
    try:
        prompt = tokens_from_model_input(body.get("prompt"))
    except WireError as e:
        raise UserError(f"field 'prompt': {e}") from e
    parsed = parse_sample_request(body, weights.codec.eos_token_id, weights.policy.vocab_size,
                                  weights.policy.max_len, prompt, ctx.limits)
    requested = parsed["max_tokens_requested"]
    client = sampler_id or model_path or ""
    if requested is not None and parsed["max_tokens"] < requested \
            and client not in _CLAMP_WARNED:
        if len(_CLAMP_WARNED) >= MAX_CLAMP_WARNED:
            _CLAMP_WARNED.clear()
        _CLAMP_WARNED.add(client)
        log.warning("sampling session %s: max_tokens=%d does not fit the model's %d positions "
                    "after a %d-token prompt; sampling at most %d tokens (stop_reason 'length' "
                    "at the limit; raise --tiny_max_len for the tiny models). Warned once per "
                    "session.", client, requested, weights.policy.max_len, len(prompt),
                    parsed["max_tokens"])
    request_id = ctx.store.create("Sample")
    ctx.worker.put(SampleJob(request_id, weights, parsed, client))
    return future(request_id, sample_sequence_ids=[f"{request_id}:{i}"
                                                   for i in range(parsed["num_samples"])])
