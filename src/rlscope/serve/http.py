"""The HTTP edge of `rlscope serve`, shared by the app and every router: the guard in front of
every endpoint, request bodies read with caps, and the mapping from errors to status codes.

- `GuardMiddleware`: with an API key every request but ``healthz`` needs ``X-API-Key`` (401
  otherwise, constant-time comparison); a declared ``Content-Length`` over ``--max_body_bytes``
  gets 413 before the body is read.
- `read_body` / `json_body` (FastAPI dependencies): the body read as a stream that stops at
  ``--max_body_bytes``, then decompressed (zstd, gzip) with `decompress`, which stops at
  ``--max_decompressed_bytes`` (413).
- `EXCEPTION_HANDLERS`: `UserError` → 400, `PayloadTooLargeError` → 413, `StoreFullError` →
  429, anything else → 500 with no traceback or server path.
"""

from __future__ import annotations

import hmac
import json
import logging
import zlib
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from starlette.responses import Response

from rlscope.serve.context import Context
from rlscope.serve.futures import StoreFullError
from rlscope.serve.state import UserError

log = logging.getLogger("rlscope.serve")

PROTO = "application/x-protobuf"
OPEN_PATHS = ("/api/v1/healthz",)
"""Paths answered without an API key."""


class PayloadTooLargeError(ValueError):
    """A request body over ``--max_body_bytes``, or inflating past ``--max_decompressed_bytes``
    (answered 413)."""


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


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


async def read_body(request: Request, ctx: Context) -> bytes:
    """The body, read as a stream that stops at ``--max_body_bytes`` (a chunked body has no
    Content-Length for the middleware to check), then decompressed with a cap; read once per
    request (FastAPI caches a dependency's value within a request, so an endpoint taking both
    `RawBody` and `JsonBody` reads the stream once)."""
    cap = ctx.cfg.max_body_bytes
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > cap:
            raise PayloadTooLargeError(f"request body exceeds the cap of {cap} bytes "
                                       "(--max_body_bytes)")
    raw = decompress(bytes(buf), request.headers.get("content-encoding", ""),
                     ctx.cfg.max_decompressed_bytes)
    return raw


RawBody = Annotated[bytes, Depends(read_body)]
"""An endpoint parameter: the request body, capped and decompressed."""


async def json_body(raw: RawBody) -> dict[str, Any]:
    """The body as a JSON object (`UserError` otherwise, also for nesting too deep for the
    parser, which raises `RecursionError`)."""
    try:
        body = json.loads(raw) if raw else None
    except (ValueError, RecursionError):
        body = None
    if not isinstance(body, dict):
        raise UserError("the request body must be a JSON object")
    return body


JsonBody = Annotated[dict[str, Any], Depends(json_body)]
"""An endpoint parameter: the request body as a JSON object."""


async def _user_error(_: Request, exc: Exception) -> Response:
    return JSONResponse(status_code=400, content={"detail": str(exc)})


async def _too_large(_: Request, exc: Exception) -> Response:
    return JSONResponse(status_code=413, content={"detail": str(exc)},
                        headers={"connection": "close"})


async def _store_full(_: Request, exc: Exception) -> Response:
    return JSONResponse(status_code=429, content={"detail": str(exc)},
                        headers={"retry-after": "2"})


async def _internal(_: Request, exc: Exception) -> Response:
    log.error("internal error: %s: %s", type(exc).__name__, exc)
    return JSONResponse(status_code=500, content={"detail": "internal server error"})


EXCEPTION_HANDLERS: dict[int | type[Exception],
                         Callable[[Request, Any], Coroutine[Any, Any, Response]]] = {
    UserError: _user_error,
    PayloadTooLargeError: _too_large,
    StoreFullError: _store_full,
    Exception: _internal,
}
"""Error → answer, for every endpoint (``FastAPI(exception_handlers=...)``)."""
