"""The starlette app: KServe v2 routes over the batchers, a classify route, /metrics.

Handlers stay thin: read the body within the size limit, hand bytes to ``protocol``,
await the batcher (``submit_async``, so the event loop never blocks on an engine), and
turn every refusal into the protocol's error JSON ``{"error": "..."}`` with a 4xx/5xx
status. No exception leaves a handler, so one bad request never affects the next.
"""

from __future__ import annotations

import logging
import time
import traceback
from typing import Any, Awaitable, Callable, Mapping

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..batcher import Batcher
from ..errors import (
    BatcherClosedError,
    BundleError,
    PreprocessError,
    QueueFullError,
    UsageError,
)
from . import protocol
from .metrics import ServerMetrics
from .protocol import RequestError

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
_THREADPOOL_JSON_BYTES = 256 * 1024   # parse/encode larger JSON off the event loop
_UNKNOWN = "_unknown"                 # metrics label for names that are not served


def error_response(status: int, message: str) -> JSONResponse:
    """The protocol's error body."""
    return JSONResponse({"error": message}, status_code=status)


def _error_kind(status: int) -> str:
    return {400: "bad_request", 404: "not_found", 413: "too_large", 415: "unsupported_media",
            503: "unavailable"}.get(status, "internal" if status >= 500 else "client")


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


def _parse_infer(body: bytes, header_length: str | None, model: Any,
                 max_batch: int | None) -> protocol.InferRequest:
    """The body of an infer request -> arrays, with the model's JSON limits."""
    header_bytes, binary = protocol.split_body(body, header_length)
    header = protocol.load_json(header_bytes, protocol.json_limits(model.inputs, max_batch))
    return protocol.parse_infer_request(header, binary, model.inputs, model.outputs,
                                        max_batch=max_batch)


def _status_of(exc: Exception) -> int:
    if isinstance(exc, RequestError):
        return exc.status
    if isinstance(exc, (QueueFullError, BatcherClosedError)):
        return 503
    if isinstance(exc, UsageError):   # InferenceInputError, PreprocessError, ...
        return 400
    return 500


class _App:
    """Routes bound to the served models; ``create_app`` wraps it in Starlette."""

    def __init__(self, models: Mapping[str, Any], batchers: Mapping[str, Batcher],
                 max_body_bytes: int, metrics: ServerMetrics) -> None:
        missing = [n for n in models if n not in batchers]
        if missing:
            raise UsageError(f"no batcher for model(s) {missing}")
        self.models = dict(models)
        self.batchers = dict(batchers)
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    # --- plumbing -----------------------------------------------------------------------

    def handler(self, endpoint: str, fn: Callable[[Request], Awaitable[Response]]):
        """Wrap ``fn``: map exceptions to error JSON, count the request and its latency."""
        async def handle(request: Request) -> Response:
            t0 = time.perf_counter()
            name = request.path_params.get("name")
            label = name if name in self.models else (_UNKNOWN if name else "")
            try:
                response = await fn(request)
            except ClientDisconnect:
                response = error_response(400, "client disconnected while sending the body")
            except Exception as e:
                status = _status_of(e)
                if status >= 500 and not isinstance(e, (QueueFullError, BatcherClosedError)):
                    log.error("%s %s failed", request.method, request.url.path, exc_info=e)
                    message = f"inference failed: {type(e).__name__}: {e}"
                else:
                    message = str(e) if isinstance(e, BundleError) else f"{type(e).__name__}: {e}"
                response = error_response(status, message)
            status = response.status_code
            self.metrics.requests.labels(label, endpoint, str(status)).inc()
            if status >= 400:
                self.metrics.errors.labels(label, endpoint, _error_kind(status)).inc()
            self.metrics.latency.labels(label, endpoint).observe(time.perf_counter() - t0)
            return response
        return handle

    def lookup(self, request: Request) -> tuple[Any, Batcher]:
        """The model named in the path (and its version, when given), or a 404."""
        name = request.path_params["name"]
        model = self.models.get(name)
        if model is None:
            raise RequestError(f"unknown model {name!r}; served: {sorted(self.models)}", 404)
        version = request.path_params.get("version")
        if version is not None and version != str(model.version):
            raise RequestError(
                f"model {name!r} has no version {version!r}; available: [{model.version!r}]", 404)
        return model, self.batchers[name]

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

    # --- routes -------------------------------------------------------------------------

    async def live(self, request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(self, request: Request) -> Response:
        # The protocol answers health with 200 for true and a 4xx for false.
        ok = all(not b.closed for b in self.batchers.values())
        return JSONResponse({"ready": ok}, status_code=200 if ok else 400)

    async def server_metadata(self, request: Request) -> Response:
        return JSONResponse(protocol.server_metadata())

    async def model_metadata(self, request: Request) -> Response:
        model, _ = self.lookup(request)
        return JSONResponse(protocol.model_metadata(model))

    async def model_ready(self, request: Request) -> Response:
        model, batcher = self.lookup(request)
        ok = not batcher.closed
        return JSONResponse({"name": model.name, "ready": ok}, status_code=200 if ok else 400)

    async def infer(self, request: Request) -> Response:
        model, batcher = self.lookup(request)
        max_batch = getattr(model, "max_batch_size", None)
        error: BaseException | None = None
        try:
            body = await self.read_body(request)
            args = (body, request.headers.get(protocol.HEADER_LENGTH), model, max_batch)
            if len(body) > _THREADPOOL_JSON_BYTES:
                parsed = await run_in_threadpool(_parse_infer, *args)
            else:
                parsed = _parse_infer(*args)
        except Exception as exc:
            error = _forget_frames(exc)
        if error is not None:
            # raised here, outside the except clause, so nothing chains the body to it
            body = args = None
            raise error
        results = await batcher.submit_async(parsed.feeds)
        encode = (protocol.encode_infer_response, model.name, str(model.version), parsed.id,
                  results, parsed.outputs)
        json_elems = sum(results[o.name].size for o in parsed.outputs if not o.binary)
        if json_elems * 8 > _THREADPOOL_JSON_BYTES:
            content, headers, media = await run_in_threadpool(*encode)
        else:
            content, headers, media = encode[0](*encode[1:])
        return Response(content, headers=headers, media_type=media)

    async def classify(self, request: Request) -> Response:
        model, batcher = self.lookup(request)
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
        if len(model.inputs) != 1:
            raise RequestError(f"model {model.name!r} takes {len(model.inputs)} inputs; "
                               f"classify needs a single image input")
        error: BaseException | None = None
        try:
            body = await self.read_body(request)
            if not body:
                raise PreprocessError("empty body: send one encoded image (JPEG, PNG, ...)")
            batch = await run_in_threadpool(model.preprocess, [body])
        except Exception as exc:
            error = _forget_frames(exc)   # as in infer: a refused image must not stay resident
        if error is not None:
            body = None
            raise error
        del body
        results = await batcher.submit_async({model.inputs[0].name: batch})
        top = model.top_k(results[model.outputs[0].name], k)[0]
        return JSONResponse({
            "model_name": model.name,
            "model_version": str(model.version),
            "predictions": [{"label": label, "index": int(index), "score": float(score)}
                            for index, label, score in top],
        })

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def create_app(
    models: Mapping[str, Any],
    batchers: Mapping[str, Batcher],
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    metrics: ServerMetrics | None = None,
) -> Starlette:
    """The ASGI app serving ``models`` (served name -> model) through ``batchers``.

    The caller owns the batchers (creates and closes them); the app only submits to them
    and registers a metrics listener on each.
    """
    metrics = metrics or ServerMetrics()
    app = _App(models, batchers, max_body_bytes, metrics)
    for name, batcher in app.batchers.items():
        metrics.watch(name, batcher)
    h = app.handler
    model_routes = []
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        model_routes += [
            Route(prefix, h("metadata", app.model_metadata), methods=["GET"]),
            Route(prefix + "/ready", h("ready", app.model_ready), methods=["GET"]),
            Route(prefix + "/infer", h("infer", app.infer), methods=["POST"]),
            Route(prefix + "/classify", h("classify", app.classify), methods=["POST"]),
        ]
    routes = [
        Route("/v2/health/live", h("live", app.live), methods=["GET"]),
        Route("/v2/health/ready", h("ready", app.ready), methods=["GET"]),
        Route("/v2", h("server_metadata", app.server_metadata), methods=["GET"]),
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
    return starlette_app
