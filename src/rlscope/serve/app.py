"""The FastAPI application: the Tinker endpoints of SDK 0.38.0 on top of `Engine`.

Request bodies are read as plain JSON (or protobuf for ``forward_backward``) and validated
here, never bound to the SDK's own request types (they changed shape across SDK versions).
Mutating calls return an ``UntypedAPIFuture`` at once; their work runs on the `Worker`, one
job at a time, training requests released per model in ``seq_id`` order by `SeqOrderer`.
Failures are stored as ``{"error", "category"}`` results, which the SDK raises as
``RequestFailedError`` (``category`` is ``user`` for bad input).

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
import hmac
import json
import logging
import re
import threading
import uuid
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from rlscope.serve import checkpoints
from rlscope.serve.config import ServeConfig
from rlscope.serve.engine import Engine
from rlscope.serve.futures import (
    FutureStore,
    Result,
    SeqConflictError,
    SeqOrderer,
    StoreFullError,
    body_digest,
)
from rlscope.serve.sampling import SampleLimits, parse_sample_request
from rlscope.serve.state import UserError
from rlscope.serve.validate import (
    get_bool,
    get_dict,
    get_float,
    get_int,
    get_str,
    str_dict,
)
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


class PayloadTooLargeError(ValueError):
    """A request body over ``--max_body_bytes``, or inflating past ``--max_decompressed_bytes``
    (answered 413)."""


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = ("/api/v1/healthz",)
MAX_CREATE_KEYS = 100_000
SESSION_ID = re.compile(r"[A-Za-z0-9_:-][A-Za-z0-9._:-]{0,127}")
"""Paths answered without an API key."""


async def _send_json(send: Send, status: int, content: dict[str, Any]) -> None:
    body = json.dumps(content).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class GuardMiddleware:
    """ASGI middleware in front of every endpoint: the API key (401) and a declared
    ``Content-Length`` over the body cap (413), both before the body is read."""

    def __init__(self, app: ASGIApp, api_key: str, max_body_bytes: int) -> None:
        self.app = app
        self.api_key = api_key.encode()
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if self.api_key and scope.get("path") not in OPEN_PATHS:
            given = headers.get(b"x-api-key", b"")
            if not hmac.compare_digest(given, self.api_key):
                await _send_json(send, 401, {"detail": "missing or wrong X-API-Key (start the "
                                             "SDK with this server's api_key)"})
                return
        length = headers.get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await _send_json(send, 400, {"detail": "invalid Content-Length"})
                return
            if declared > self.max_body_bytes:
                await _send_json(send, 413, {"detail": f"request body of {declared} bytes "
                                             f"exceeds the cap of {self.max_body_bytes} "
                                             "(--max_body_bytes)"})
                return
        await self.app(scope, receive, send)


def decompress(raw: bytes, encoding: str, limit: int) -> bytes:
    """``raw`` decoded from ``Content-Encoding`` ``encoding`` (identity, zstd, gzip), streamed
    in bounded pieces: raises `PayloadTooLargeError` as soon as the output passes ``limit``
    bytes (so a small bomb never allocates more than about ``limit``), `UserError` for a corrupt
    stream or an unknown encoding."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    out = bytearray()
    piece = 1 << 20
    try:
        if encoding == "zstd":
            import zstandard

            reader = zstandard.ZstdDecompressor().stream_reader(raw)
            while chunk := reader.read(piece):
                out += chunk
                if len(out) > limit:
                    break
        elif encoding in ("gzip", "x-gzip", "deflate"):
            d = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding != "deflate" else 0)
            data = raw
            while data and len(out) <= limit:
                out += d.decompress(data, piece)
                data = d.unconsumed_tail
            if len(out) <= limit:
                out += d.flush(piece)
        else:
            raise UserError(f"Content-Encoding {encoding!r} is not supported (zstd, gzip)")
    except (zlib.error, ValueError) as e:
        if isinstance(e, UserError):
            raise
        raise UserError(f"the {encoding} request body is corrupt: {e}") from e
    except Exception as e:  # zstandard raises its own ZstdError
        raise UserError(f"the {encoding} request body is corrupt: {type(e).__name__}") from e
    if len(out) > limit:
        raise PayloadTooLargeError(f"the request body inflates past the cap of {limit} bytes "
                                   "(--max_decompressed_bytes)")
    return bytes(out)


def _as_result(run: Callable[[], dict[str, Any] | bytes]) -> Callable[[], Result]:
    """``run`` with its output wrapped as a `Result` (bytes are protobuf, dicts JSON)."""

    def wrapped() -> Result:
        out = run()
        return Result(proto=out) if isinstance(out, bytes) else Result(json=out)

    return wrapped


def create_app(cfg: ServeConfig, engine: Engine | None = None) -> FastAPI:
    """The application for ``cfg`` (its engine is built here unless given)."""
    engine = engine if engine is not None else Engine(cfg)
    store = FutureStore(cfg.future_ttl_s, cfg.retrieved_ttl_s, cfg.max_futures)
    orderer = SeqOrderer(cfg.seq_gap_timeout_s)
    worker = Worker(engine, store)
    create_keys: OrderedDict[tuple[str, int], str] = OrderedDict()
    """(session, model_seq_id) → the request that creates that client (retries get it back);
    the oldest are forgotten past `MAX_CREATE_KEYS`."""
    keys_lock = threading.Lock()
    limits = SampleLimits(cfg.max_num_samples, cfg.max_sample_tokens, cfg.max_batch_tokens)

    def begin_shutdown() -> None:
        """Stop taking work and fail every queued or pending request at once, so long polls
        answer now (called on SIGTERM/SIGINT before uvicorn drains connections)."""
        worker.queue.close()
        failed = store.fail_pending("the server is shutting down; the request was not run")
        log.info("shutting down: %d pending request(s) failed", failed)

    warm = threading.Event()

    def warm_up() -> Result:
        try:
            engine.warm_up()
        finally:
            warm.set()
        return Result(json={})

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        worker.put(Job(store.create("WarmUp"), warm_up, ""))
        worker.start()

        async def housekeeping() -> None:
            while True:
                await asyncio.sleep(1.0)
                orderer.release_stale()
                store.evict()

        task = asyncio.create_task(housekeeping())
        try:
            yield
        finally:
            task.cancel()
            begin_shutdown()
            if not await asyncio.to_thread(worker.stop, cfg.shutdown_timeout_s / 2):
                log.warning("the running job did not finish within %.0f s; exiting anyway",
                            cfg.shutdown_timeout_s / 2)
            engine.close()

    app = FastAPI(title="rlscope serve (Tinker protocol)", lifespan=lifespan)
    app.add_middleware(GuardMiddleware, api_key=cfg.resolved_api_key(),  # type: ignore[arg-type]
                       max_body_bytes=cfg.max_body_bytes)
    app.state.engine = engine
    app.state.store = store
    app.state.worker = worker
    app.state.begin_shutdown = begin_shutdown
    app.state.warm = warm

    def fail_now(kind: str, error: str, category: str = "user",
                 model_id: str | None = None) -> dict[str, Any]:
        request_id = store.create(kind)
        store.set_result(request_id, Result.failed(error, category))
        return _future(request_id, model_id)

    def submit(kind: str, run: Callable[[], dict[str, Any] | bytes], client: str) -> str:
        request_id = store.create(kind)
        worker.put(Job(request_id, _as_result(run), client))
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
        job = Job(request_id, _as_result(run), model_id)
        try:
            answer = orderer.submit(model_id, seq_id, digest, request_id,
                                    lambda: worker.put(job))
        except SeqConflictError as e:
            store.set_result(request_id, Result.failed(str(e), "user"))
            answer = request_id
        return _future(answer, model_id)

    async def read_body(request: Request) -> bytes:
        """The body, read as a stream that stops at ``--max_body_bytes`` (a chunked body has
        no Content-Length for the middleware to check), then decompressed with a cap."""
        cached = getattr(request.state, "raw_body", None)
        if cached is not None:
            return bytes(cached)
        buf = bytearray()
        async for chunk in request.stream():
            buf += chunk
            if len(buf) > cfg.max_body_bytes:
                raise PayloadTooLargeError(f"request body exceeds the cap of "
                                           f"{cfg.max_body_bytes} bytes (--max_body_bytes)")
        raw = decompress(bytes(buf), request.headers.get("content-encoding", ""),
                         cfg.max_decompressed_bytes)
        request.state.raw_body = raw
        return raw

    async def json_body(request: Request) -> dict[str, Any]:
        raw = await read_body(request)
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise UserError("the request body must be a JSON object")
        return body

    def session_of(body: dict[str, Any]) -> str:
        """``session_id``: it becomes part of model ids and ``tinker://`` paths, so only
        ``A-Za-z0-9._:-`` (no ``/``), at most 128 characters."""
        session_id: str = get_str(body, "session_id", max_chars=128)
        if not SESSION_ID.fullmatch(session_id):
            raise UserError(f"field 'session_id' must be 1-128 characters of A-Za-z0-9._:- "
                            f"not starting with '.', got {session_id[:40]!r}")
        return session_id

    def seq_id_of(body: dict[str, Any]) -> int:
        return int(get_int(body, "seq_id", 0, lo=0) or 0)

    @app.exception_handler(UserError)
    async def user_error(_: Request, exc: UserError) -> JSONResponse:
        return JSONResponse(status_code=400, content={"detail": str(exc)})

    @app.exception_handler(PayloadTooLargeError)
    async def too_large(_: Request, exc: PayloadTooLargeError) -> JSONResponse:
        return JSONResponse(status_code=413, content={"detail": str(exc)},
                            headers={"connection": "close"})

    @app.exception_handler(StoreFullError)
    async def store_full(_: Request, exc: StoreFullError) -> JSONResponse:
        return JSONResponse(status_code=429, content={"detail": str(exc)},
                            headers={"retry-after": "2"})

    @app.exception_handler(Exception)
    async def internal(_: Request, exc: Exception) -> JSONResponse:
        log.error("internal error: %s: %s", type(exc).__name__, exc)
        return JSONResponse(status_code=500, content={"detail": "internal server error"})

    # ------------------------------------------------------------------ session

    @app.post("/api/v1/client/config")
    async def client_config(request: Request) -> dict[str, Any]:
        await json_body(request)
        # the transport is left to the SDK (its default, pyqwest): see docs/tinker.md
        out: dict[str, Any] = {"pjwt_auth_enabled": False}
        if cfg.fwdbwd_max_chunk_len:
            out["fwdbwd_max_chunk_len"] = cfg.fwdbwd_max_chunk_len
        return out

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config(request: Request) -> dict[str, Any]:
        await json_body(request)
        return {}

    @app.post("/api/v1/create_session")
    async def create_session(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        out: dict[str, Any] = {"type": "create_session", "session_id": uuid.uuid4().hex[:16]}
        version = get_str(body, "sdk_version", "", max_chars=64)
        if version and version != TESTED_SDK:
            out["warning_message"] = (f"rlscope serve was tested with tinker {TESTED_SDK}; "
                                      f"this client is {version}")
        return out

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request) -> dict[str, Any]:
        await read_body(request)
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/telemetry")
    async def telemetry(request: Request) -> dict[str, Any]:
        await read_body(request)
        return {"status": "accepted"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str, request: Request) -> Response:
        await read_body(request)
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
        request_id = get_str(body, "request_id", max_chars=64)
        get_bool(body, "allow_metadata_only", False)
        if not store.known(request_id):
            return JSONResponse({"error": f"unknown or expired request_id {request_id!r}",
                                 "category": "user"})
        try:
            result = await store.wait(request_id, cfg.long_poll_s)
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

    # ------------------------------------------------------------------ training

    @app.post("/api/v1/create_model")
    async def create_model(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        session_id = session_of(body)
        model_seq_id = get_int(body, "model_seq_id", 0, lo=0)
        base_model = get_str(body, "base_model")
        lora = _lora_config(get_dict(body, "lora_config", None) or {})
        metadata = str_dict(body.get("user_metadata"), "user_metadata")
        optimizer = get_str(get_dict(body, "optimizer_config", None) or {}, "type", "adamw")
        key = (session_id, model_seq_id)
        with keys_lock:
            if key in create_keys:
                return _future(create_keys[key])
            if optimizer != "adamw":
                return fail_now("CreateModel", f"optimizer {optimizer!r} is not supported "
                                "(adamw only)")
            request_id = submit("CreateModel", lambda: engine.create_model(
                session_id, model_seq_id, base_model, lora, metadata), session_id)
            create_keys[key] = request_id
            while len(create_keys) > MAX_CREATE_KEYS:
                create_keys.popitem(last=False)
        return _future(request_id, f"{session_id}:train:{model_seq_id}")

    @app.post("/api/v1/get_info")
    async def get_info(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        return await asyncio.to_thread(engine.get_info, get_str(body, "model_id"))

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> dict[str, Any]:
        raw = await read_body(request)
        try:
            req = decode_forward_backward(raw)
        except WireError as e:
            raise UserError(str(e)) from e
        tokens = sum(len(d.tokens) for d in req.data)
        if tokens > cfg.max_batch_tokens:
            raise UserError(f"forward_backward carries {tokens} tokens, over this server's cap "
                            f"of {cfg.max_batch_tokens} (--max_batch_tokens); send fewer "
                            "datums per request")
        kind = "Forward" if req.forward_only else "ForwardBackward"
        return submit_ordered(kind, req.model_id, req.seq_id, raw,
                              lambda: engine.forward_backward(req))

    @app.post("/api/v1/forward")
    async def forward_legacy() -> JSONResponse:
        return JSONResponse(status_code=410, content={
            "detail": "/api/v1/forward was removed in tinker 0.25; upgrade the SDK"})

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request) -> dict[str, Any]:
        raw = await read_body(request)
        body = await json_body(request)
        model_id = get_str(body, "model_id")
        seq_id = seq_id_of(body)
        adam = get_dict(body, "adam_params", None) or get_dict(body, "optim_params", None)
        if adam is None:
            return fail_now("OptimStep", "optim_step needs adam_params (only AdamW is "
                            "supported)", model_id=model_id)
        adam = _adam_params(adam)
        return submit_ordered("OptimStep", model_id, seq_id, raw,
                              lambda: engine.optim_step(model_id, adam))

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request) -> dict[str, Any]:
        raw = await read_body(request)
        body = await json_body(request)
        model_id = get_str(body, "model_id")
        name = checkpoints.checkpoint_name(get_str(body, "path"))
        return submit_ordered("SaveWeights", model_id, seq_id_of(body), raw,
                              lambda: engine.save_weights(model_id, name))

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_weights_for_sampler(request: Request) -> dict[str, Any]:
        raw = await read_body(request)
        body = await json_body(request)
        model_id = get_str(body, "model_id")
        name = get_str(body, "path", None)
        if name is not None:
            checkpoints.checkpoint_name(name)
        kind = get_str(body, "kind", "snapshot")
        if kind != "snapshot":
            return fail_now("SaveWeightsForSampler", f"kind {kind!r} is not "
                            "supported (snapshot only)", model_id=model_id)
        return submit_ordered(
            "SaveWeightsForSampler", model_id, seq_id_of(body), raw,
            lambda: engine.save_weights_for_sampler(model_id, name))

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request) -> dict[str, Any]:
        raw = await read_body(request)
        body = await json_body(request)
        path = get_str(body, "path")
        checkpoints.parse_tinker_path(path)
        optimizer = bool(get_bool(body, "optimizer", False))
        model_id = get_str(body, "model_id", None)
        if model_id is not None:
            return submit_ordered("LoadWeights", model_id, seq_id_of(body),
                                  raw, lambda: engine.load_weights(path, optimizer,
                                                                   model_id=model_id))
        session_id = session_of(body)
        model_seq_id = get_int(body, "model_seq_id", 0, lo=0)
        metadata = body.get("user_metadata")
        metadata = None if metadata is None else str_dict(metadata, "user_metadata")
        key = (session_id, model_seq_id)
        with keys_lock:
            if key in create_keys:
                return _future(create_keys[key])
            request_id = submit("LoadWeights", lambda: engine.load_weights(
                path, optimizer, session_id=session_id, model_seq_id=model_seq_id,
                user_metadata=metadata), session_id)
            create_keys[key] = request_id
            while len(create_keys) > MAX_CREATE_KEYS:
                create_keys.popitem(last=False)
        return _future(request_id, f"{session_id}:train:{model_seq_id}")

    # ------------------------------------------------------------------ sampling

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        model_path = get_str(body, "model_path", None)
        if model_path:
            checkpoints.parse_tinker_path(model_path)
        return await asyncio.to_thread(engine.create_sampling_session, model_path,
                                       get_str(body, "base_model", None))

    @app.get("/api/v1/samplers/{sampler_id:path}")
    async def get_sampler(sampler_id: str) -> dict[str, Any]:
        return engine.get_sampler(sampler_id)

    @app.post("/api/v1/asample")
    async def asample(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        get_int(body, "num_samples", 1, lo=1, hi=cfg.max_num_samples)
        sampler_id = get_str(body, "sampling_session_id", None)
        model_path = get_str(body, "model_path", None)
        if sampler_id is not None:
            weights = engine.sampler(sampler_id)
        elif model_path:
            checkpoints.parse_tinker_path(model_path)
            weights = await asyncio.to_thread(engine.weights_for_path, model_path)
        else:
            raise UserError("asample needs a sampling_session_id")
        try:
            prompt = tokens_from_model_input(body.get("prompt"))
        except WireError as e:
            raise UserError(f"field 'prompt': {e}") from e
        parsed = parse_sample_request(body, weights.codec.eos_token_id,
                                      weights.policy.vocab_size, weights.policy.max_len,
                                      prompt, limits)
        num = parsed["num_samples"]
        request_id = store.create("Sample")
        worker.put(SampleJob(request_id, weights, parsed, sampler_id or model_path or ""))
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


def _lora_config(lora: dict[str, Any]) -> dict[str, Any]:
    """``lora_config`` with every field type-checked (rank 0 = full fine-tuning)."""
    return {"rank": get_int(lora, "rank", 32, lo=0, hi=4096),
            "seed": get_int(lora, "seed", None),
            "train_attn": get_bool(lora, "train_attn", True),
            "train_mlp": get_bool(lora, "train_mlp", True),
            "train_unembed": get_bool(lora, "train_unembed", True)}


def _adam_params(adam: dict[str, Any]) -> dict[str, float]:
    """``adam_params`` with every field a finite number in range."""
    return {"learning_rate": get_float(adam, "learning_rate", 1e-4, lo=0.0),
            "beta1": get_float(adam, "beta1", 0.9, lo=0.0, hi=0.999999),
            "beta2": get_float(adam, "beta2", 0.95, lo=0.0, hi=0.999999),
            "eps": get_float(adam, "eps", 1e-12, lo=0.0),
            "weight_decay": get_float(adam, "weight_decay", 0.0, lo=0.0),
            "grad_clip_norm": get_float(adam, "grad_clip_norm", 0.0, lo=0.0)}
