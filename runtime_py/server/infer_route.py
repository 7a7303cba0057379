"""``POST /v2/models/{name}[/versions/{v}]/infer`` as a bare ASGI handler, in front of the
Starlette app that serves every other route.

Why: on the inference route the front-end's own time is the service's limit (issue 15).
Profiles of ``serve_bench.py --synthetic`` showed Starlette's middleware stack, route
matching over ~40 patterns, its ``Request``/``Response`` objects and the body collected
as a list of chunks then joined, as a large share of the event loop's time per request.
Here the path is matched by one regular expression, the body is read from ``receive``
straight into one buffer of its declared length (a single copy out of the server's
chunks), and the response is sent as two ASGI messages with prebuilt headers. What a
request means (parsing, limits, errors, metrics) is ``_App``'s, shared with every route.
"""

from __future__ import annotations

import json
import re
import time
import traceback
from typing import Any, Awaitable, Callable

from starlette.requests import ClientDisconnect

from .protocol import RequestError

_INFER = re.compile(r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer")
_HEADER_LENGTH = b"inference-header-content-length"

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


class InferRoute:
    """ASGI app: inference requests answered here, everything else by ``fallback``."""

    def __init__(self, app: Any, fallback: Callable) -> None:
        self.app = app            # the ``_App``: engine, limits, error mapping, infer_body
        self.fallback = fallback
        self.state = getattr(fallback, "state", None)
        self.pool = BufferPool()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = _INFER.fullmatch(scope["path"])
            if match is not None:
                await self._infer(scope, receive, send, match["name"], match["version"])
                return
        await self.fallback(scope, receive, send)

    async def _infer(self, scope: Scope, receive: Receive, send: Send, name: str,
                     version: str | None) -> None:
        app = self.app
        t0 = time.perf_counter()
        declared = header_length = None
        for key, value in scope["headers"]:
            if key == b"content-length":
                declared = value
            elif key == _HEADER_LENGTH:
                header_length = value.decode("latin-1")
        body = None

        async def read() -> bytes | bytearray:
            nonlocal body
            body = await read_body(receive, declared, app.max_body_bytes, self.pool)
            return body

        status, content, headers, media = await answer_infer(app, name, version,
                                                             scope["path"], header_length, read)
        if status == 200 and isinstance(body, bytearray):
            # The engine has answered: nothing reads the body any more (a cancelled
            # request never gets here, its buffer is left to the garbage collector).
            self.pool.put(body)
        raw_headers = [(b"content-length", str(len(content)).encode()),
                       (b"content-type", media.encode())]
        raw_headers += [(k.lower().encode("latin-1"), v.encode("latin-1"))
                        for k, v in headers.items()]
        await send({"type": "http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": content})
        app.engine.record_request(infer_label(app, name), "infer", status,
                                  time.perf_counter() - t0)


def infer_label(app: Any, name: str) -> str:
    """The metrics label of a request for model ``name`` (one label for every unknown name,
    so a client cannot grow the metrics without bound)."""
    return name if name in app.infos else app.unknown_label


async def answer_infer(app: Any, name: str, version: str | None, path: str,
                       header_length: str | None,
                       read: Callable[[], Awaitable[bytes | bytearray | memoryview]]
                       ) -> tuple[int, bytes, dict[str, str], str]:
    """Status, content, extra headers and media type answering one inference request of
    ``app`` (the ``_App``), whose body ``read`` gives; every failure is an error reply.
    Shared by this ASGI route and the built-in HTTP/1.1 server (``http1``)."""
    try:
        info = app.engine.lookup(name, version)
        content, headers, media = await app.infer_body(info, read, header_length)
        return 200, content, headers, media
    except ClientDisconnect:
        return 400, _error_json("client disconnected while sending the body"), {}, _JSON
    except Exception as e:
        status, message = app.error_reply(e, "POST", path)
        # The traceback's frames hold ``read`` and with it the body: cleared here so a
        # refused body is freed at once, not when the cyclic collector next runs.
        traceback.clear_frames(e.__traceback__)
        return status, _error_json(message), {}, _JSON


_JSON = "application/json"


def _error_json(message: str) -> bytes:
    """The protocol's error body, encoded as Starlette's ``JSONResponse`` does."""
    return json.dumps({"error": message}, ensure_ascii=False,
                      separators=(",", ":")).encode("utf-8")


class BufferPool:
    """Request-body buffers kept for reuse, by size, up to ``max_bytes`` in all.

    A fresh multi-megabyte buffer per request costs its page faults and zeroing every
    time (glibc maps large blocks anew): 7% of the event loop's time with 1 MB float32
    images. Clients of one model send bodies of one size, so a free list per size hits."""

    def __init__(self, max_bytes: int = 128 << 20) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        self._free: dict[int, list[bytearray]] = {}

    def get(self, size: int) -> bytearray:
        free = self._free.get(size)
        if free:
            self.held -= size
            return free.pop()
        return bytearray(size)

    def put(self, buf: bytearray) -> None:
        size = len(buf)
        if self.held + size <= self.max_bytes:
            self._free.setdefault(size, []).append(buf)
            self.held += size


async def read_body(receive: Receive, declared: bytes | None, limit: int,
                    pool: BufferPool | None = None) -> bytes | bytearray:
    """The request body, refused with 413 by its declared length or as soon as it grows
    past ``limit``. With a Content-Length the chunks are copied into one buffer of that
    size (from ``pool`` when given) as they come, not collected and joined; a one-chunk
    body is used as it is."""
    size = None
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise RequestError(f"invalid Content-Length {declared.decode('latin-1')!r}") from None
        if size < 0:
            raise RequestError(f"invalid Content-Length {size}")
        if size > limit:
            raise RequestError(f"request body of {size} bytes exceeds the limit of {limit} bytes",
                               413)
    buf: bytearray | None = None
    view: memoryview | None = None
    chunks: list[bytes] = []
    got = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        more = message.get("more_body", False)
        if chunk:
            end = got + len(chunk)
            if end > limit:
                raise RequestError(f"request body exceeds the limit of {limit} bytes", 413)
            if size is not None and end > size:
                raise RequestError(f"the body is longer than its Content-Length ({size})")
            if got == 0 and not more:
                return chunk
            if size is not None:
                if view is None:
                    buf = pool.get(size) if pool is not None else bytearray(size)
                    view = memoryview(buf)
                view[got:end] = chunk
            else:
                chunks.append(chunk)
            got = end
        if not more:
            break
    if view is not None:
        view.release()
        return buf if got == size else buf[:got]
    return b"".join(chunks)
