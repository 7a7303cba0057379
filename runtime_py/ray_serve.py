"""Ray Serve: a bundle behind the KServe v2 routes, one loaded copy per replica.

    from runtime_py.ray_serve import bundle_app
    from ray import serve
    serve.run(bundle_app("model.bundle", num_replicas=2, num_gpus=1), route_prefix="/")

Each replica opens, verifies and loads the bundle itself (`runtime_py.load`), so scaling
is Ray's: `num_replicas` (or `autoscaling_config`), and `num_gpus` per replica in its
actor options (Ray gives each replica its own GPU through CUDA_VISIBLE_DEVICES, which is
why the engine always opens device 0). Batching is Ray Serve's own `@serve.batch`, counted
in images (`batch_size_fn`) up to the bundle's max batch; a request that alone exceeds it
skips the queue and is split by `Model.infer`.

Routes (the same wire format as `bundle serve`, from `runtime_py.server.protocol`):
GET /v2/health/live, /v2/health/ready, /v2, /v2/models/{name}[/ready];
POST /v2/models/{name}/infer with JSON tensors or the binary tensor data extension.
Every answer carries `trt-bundle-replica`, the id of the replica that computed it (and
`trt-bundle-retries` when the optional ingress retried a lost replica: `retries=N`).

Importable without ray (`pip install 'trt-bundle[ray]'` for the deployment itself).
"""

from __future__ import annotations

import asyncio
import functools
import re
from typing import Any

import numpy as np

from runtime_py.errors import BundleError, EngineUnavailableError, UsageError

REPLICA_HEADER = "trt-bundle-replica"
RETRIES_HEADER = "trt-bundle-retries"   # set when the ingress retried a lost replica
_MODEL_ROUTE = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?"
                          r"(?P<action>/ready|/infer)?$")


def import_serve():
    try:
        from ray import serve
    except ImportError:
        raise EngineUnavailableError(
            "Ray Serve is not installed: pip install 'trt-bundle[ray]'") from None
    return serve


def _rows(items: list[dict[str, np.ndarray]]) -> int:
    """Images in a list of requests (what `@serve.batch` counts against max_batch_size)."""
    return sum(next(iter(feeds.values())).shape[0] for feeds in items)


def _replica_id(serve) -> str:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:   # outside a replica (local testing mode)
        return "local"


class ReplicaLostError(BundleError):
    """Every try of a request met a dead or unreachable replica (HTTP 503: retry later)."""

    exit_code = 7
    status = 503


class _Described:
    """What the routes need of a model, as the ingress gets it from a replica."""

    def __init__(self, info: dict) -> None:
        from runtime_py.tensors import TensorSpec

        self.name, self.version, self.platform = info["name"], info["version"], info["platform"]
        self.inputs = [TensorSpec(*t) for t in info["inputs"]]
        self.outputs = [TensorSpec(*t) for t in info["outputs"]]


@functools.cache
def _routes_class() -> type:
    """The KServe v2 routes over `self.meta` (a model) and `self.infer_with_replica`."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    from runtime_py.server import protocol

    class V2Routes:
        meta: Any
        replica: str = "?"

        async def infer_with_replica(self, feeds: dict) -> tuple[dict, dict[str, str]]:
            """Outputs, and the headers naming who computed them."""
            raise NotImplementedError

        def _json(self, body: Any, status: int = 200) -> JSONResponse:
            return JSONResponse(body, status_code=status, headers={REPLICA_HEADER: self.replica})

        async def __call__(self, request: Request) -> Response:
            try:
                return await self._route(request)
            except Exception as exc:
                status = getattr(exc, "status", None) or (400 if isinstance(exc, UsageError)
                                                          else 500)
                message = (str(exc) if isinstance(exc, BundleError)
                           else f"{type(exc).__name__}: {exc}")
                return self._json({"error": message}, status)

        async def _route(self, request: Request) -> Response:
            path, method = request.url.path.rstrip("/") or "/", request.method
            if path in ("/v2/health/live", "/v2/health/ready") and method == "GET":
                return self._json({path.rsplit("/", 1)[1]: True})
            if path == "/v2" and method == "GET":
                return self._json(protocol.server_metadata())
            meta = await self.model_meta()
            match = _MODEL_ROUTE.match(path)
            if match is None:
                raise protocol.RequestError(f"no route {method} {path}", 404)
            if match["name"] != meta.name or match["version"] not in (None, str(meta.version)):
                raise protocol.RequestError(
                    f"unknown model {match['name']!r} (version {match['version']}); served: "
                    f"{meta.name!r} version {meta.version!r}", 404)
            action = match["action"]
            if action is None and method == "GET":
                return self._json(protocol.model_metadata(meta))
            if action == "/ready" and method == "GET":
                return self._json({"name": meta.name, "ready": True})
            if action == "/infer" and method == "POST":
                return await self._infer(request, meta)
            raise protocol.RequestError(f"method {method} not allowed on {path}", 405)

        async def model_meta(self):
            return self.meta

        async def _infer(self, request: Request, meta) -> Response:
            body = await request.body()
            header_bytes, binary = protocol.split_body(
                body, request.headers.get(protocol.HEADER_LENGTH))
            parsed = protocol.parse_infer_request(protocol.load_json(header_bytes), binary,
                                                  meta.inputs, meta.outputs)
            results, served_by = await self.infer_with_replica(parsed.feeds)
            content, headers, media = protocol.encode_infer_response(
                meta.name, str(meta.version), parsed.id, results, parsed.outputs)
            return Response(content, media_type=media, headers={**headers, **served_by})

    return V2Routes


@functools.cache
def deployment_class(serve) -> type:
    """The replica class (built once per process: it needs `serve` for `@serve.batch`)."""

    class BundleDeployment(_routes_class()):
        def __init__(self, bundle_path: str, backend: str = "auto",
                     max_batch_size: int | None = None, batch_wait_timeout_s: float = 0.002,
                     intra_op_threads: int | None = None) -> None:
            import runtime_py

            options = {"intra_op_threads": intra_op_threads} if intra_op_threads else {}
            self.model = self.meta = runtime_py.load(bundle_path, backend=backend, **options)
            self.limit = int(max_batch_size or self.model.max_batch_size)
            self._batched.set_max_batch_size(self.limit)
            self._batched.set_batch_wait_timeout_s(batch_wait_timeout_s)
            self.replica = _replica_id(serve)

        @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.002, batch_size_fn=_rows)
        async def _batched(self, requests: list[dict[str, np.ndarray]]) -> list[dict]:
            names = [s.name for s in self.model.inputs]
            merged = {n: np.concatenate([r[n] for r in requests]) for n in names}
            outputs = await asyncio.to_thread(self.model.infer, merged)
            results, start = [], 0
            for r in requests:
                n = next(iter(r.values())).shape[0]
                results.append({k: v[start:start + n] for k, v in outputs.items()})
                start += n
            return results

        async def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            """Checked inputs -> outputs, through Ray Serve's batching."""
            from runtime_py.tensors import check_feeds

            n = check_feeds(self.model.inputs, feeds)   # a bad request fails alone
            if n > self.limit:
                return await asyncio.to_thread(self.model.infer, feeds)
            return await self._batched(feeds)

        async def infer_with_replica(self, feeds: dict) -> tuple[dict, dict[str, str]]:
            return await self.infer(feeds), {REPLICA_HEADER: self.replica}

        def describe(self) -> dict:
            m = self.model
            return {"name": m.name, "version": str(m.version), "platform": m.platform,
                    "inputs": [tuple(s) for s in m.inputs], "outputs": [tuple(s) for s in m.outputs]}

        def __del__(self) -> None:
            model = getattr(self, "model", None)
            if model is not None:
                model.close()

    return BundleDeployment


@functools.cache
def ingress_class(serve) -> type:
    """An HTTP front that calls the bundle replicas through a handle and retries a request
    whose replica died or became unreachable (inference is idempotent: a retry cannot
    answer twice, the dead try produced no answer)."""
    from ray.exceptions import RayActorError

    class BundleIngress(_routes_class()):
        def __init__(self, model_handle, retries: int = 3, backoff_s: float = 0.05) -> None:
            self.handle = model_handle
            self.retries = int(retries)
            self.backoff_s = backoff_s
            self.meta = None
            self.replica = _replica_id(serve)

        async def model_meta(self):
            if self.meta is None:
                self.meta = _Described((await self._call("describe"))[0])
            return self.meta

        async def _call(self, method: str, *args) -> tuple[Any, int]:
            """The replica method's result and how many tries were lost before it."""
            for attempt in range(self.retries + 1):
                try:
                    return await getattr(self.handle, method).remote(*args), attempt
                except RayActorError as exc:
                    if attempt == self.retries:
                        raise ReplicaLostError(
                            f"the model replica was lost {attempt + 1} time(s) for this "
                            f"request ({type(exc).__name__}); retry later") from None
                    await asyncio.sleep(self.backoff_s * (attempt + 1))

        async def infer_with_replica(self, feeds: dict) -> tuple[dict, dict[str, str]]:
            (results, served_by), lost = await self._call("infer_with_replica", feeds)
            return results, ({**served_by, RETRIES_HEADER: str(lost)} if lost else served_by)

    return BundleIngress


def bundle_app(bundle_path: str, *, num_replicas: int | str = 1, num_gpus: float = 0,
               num_cpus: float = 1, max_batch_size: int | None = None,
               batch_wait_timeout_s: float = 0.002, backend: str = "auto",
               intra_op_threads: int | None = None, max_ongoing_requests: int = 64,
               name: str = "bundle", autoscaling_config: dict | None = None,
               retries: int = 0):
    """A Ray Serve application serving one bundle; pass it to `serve.run`.

    num_gpus: GPUs per replica (0: CPU replicas). num_replicas: a count, or "auto" with
    `autoscaling_config`. The bundle path must be readable from every Ray node (a shared
    file system, or the same path on each).

    retries: 0 serves HTTP from the bundle replicas themselves (one hop; a request in flight
    on a replica that dies gets HTTP 500 from Ray's proxy). N > 0 puts an ingress
    deployment in front that calls the replicas through a handle and retries a request up
    to N times when its replica died (HTTP 503 with the reason once they are spent), at
    the cost of a second hop.
    """
    serve = import_serve()
    if num_gpus < 0 or num_cpus < 0:
        raise UsageError("num_gpus and num_cpus must be >= 0")
    options: dict[str, Any] = {
        "name": name,
        "ray_actor_options": {"num_cpus": num_cpus, "num_gpus": num_gpus},
        "max_ongoing_requests": max_ongoing_requests,
    }
    if autoscaling_config is not None:
        options["autoscaling_config"] = autoscaling_config
    else:
        options["num_replicas"] = num_replicas
    if retries < 0:
        raise UsageError("retries must be >= 0")
    deployment = serve.deployment(deployment_class(serve), **options)
    model = deployment.bind(str(bundle_path), backend, max_batch_size, batch_wait_timeout_s,
                            intra_op_threads)
    if not retries:
        return model
    ingress = serve.deployment(ingress_class(serve), name=f"{name}-ingress",
                               ray_actor_options={"num_cpus": 0},
                               max_ongoing_requests=max_ongoing_requests * 4)
    return ingress.bind(model, retries)
