"""Training-model endpoints (TINKER_PROTOCOL.md §1.5, "Training model"): create a training
client (``create_model``, or ``load_weights`` without a ``model_id``), ``get_info``, and the
``seq_id``-ordered calls on a model: ``forward_backward``, ``optim_step``, ``save_weights``,
``save_weights_for_sampler``, ``load_weights``."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from rlscope.serve import checkpoints
from rlscope.serve.context import Context
from rlscope.serve.http import JsonBody, RawBody
from rlscope.serve.state import UserError
from rlscope.serve.validate import get_bool, get_dict, get_float, get_int, get_str, str_dict
from rlscope.serve.wire import WireError, decode_forward_backward

SESSION_ID = re.compile(r"[A-Za-z0-9_:-][A-Za-z0-9._:-]{0,127}")
"""A ``session_id`` this server accepts (`session_of`)."""

SEED_RANGE = (-(2**63), 2**64 - 1)
"""The seeds ``torch.Generator.manual_seed`` takes (a LoRA ``seed`` outside it is a 400, not a
failed build)."""

router = APIRouter(prefix="/api/v1")


def session_of(body: dict[str, Any]) -> str:
    """``session_id``: it becomes part of model ids and ``tinker://`` paths, so only
    ``A-Za-z0-9._:-`` (no ``/``), at most 128 characters."""
    session_id: str = get_str(body, "session_id", max_chars=128)
    if not SESSION_ID.fullmatch(session_id):
        raise UserError(f"field 'session_id' must be 1-128 characters of A-Za-z0-9._:- "
                        f"not starting with '.', got {session_id[:40]!r}")
    return session_id


def seq_id_of(body: dict[str, Any]) -> int:
    """``seq_id`` (0 when absent: unordered)."""
    return int(get_int(body, "seq_id", 0, lo=0) or 0)


def lora_config(lora: dict[str, Any]) -> dict[str, Any]:
    """``lora_config`` with every field type-checked (rank 0 = full fine-tuning)."""
    return {"rank": get_int(lora, "rank", 32, lo=0, hi=4096),
            "seed": get_int(lora, "seed", None, lo=SEED_RANGE[0], hi=SEED_RANGE[1]),
            "train_attn": get_bool(lora, "train_attn", True),
            "train_mlp": get_bool(lora, "train_mlp", True),
            "train_unembed": get_bool(lora, "train_unembed", True)}


def adam_params(adam: dict[str, Any]) -> dict[str, float]:
    """``adam_params`` with every field a finite number in range."""
    return {"learning_rate": get_float(adam, "learning_rate", 1e-4, lo=0.0),
            "beta1": get_float(adam, "beta1", 0.9, lo=0.0, hi=0.999999),
            "beta2": get_float(adam, "beta2", 0.95, lo=0.0, hi=0.999999),
            "eps": get_float(adam, "eps", 1e-12, lo=0.0),
            "weight_decay": get_float(adam, "weight_decay", 0.0, lo=0.0),
            "grad_clip_norm": get_float(adam, "grad_clip_norm", 0.0, lo=0.0)}


@router.post("/create_model")
async def create_model(body: JsonBody, ctx: Context) -> dict[str, Any]:
    session_id = session_of(body)
    model_seq_id = get_int(body, "model_seq_id", 0, lo=0)
    base_model = get_str(body, "base_model")
    lora = lora_config(get_dict(body, "lora_config", None) or {})
    metadata = str_dict(body.get("user_metadata"), "user_metadata")
    optimizer = get_str(get_dict(body, "optimizer_config", None) or {}, "type", "adamw")
    refusal = (None if optimizer == "adamw"
               else f"optimizer {optimizer!r} is not supported (adamw only)")
    return ctx.create_client("CreateModel", session_id, model_seq_id, lambda: (
        ctx.engine.create_model(session_id, model_seq_id, base_model, lora, metadata)),
        refusal=refusal)


@router.post("/get_info")
async def get_info(body: JsonBody, ctx: Context) -> dict[str, Any]:
    return await asyncio.to_thread(ctx.engine.get_info, get_str(body, "model_id"))


@router.post("/forward_backward")
async def forward_backward(raw: RawBody, ctx: Context) -> dict[str, Any]:
    try:
        req = decode_forward_backward(raw)
    except WireError as e:
        raise UserError(str(e)) from e
    tokens = sum(len(d.tokens) for d in req.data)
    cap = ctx.cfg.max_batch_tokens
    if tokens > cap:
        raise UserError(f"forward_backward carries {tokens} tokens, over this server's cap "
                        f"of {cap} (--max_batch_tokens); send fewer datums per request")
    kind = "Forward" if req.forward_only else "ForwardBackward"
    return ctx.submit_ordered(kind, req.model_id, req.seq_id, raw,
                              lambda: ctx.engine.forward_backward(req))


@router.post("/forward")
async def forward_legacy() -> JSONResponse:
    return JSONResponse(status_code=410, content={
        "detail": "/api/v1/forward was removed in tinker 0.25; upgrade the SDK"})


@router.post("/optim_step")
async def optim_step(raw: RawBody, body: JsonBody, ctx: Context) -> dict[str, Any]:
    model_id = get_str(body, "model_id")
    seq_id = seq_id_of(body)
    adam = get_dict(body, "adam_params", None) or get_dict(body, "optim_params", None)
    if adam is None:
        return ctx.fail_now("OptimStep", "optim_step needs adam_params (only AdamW is "
                            "supported)", model_id=model_id)
    params = adam_params(adam)
    return ctx.submit_ordered("OptimStep", model_id, seq_id, raw,
                              lambda: ctx.engine.optim_step(model_id, params))


@router.post("/save_weights")
async def save_weights(raw: RawBody, body: JsonBody, ctx: Context) -> dict[str, Any]:
    model_id = get_str(body, "model_id")
    name = checkpoints.checkpoint_name(get_str(body, "path"))
    return ctx.submit_ordered("SaveWeights", model_id, seq_id_of(body), raw,
                              lambda: ctx.engine.save_weights(model_id, name))


@router.post("/save_weights_external")
async def save_weights_external(raw: RawBody, body: JsonBody, ctx: Context) -> dict[str, Any]:
    """The weights (LoRA merged in) as a Hugging Face directory; the result's path is
    ``tinker://<run>/external_weights/<name>``."""
    model_id = get_str(body, "model_id")
    name = checkpoints.checkpoint_name(get_str(body, "path"))
    get_int(body, "ttl_seconds", None, lo=0)
    # refused inside the ordered job (a failed future), so later seq_ids are not held up
    recipients = body.get("age_encryption_recipients")
    return ctx.submit_ordered("SaveWeightsExternal", model_id, seq_id_of(body), raw,
                              lambda: ctx.engine.save_weights_external(model_id, name,
                                                                       recipients))


@router.post("/save_weights_for_sampler")
async def save_weights_for_sampler(raw: RawBody, body: JsonBody,
                                   ctx: Context) -> dict[str, Any]:
    model_id = get_str(body, "model_id")
    name = get_str(body, "path", None)
    if name is not None:
        checkpoints.checkpoint_name(name)
    kind = get_str(body, "kind", "snapshot")
    if kind != "snapshot":
        return ctx.fail_now("SaveWeightsForSampler", f"kind {kind!r} is not supported "
                            "(snapshot only)", model_id=model_id)
    return ctx.submit_ordered("SaveWeightsForSampler", model_id, seq_id_of(body), raw,
                              lambda: ctx.engine.save_weights_for_sampler(model_id, name))


@router.post("/load_weights")
async def load_weights(raw: RawBody, body: JsonBody, ctx: Context) -> dict[str, Any]:
    """Into the model ``model_id`` (ordered like training calls), or into a new training
    client ``model_seq_id`` of ``session_id`` (created once, like ``create_model``)."""
    path = get_str(body, "path")
    checkpoints.parse_tinker_path(path)
    optimizer = bool(get_bool(body, "optimizer", False))
    model_id = get_str(body, "model_id", None)
    if model_id is not None:
        return ctx.submit_ordered("LoadWeights", model_id, seq_id_of(body), raw,
                                  lambda: ctx.engine.load_weights(path, optimizer,
                                                                  model_id=model_id))
    session_id = session_of(body)
    model_seq_id = get_int(body, "model_seq_id", 0, lo=0)
    metadata = body.get("user_metadata")
    metadata = None if metadata is None else str_dict(metadata, "user_metadata")
    return ctx.create_client("LoadWeights", session_id, model_seq_id, lambda: (
        ctx.engine.load_weights(path, optimizer, session_id=session_id,
                                model_seq_id=model_seq_id, user_metadata=metadata)))
