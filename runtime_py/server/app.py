"""The starlette app: KServe v2 routes, Triton's extensions (model config, repository
index, statistics, system shared memory), a classify route and /metrics, over an engine.

Handlers stay thin: read the body within the size limit, hand bytes to ``protocol`` /
``infer_call``, await the engine (``Engine`` in this process, or ``RemoteEngine`` in a
front-end worker process), and turn every refusal into the protocol's error JSON
``{"error": "..."}`` with a 4xx/5xx status. No exception leaves a handler, so one bad
request never affects the next.
"""

from __future__ import annotations

import logging
import time
import traceback
from typing import Any, Awaitable, Callable, Mapping

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..batcher import Batcher
from ..errors import BundleError, PreprocessError
from . import protocol, triton_ext
from .engine import Engine, is_server_fault, status_of
from .infer_call import encode_http_response, parse_http_call
from .infer_route import InferRoute
from .metrics import ServerMetrics
from .protocol import RequestError

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
_THREADPOOL_JSON_BYTES = 256 * 1024   # parse/encode larger JSON off the event loop
UNKNOWN = "_unknown"                  # metrics label for names that are not served


def error_response(status: int, message: str) -> JSONResponse:
    """The protocol's error body."""
    return JSONResponse({"error": message}, status_code=status)


def _forget_frames(exc: BaseException) -> BaseException:
    """``exc`` with no traceback, no context, and the locals of every frame it passed
    through cleared: what makes a refused request's body and parsed JSON free at once.

    An exception raised in the thread pool comes back through a future, and the future,
    the awaiting frame and the exception's traceback form a reference cycle: without this,
    each refused 60 MB body stayed resident (~300 MB with its parsed JSON) until the
    cyclic garbage collector ran, hundreds of requests later.
    """
    seen = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        traceback.clear_frames(link.__traceback__)
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    exc.__cause__ = exc.__context__ = None
    return exc


def _refused(exc: BaseException) -> BaseException:
    """A refused request's exception with its frames forgotten (``_forget_frames``); a
    server-side failure (5xx) keeps its traceback for the log."""
    if isinstance(exc, Exception) and status_of(exc) < 500:
        return _forget_frames(exc)
    return exc


def error_message(e: Exception, status: int) -> str:
    """What a client is told: the message of our own errors, the type of any other."""
    if is_server_fault(e, status):
        return f"inference failed: {type(e).__name__}: {e}"
    return str(e) if isinstance(e, BundleError) else f"{type(e).__name__}: {e}"


class _App:
    """Routes bound to an engine; ``create_app`` wraps it in Starlette."""

    def __init__(self, engine: Any, max_body_bytes: int) -> None:
        self.engine = engine
        self.infos = engine.infos
        self.max_body_bytes = max_body_bytes

    # --- plumbing -----------------------------------------------------------------------

    def handler(self, endpoint: str, fn: Callable[[Request], Awaitable[Response]]):
        """Wrap ``fn``: map exceptions to error JSON, count the request and its latency."""
        async def handle(request: Request) -> Response:
            t0 = time.perf_counter()
            name = request.path_params.get("name")
            label = name if name in self.infos else (UNKNOWN if name else "")
            try:
                response = await fn(request)
            except ClientDisconnect:
                response = error_response(400, "client disconnected while sending the body")
            except Exception as e:
                response = error_response(*self.error_reply(e, request.method,
                                                            request.url.path))
            self.engine.record_request(label, endpoint, response.status_code,
                                       time.perf_counter() - t0)
            return response
        return handle

    unknown_label = UNKNOWN

    def error_reply(self, e: Exception, method: str, path: str) -> tuple[int, str]:
        """The status and message answering ``e``; a server fault is logged with its
        traceback, a refusal is not."""
        status = status_of(e)
        if is_server_fault(e, status):
            log.error("%s %s failed", method, path, exc_info=e)
        return status, error_message(e, status)

    def lookup(self, request: Request):
        """The model named in the path (and its version, when given), or a 404."""
        return self.engine.lookup(request.path_params["name"],
                                  request.path_params.get("version"))

    async def read_body(self, request: Request) -> bytes:
        """The body, refused with 413 by its declared length or as soon as it grows too big."""
        limit = self.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None:
            try:
                n = int(declared)
            except ValueError:
                raise RequestError(f"invalid Content-Length {declared!r}") from None
            if n > limit:
                raise RequestError(
                    f"request body of {n} bytes exceeds the limit of {limit} bytes", 413)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(f"request body exceeds the limit of {limit} bytes", 413)
            if chunk:
                chunks.append(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def read_json(self, request: Request, default: Any = None) -> Any:
        body = await self.read_body(request)
        return protocol.load_json(body) if body.strip() else default

    # --- KServe v2 core -----------------------------------------------------------------

    async def live(self, request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(self, request: Request) -> Response:
        # The protocol answers health with 200 for true and a 4xx for false.
        ok = await self.engine.ready()
        return JSONResponse({"ready": ok}, status_code=200 if ok else 400)

    async def server_metadata(self, request: Request) -> Response:
        return JSONResponse(triton_ext.server_metadata())

    async def model_metadata(self, request: Request) -> Response:
        return JSONResponse(triton_ext.model_metadata(self.lookup(request)))

    async def model_ready(self, request: Request) -> Response:
        info = self.lookup(request)
        ok = await self.engine.ready(info.name)
        return JSONResponse({"name": info.name, "ready": ok}, status_code=200 if ok else 400)

    async def infer(self, request: Request) -> Response:
        # Reached only through Starlette's routing when the fast path is bypassed (never in
        # ``create_engine_app``'s app, whose ``InferFastPath`` answers POST .../infer).
        info = self.lookup(request)
        content, headers, media = await self.infer_body(
            info, lambda: self.read_body(request),
            request.headers.get(protocol.HEADER_LENGTH))
        return Response(content, headers=headers, media_type=media)

    async def infer_body(self, info: Any, read: Callable[[], Awaitable[bytes | bytearray]],
                         header_length: str | None) -> tuple[bytes, dict[str, str], str]:
        """One inference request of model ``info``: read the body with ``read``, parse,
        run, encode; returns the response's content, extra headers and media type."""
        max_batch = info.max_batch_size
        limits = protocol.json_limits(info.inputs, max_batch)
        error: BaseException | None = None
        try:
            body = await read()
            header_bytes, binary = protocol.split_body(body, header_length)

            def parse():
                header = protocol.load_json(header_bytes, limits)
                return parse_http_call(info.name, None, header, binary, info.inputs,
                                       info.outputs, max_batch=max_batch)

            if len(header_bytes) > _THREADPOOL_JSON_BYTES:
                call = await run_in_threadpool(parse)
            else:
                call = parse()
        except Exception as exc:
            error = _refused(exc)
        if error is not None:
            # raised here, outside the except clause, so nothing chains the body to it
            body = header_bytes = binary = parse = None
            raise error
        results = await self.engine.infer(call)
        encode = (encode_http_response, info.name, info.version, call, results)
        json_elems = sum(getattr(results[o.name], "size", 0)
                         for o in call.outputs if not o.binary)
        if json_elems * 8 > _THREADPOOL_JSON_BYTES:
            return await run_in_threadpool(*encode)
        return encode[0](*encode[1:])

    async def classify(self, request: Request) -> Response:
        info = self.lookup(request)
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype and not (ctype.startswith("image/") or ctype == "application/octet-stream"):
            raise RequestError(
                f"classify takes an encoded image as the raw body (Content-Type image/*), "
                f"got {ctype!r}", 415)
        raw_k = request.query_params.get("top_k", "5")
        try:
            k = int(raw_k)
        except ValueError:
            k = 0
        if k < 1:
            raise RequestError(f"top_k must be a positive integer, got {raw_k!r}")
        if len(info.inputs) != 1:
            raise RequestError(f"model {info.name!r} takes {len(info.inputs)} inputs; "
                               f"classify needs a single image input")
        error: BaseException | None = None
        try:
            body = await self.read_body(request)
            if not body:
                raise PreprocessError("empty body: send one encoded image (JPEG, PNG, ...)")
            top = await self.engine.classify(info.name, body, k)
        except Exception as exc:
            error = _refused(exc)   # as in infer: a refused image must not stay resident
        if error is not None:
            body = None
            raise error
        return JSONResponse({
            "model_name": info.name,
            "model_version": info.version,
            "predictions": [{"label": label, "index": int(index), "score": float(score)}
                            for index, label, score in top],
        })

    async def metrics_endpoint(self, request: Request) -> Response:
        # Not counted in the metrics it serves (a scrape every few seconds is noise there).
        try:
            text = await self.engine.metrics_text()
        except Exception as e:
            status = status_of(e)
            log.error("GET /metrics failed", exc_info=e)
            return error_response(status, error_message(e, status))
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    # --- Triton extensions --------------------------------------------------------------

    async def model_config(self, request: Request) -> Response:
        return JSONResponse(triton_ext.model_config(self.lookup(request)))

    async def repository_index(self, request: Request) -> Response:
        await self.read_json(request, {})   # {"ready": bool} is allowed; all are ready
        return JSONResponse(triton_ext.repository_index(list(self.infos.values())))

    async def stats(self, request: Request) -> Response:
        name = request.path_params.get("name")
        return JSONResponse(await self.engine.stats(name, request.path_params.get("version")))

    async def shm_status(self, request: Request) -> Response:
        return JSONResponse(await self.engine.shm_status(request.path_params.get("region")))

    async def shm_register(self, request: Request) -> Response:
        doc = await self.read_json(request)
        if not isinstance(doc, dict):
            raise RequestError("register takes a JSON object {key, offset, byte_size}")
        await self.engine.shm_register(request.path_params["region"], doc.get("key"),
                                       doc.get("offset", 0), doc.get("byte_size"))
        return JSONResponse({})

    async def shm_unregister(self, request: Request) -> Response:
        await self.engine.shm_unregister(request.path_params.get("region"))
        return JSONResponse({})

    async def cuda_shm(self, request: Request) -> Response:
        raise RequestError("CUDA shared memory is not supported by this server; use system "
                           "shared memory (/v2/systemsharedmemory)")


def create_app(
    models: Mapping[str, Any],
    batchers: Mapping[str, Batcher],
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    metrics: ServerMetrics | None = None,
) -> InferRoute:
    """The ASGI app serving ``models`` (served name -> model) through ``batchers``.

    The caller owns the batchers (creates and closes them); the app only submits to them
    and registers metrics listeners on each.
    """
    return create_engine_app(Engine(models, batchers, metrics), max_body_bytes=max_body_bytes)


def create_engine_app(engine: Any, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> InferRoute:
    """The ASGI app over an engine: ``Engine`` here, or a worker's ``RemoteEngine``.

    Inference requests are answered by ``InferRoute`` without Starlette (the front-end's
    per-request time is the service's limit); every other route by Starlette."""
    app = _App(engine, max_body_bytes)
    h = app.handler
    model_routes = []
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        model_routes += [
            Route(prefix, h("metadata", app.model_metadata), methods=["GET"]),
            Route(prefix + "/ready", h("ready", app.model_ready), methods=["GET"]),
            Route(prefix + "/config", h("config", app.model_config), methods=["GET"]),
            Route(prefix + "/stats", h("stats", app.stats), methods=["GET"]),
            Route(prefix + "/infer", h("infer", app.infer), methods=["POST"]),
            Route(prefix + "/classify", h("classify", app.classify), methods=["POST"]),
        ]
    shm = "/v2/systemsharedmemory"
    routes = [
        Route("/v2/health/live", h("live", app.live), methods=["GET"]),
        Route("/v2/health/ready", h("ready", app.ready), methods=["GET"]),
        Route("/v2", h("server_metadata", app.server_metadata), methods=["GET"]),
        Route("/v2/models/stats", h("stats", app.stats), methods=["GET"]),
        Route("/v2/repository/index", h("repository", app.repository_index), methods=["POST"]),
        Route(shm + "/status", h("shm", app.shm_status), methods=["GET"]),
        Route(shm + "/region/{region}/status", h("shm", app.shm_status), methods=["GET"]),
        Route(shm + "/region/{region}/register", h("shm", app.shm_register), methods=["POST"]),
        Route(shm + "/region/{region}/unregister", h("shm", app.shm_unregister),
              methods=["POST"]),
        Route(shm + "/unregister", h("shm", app.shm_unregister), methods=["POST"]),
        Route("/v2/cudasharedmemory/{rest:path}", h("shm", app.cuda_shm),
              methods=["GET", "POST"]),
        *model_routes,
        Route("/metrics", app.metrics_endpoint, methods=["GET"]),
    ]

    async def http_error(request: Request, exc: Exception) -> Response:
        # Unknown paths and wrong methods answer in the protocol's error format too.
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
        response = error_response(status, f"{detail}: {request.method} {request.url.path}")
        if isinstance(exc, HTTPException) and exc.headers:
            response.headers.update(exc.headers)   # e.g. Allow on 405
        return response

    starlette_app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    starlette_app.state.trt_bundle = app
    return InferRoute(app, starlette_app)
