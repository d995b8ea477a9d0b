"""The FastAPI application: the Tinker endpoints of SDK 0.38.0 on top of `Engine`.

Request bodies are read as plain JSON (or protobuf for ``forward_backward``) and validated
here, never bound to the SDK's own request types (they changed shape across SDK versions).
Mutating calls return an ``UntypedAPIFuture`` at once; their work runs on the `Worker`, one
job at a time, training requests released per model in ``seq_id`` order by `SeqOrderer`.
Failures are stored as ``{"error", "category"}`` results, which the SDK raises as
``RequestFailedError`` (``category`` is ``user`` for bad input).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from rlscope.serve import checkpoints
from rlscope.serve.config import ServeConfig
from rlscope.serve.engine import Engine
from rlscope.serve.futures import FutureStore, Result, SeqConflictError, SeqOrderer, body_digest
from rlscope.serve.sampling import parse_sample_request
from rlscope.serve.state import UserError
from rlscope.serve.wire import (
    WireError,
    decode_forward_backward,
    tokens_from_model_input,
)
from rlscope.serve.worker import Job, SampleJob, Worker

log = logging.getLogger("rlscope.serve")

TESTED_SDK = "0.38.0"
PROTO = "application/x-protobuf"


def _future(request_id: str, model_id: str | None = None,
            sample_sequence_ids: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"request_id": request_id}
    if model_id is not None:
        out["model_id"] = model_id
    if sample_sequence_ids is not None:
        out["sample_sequence_ids"] = sample_sequence_ids
    return out


def _as_result(run: Callable[[], dict[str, Any] | bytes]) -> Callable[[], Result]:
    """``run`` with its output wrapped as a `Result` (bytes are protobuf, dicts JSON)."""

    def wrapped() -> Result:
        out = run()
        return Result(proto=out) if isinstance(out, bytes) else Result(json=out)

    return wrapped


def create_app(cfg: ServeConfig, engine: Engine | None = None) -> FastAPI:
    """The application for ``cfg`` (its engine is built here unless given)."""
    engine = engine if engine is not None else Engine(cfg)
    store = FutureStore()
    orderer = SeqOrderer(cfg.seq_gap_timeout_s)
    worker = Worker(engine, store)
    create_keys: dict[tuple[str, int], str] = {}
    keys_lock = threading.Lock()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        worker.start()

        async def release_gaps() -> None:
            while True:
                await asyncio.sleep(1.0)
                orderer.release_stale()

        task = asyncio.create_task(release_gaps())
        try:
            yield
        finally:
            task.cancel()
            await asyncio.to_thread(worker.stop)
            engine.close()

    app = FastAPI(title="rlscope serve (Tinker protocol)", lifespan=lifespan)
    app.state.engine = engine
    app.state.store = store
    app.state.worker = worker

    def fail_now(kind: str, error: str, category: str = "user",
                 model_id: str | None = None) -> dict[str, Any]:
        request_id = store.create(kind)
        store.set_result(request_id, Result.failed(error, category))
        return _future(request_id, model_id)

    def submit(kind: str, run: Callable[[], dict[str, Any] | bytes]) -> str:
        request_id = store.create(kind)
        worker.put(Job(request_id, _as_result(run)))
        return request_id

    def submit_ordered(kind: str, model_id: str, seq_id: int, body: bytes,
                       run: Callable[[], dict[str, Any] | bytes]) -> dict[str, Any]:
        if model_id not in engine.models:
            return fail_now(kind, f"unknown model_id {model_id!r}", model_id=model_id)
        digest = body_digest(body)
        try:
            existing = orderer.lookup(model_id, seq_id, digest) if seq_id > 0 else None
        except SeqConflictError as e:
            return fail_now(kind, str(e), model_id=model_id)
        if existing is not None:
            return _future(existing, model_id)
        request_id = store.create(kind)
        job = Job(request_id, _as_result(run))
        try:
            answer = orderer.submit(model_id, seq_id, digest, request_id,
                                    lambda: worker.put(job))
        except SeqConflictError as e:
            store.set_result(request_id, Result.failed(str(e), "user"))
            answer = request_id
        return _future(answer, model_id)

    async def json_body(request: Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise UserError("the request body must be a JSON object")
        return body

    @app.exception_handler(UserError)
    async def user_error(_: Request, exc: UserError) -> JSONResponse:
        return JSONResponse(status_code=400, content={"detail": str(exc)})

    # ------------------------------------------------------------------ session

    @app.post("/api/v1/client/config")
    async def client_config() -> dict[str, Any]:
        out: dict[str, Any] = {"pjwt_auth_enabled": False, "use_pyqwest_transport": False}
        if cfg.fwdbwd_max_chunk_len:
            out["fwdbwd_max_chunk_len"] = cfg.fwdbwd_max_chunk_len
        return out

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config() -> dict[str, Any]:
        return {}

    @app.post("/api/v1/create_session")
    async def create_session(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        out: dict[str, Any] = {"type": "create_session", "session_id": uuid.uuid4().hex[:16]}
        version = str(body.get("sdk_version", ""))
        if version and version != TESTED_SDK:
            out["warning_message"] = (f"rlscope serve was tested with tinker {TESTED_SDK}; "
                                      f"this client is {version}")
        return out

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat() -> dict[str, Any]:
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/telemetry")
    async def telemetry() -> dict[str, Any]:
        return {"status": "accepted"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str) -> Response:
        log.info("session %s finished", session_id)
        await asyncio.to_thread(engine.finish_session, session_id)
        return Response(status_code=200)

    @app.get("/api/v1/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok"}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities() -> dict[str, Any]:
        return {"supported_models": engine.capabilities()}

    # ------------------------------------------------------------------ futures

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        body = await json_body(request)
        request_id = str(body.get("request_id", ""))
        if not store.known(request_id):
            return JSONResponse({"error": f"unknown request_id {request_id!r}",
                                 "category": "user"})
        result = await store.wait(request_id, cfg.long_poll_s)
        if result is None:
            return JSONResponse(status_code=408, content={
                "type": "try_again", "request_id": request_id, "queue_state": "active"})
        if result.error is not None:
            return JSONResponse({"error": result.error, "category": result.category})
        if result.proto is not None:
            return Response(content=result.proto, media_type=PROTO)
        return JSONResponse(result.json)

    # ------------------------------------------------------------------ training

    @app.post("/api/v1/create_model")
    async def create_model(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        session_id = str(body.get("session_id", ""))
        model_seq_id = int(body.get("model_seq_id", 0))
        key = (session_id, model_seq_id)
        with keys_lock:
            if key in create_keys:
                return _future(create_keys[key])
            base_model = str(body.get("base_model", ""))
            lora = body.get("lora_config") or {}
            optimizer = (body.get("optimizer_config") or {}).get("type", "adamw")
            if optimizer != "adamw":
                return fail_now("CreateModel", f"optimizer {optimizer!r} is not supported "
                                "(adamw only)")
            request_id = submit("CreateModel", lambda: engine.create_model(
                session_id, model_seq_id, base_model, lora, body.get("user_metadata")))
            create_keys[key] = request_id
        return _future(request_id, f"{session_id}:train:{model_seq_id}")

    @app.post("/api/v1/get_info")
    async def get_info(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        return await asyncio.to_thread(engine.get_info, str(body.get("model_id", "")))

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> dict[str, Any]:
        raw = await request.body()
        if request.headers.get("content-encoding", "").lower() == "zstd":
            import zstandard

            raw = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
        try:
            req = decode_forward_backward(raw)
        except WireError as e:
            return fail_now("ForwardBackward", str(e))
        kind = "Forward" if req.forward_only else "ForwardBackward"
        return submit_ordered(kind, req.model_id, req.seq_id, raw,
                              lambda: engine.forward_backward(req))

    @app.post("/api/v1/forward")
    async def forward_legacy() -> JSONResponse:
        return JSONResponse(status_code=410, content={
            "detail": "/api/v1/forward was removed in tinker 0.25; upgrade the SDK"})

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request) -> dict[str, Any]:
        raw = await request.body()
        body = await json_body(request)
        model_id = str(body.get("model_id", ""))
        adam = body.get("adam_params") or body.get("optim_params")
        if adam is None:
            return fail_now("OptimStep", "optim_step needs adam_params (only AdamW is "
                            "supported)", model_id=model_id)
        return submit_ordered("OptimStep", model_id, int(body.get("seq_id") or 0), raw,
                              lambda: engine.optim_step(model_id, adam))

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request) -> dict[str, Any]:
        raw = await request.body()
        body = await json_body(request)
        model_id = str(body.get("model_id", ""))
        name = str(body.get("path") or "")
        return submit_ordered("SaveWeights", model_id, int(body.get("seq_id") or 0), raw,
                              lambda: engine.save_weights(model_id, name))

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_weights_for_sampler(request: Request) -> dict[str, Any]:
        raw = await request.body()
        body = await json_body(request)
        model_id = str(body.get("model_id", ""))
        name = body.get("path")
        if body.get("kind", "snapshot") != "snapshot":
            return fail_now("SaveWeightsForSampler", f"kind {body.get('kind')!r} is not "
                            "supported (snapshot only)", model_id=model_id)
        return submit_ordered(
            "SaveWeightsForSampler", model_id, int(body.get("seq_id") or 0), raw,
            lambda: engine.save_weights_for_sampler(model_id, None if name is None
                                                    else str(name)))

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request) -> dict[str, Any]:
        raw = await request.body()
        body = await json_body(request)
        path = str(body.get("path", ""))
        optimizer = bool(body.get("optimizer", False))
        model_id = body.get("model_id")
        if model_id is not None:
            return submit_ordered("LoadWeights", str(model_id), int(body.get("seq_id") or 0),
                                  raw, lambda: engine.load_weights(path, optimizer,
                                                                   model_id=str(model_id)))
        session_id = str(body.get("session_id", ""))
        model_seq_id = int(body.get("model_seq_id", 0))
        key = (session_id, model_seq_id)
        with keys_lock:
            if key in create_keys:
                return _future(create_keys[key])
            request_id = submit("LoadWeights", lambda: engine.load_weights(
                path, optimizer, session_id=session_id, model_seq_id=model_seq_id,
                user_metadata=body.get("user_metadata")))
            create_keys[key] = request_id
        return _future(request_id, f"{session_id}:train:{model_seq_id}")

    # ------------------------------------------------------------------ sampling

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        return await asyncio.to_thread(engine.create_sampling_session,
                                       body.get("model_path"), body.get("base_model"))

    @app.get("/api/v1/samplers/{sampler_id:path}")
    async def get_sampler(sampler_id: str) -> dict[str, Any]:
        return engine.get_sampler(sampler_id)

    @app.post("/api/v1/asample")
    async def asample(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        num = max(int(body.get("num_samples", 1)), 1)
        try:
            sampler_id = body.get("sampling_session_id")
            if sampler_id is not None:
                weights = engine.sampler(str(sampler_id))
            elif body.get("model_path"):
                weights = await asyncio.to_thread(engine.weights_for_path,
                                                  str(body["model_path"]))
            else:
                raise UserError("asample needs a sampling_session_id")
            prompt = tokens_from_model_input(body.get("prompt"))
            parsed = parse_sample_request(body, weights.codec.eos_token_id,
                                          weights.policy.vocab_size, weights.policy.max_len,
                                          prompt)
        except (UserError, WireError, ValueError, TypeError) as e:
            out = fail_now("Sample", str(e))
            out["sample_sequence_ids"] = [f"{out['request_id']}:{i}" for i in range(num)]
            return out
        request_id = store.create("Sample")
        worker.put(SampleJob(request_id, weights, parsed))
        return _future(request_id, sample_sequence_ids=[f"{request_id}:{i}"
                                                        for i in range(num)])

    # ------------------------------------------------------------------ REST

    @app.get("/api/v1/training_runs")
    async def training_runs() -> dict[str, Any]:
        runs = checkpoints.list_runs(engine.root)
        return {"training_runs": runs,
                "cursor": {"offset": 0, "limit": len(runs), "total_count": len(runs)}}

    @app.get("/api/v1/training_runs/{run_id}/checkpoints")
    async def run_checkpoints(run_id: str) -> dict[str, Any]:
        ckpts = checkpoints.list_checkpoints(engine.root, run_id)
        return {"checkpoints": ckpts,
                "cursor": {"offset": 0, "limit": len(ckpts), "total_count": len(ckpts)}}

    @app.get("/api/v1/training_runs/{run_id}")
    async def training_run(run_id: str) -> JSONResponse:
        try:
            return JSONResponse(engine.training_run(run_id))
        except UserError as e:
            return JSONResponse(status_code=404, content={"detail": str(e)})

    return app
