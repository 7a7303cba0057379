"""KServe v2 over gRPC: the ``inference.GRPCInferenceService`` of the Triton protocol, on
grpcio's asyncio server, over the same engine as the HTTP app.

Messages are tritonclient's generated classes (``tritonclient.grpc.service_pb2`` and
``model_config_pb2``, BSD-3, generated from Triton's ``grpc_service.proto``): the wire
format is exactly what ``tritonclient.grpc`` speaks, and there are no generated files to
keep in step here. The service is registered with grpcio's generic method handlers rather
than tritonclient's ``service_pb2_grpc``, whose import refuses any grpcio older than the
one it was generated with; the messages only need protobuf.

Tensors travel in ``raw_input_contents`` / ``raw_output_contents`` (what tritonclient
sends; the typed ``contents`` fields are accepted too), or by reference to a registered
system shared-memory region. Every refusal is a gRPC status with a message: 400 ->
INVALID_ARGUMENT, 404 -> NOT_FOUND, 409 -> ALREADY_EXISTS, 503 -> UNAVAILABLE, anything
else -> INTERNAL; oversize messages are refused by grpcio (RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any, AsyncIterator, Callable, NamedTuple, Sequence

import grpc
import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from . import protocol, triton_ext
from .app import UNKNOWN, error_message
from .engine import InferCall, ShmInput, ShmOutput, is_server_fault, status_of
from .infer_call import SHM_OFFSET, SHM_REGION, SHM_SIZE, shm_input
from .protocol import OutputRequest, RequestError
from .grpc_wire import split_infer_request
from .shm import ShmRef

log = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"
_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
          409: grpc.StatusCode.ALREADY_EXISTS, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
          503: grpc.StatusCode.UNAVAILABLE}


def _contents_field(dtype: np.dtype) -> str:
    if dtype == np.float64:
        return "fp64_contents"
    if dtype.kind == "f":
        return "fp32_contents"
    if dtype.kind == "b":
        return "bool_contents"
    if dtype.kind == "u":
        return "uint64_contents" if dtype.itemsize == 8 else "uint_contents"
    return "int64_contents" if dtype.itemsize == 8 else "int_contents"


def _shm_ref(params: Any, what: str) -> ShmRef | None:
    if SHM_REGION not in params:
        return None
    region = params[SHM_REGION].string_param
    if not region:
        raise RequestError(f"{what}: {SHM_REGION} must be a non-empty string")
    if SHM_SIZE not in params:
        raise RequestError(f"{what}: {SHM_SIZE} is required with {SHM_REGION}")
    size = params[SHM_SIZE].int64_param or params[SHM_SIZE].uint64_param
    offset = (params[SHM_OFFSET].int64_param or params[SHM_OFFSET].uint64_param
              if SHM_OFFSET in params else 0)
    if size < 0 or offset < 0:
        raise RequestError(f"{what}: shared memory offset and byte size must be non-negative")
    return ShmRef(region, offset, size)


def parse_grpc_call(req: pb.ModelInferRequest, info: Any,
                    raw: Sequence[bytes | memoryview] | None = None) -> InferCall:
    """A ``ModelInferRequest`` as an ``InferCall``, checked against the model like HTTP's.
    ``raw``: its raw input contents when they were split off (``grpc_wire``)."""
    specs = {s.name: s for s in info.inputs}
    if not req.inputs:
        raise RequestError("'inputs' must be a non-empty list of tensors")
    feeds: dict[str, np.ndarray] = {}
    shm_inputs: dict[str, ShmInput] = {}
    if raw is None:
        raw = req.raw_input_contents
    n_raw = 0
    for t in req.inputs:
        name = t.name
        if name in feeds or name in shm_inputs:
            raise RequestError(f"input {name!r} is given more than once")
        spec = specs.get(name)
        if spec is None:
            raise RequestError(f"unknown input {name!r}; the model takes {list(specs)}")
        ref = _shm_ref(t.parameters, f"input {name!r}")
        if ref is not None:
            shm_inputs[name] = shm_input(name, list(t.shape), t.datatype, spec, ref,
                                         info.max_batch_size)
            continue
        shape = protocol.check_shape(protocol._shape(list(t.shape), name), name, spec,
                                     info.max_batch_size)
        dtype = protocol._datatype(t.datatype, name, spec)
        count = math.prod(shape)
        if raw:
            if n_raw >= len(raw):
                raise RequestError(f"input {name!r}: no raw_input_contents entry for it "
                                   f"({len(raw)} given)")
            data = raw[n_raw]
            n_raw += 1
            need = count * dtype.itemsize
            if len(data) != need:
                raise RequestError(f"input {name!r}: raw_input_contents has {len(data)} bytes "
                                   f"but shape {shape} of {t.datatype} needs {need}")
            arr = np.frombuffer(data, dtype=dtype.newbyteorder("<"))
            if arr.dtype != dtype:
                arr = arr.astype(dtype)
            if dtype.kind == "b" and need and arr.view(np.uint8).max() > 1:
                raise RequestError(f"input {name!r}: BOOL bytes must be 0 or 1")
        else:
            values = getattr(t.contents, _contents_field(dtype))
            if len(values) != count:
                raise RequestError(f"input {name!r}: contents has {len(values)} elements but "
                                   f"shape {shape} needs {count}")
            arr = np.asarray(values).astype(dtype)
            if dtype.kind in "iu" and count and not np.array_equal(arr, np.asarray(values)):
                raise RequestError(f"input {name!r}: values outside the range of {t.datatype}")
        feeds[name] = arr.reshape(shape)
    if raw and n_raw != len(raw):
        raise RequestError(f"{len(raw)} raw_input_contents given for {n_raw} inputs with data")
    known = [s.name for s in info.outputs]
    outputs: list[OutputRequest] = []
    shm_outputs: dict[str, ShmRef] = {}
    for o in req.outputs:
        if o.name not in known:
            raise RequestError(f"unknown output {o.name!r}; the model has {known}")
        outputs.append(OutputRequest(o.name, True))
        ref = _shm_ref(o.parameters, f"output {o.name!r}")
        if ref is not None:
            shm_outputs[o.name] = ref
    if not outputs:
        outputs = [OutputRequest(n, True) for n in known]
    return InferCall(info.name, req.model_version or None, req.id or None, feeds, shm_inputs,
                     outputs, shm_outputs)


def encode_grpc_response(info: Any, call: InferCall, results: dict) -> pb.ModelInferResponse:
    """Raw little-endian outputs first, then the outputs written to shared memory (whose
    entries carry the region instead of bytes): tritonclient indexes raw contents by the
    output's position."""
    resp = pb.ModelInferResponse(model_name=info.name, model_version=info.version,
                                 id=call.id or "")
    shm_entries = []
    for o in call.outputs:
        r = results[o.name]
        if isinstance(r, ShmOutput):
            shm_entries.append((o.name, r))
            continue
        resp.outputs.add(name=o.name, datatype=protocol.kserve_datatype(r.dtype),
                         shape=list(r.shape))
        resp.raw_output_contents.append(
            np.ascontiguousarray(r, dtype=r.dtype.newbyteorder("<")).tobytes())
    for name, r in shm_entries:
        t = resp.outputs.add(name=name, datatype=protocol.kserve_datatype(r.dtype),
                             shape=list(r.shape))
        t.parameters[SHM_REGION].string_param = r.ref.region
        t.parameters[SHM_SIZE].int64_param = math.prod(r.shape) * r.dtype.itemsize
    return resp


class InferenceService:
    """The RPCs, over an engine (``Engine`` or a worker's ``RemoteEngine``)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def _label(self, name: str) -> str:
        return name if name in self.engine.infos else (UNKNOWN if name else "")

    async def _run(self, endpoint: str, model: str, context, fn):
        """Run ``fn()``; count it; turn an exception into a status code with its message."""
        t0 = time.perf_counter()
        status = 200
        try:
            return await fn()
        except Exception as e:
            status = status_of(e)
            if is_server_fault(e, status):
                log.error("gRPC %s failed", endpoint, exc_info=e)
            code = _CODES.get(status, grpc.StatusCode.INTERNAL)
            message = error_message(e, status)
        finally:
            self.engine.record_request(self._label(model), "grpc_" + endpoint, status,
                                       time.perf_counter() - t0)
        await context.abort(code, message)

    # --- health and metadata ------------------------------------------------------------

    async def ServerLive(self, req, context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, req, context):
        return pb.ServerReadyResponse(ready=await self.engine.ready())

    async def ModelReady(self, req, context):
        async def fn():
            info = self.engine.lookup(req.name, req.version or None)
            return pb.ModelReadyResponse(ready=await self.engine.ready(info.name))
        return await self._run("ready", req.name, context, fn)

    async def ServerMetadata(self, req, context):
        return json_format.ParseDict(triton_ext.server_metadata(), pb.ServerMetadataResponse())

    async def ModelMetadata(self, req, context):
        async def fn():
            meta = triton_ext.model_metadata(self.engine.lookup(req.name, req.version or None))
            meta.pop("parameters", None)   # the flag is in the model config's parameters
            return json_format.ParseDict(meta, pb.ModelMetadataResponse())
        return await self._run("metadata", req.name, context, fn)

    async def ModelConfig(self, req, context):
        async def fn():
            cfg = triton_ext.model_config(self.engine.lookup(req.name, req.version or None))
            return json_format.ParseDict({"config": cfg}, pb.ModelConfigResponse())
        return await self._run("config", req.name, context, fn)

    async def ModelStatistics(self, req, context):
        async def fn():
            stats = await self.engine.stats(req.name or None, req.version or None)
            return json_format.ParseDict(stats, pb.ModelStatisticsResponse(),
                                         ignore_unknown_fields=True)
        return await self._run("stats", req.name, context, fn)

    async def RepositoryIndex(self, req, context):
        index = triton_ext.repository_index(list(self.engine.infos.values()))
        return json_format.ParseDict({"models": index}, pb.RepositoryIndexResponse())

    # --- inference ----------------------------------------------------------------------

    async def _infer(self, req: pb.ModelInferRequest,
                     raw: list[memoryview] | None = None) -> pb.ModelInferResponse:
        info = self.engine.lookup(req.model_name, req.model_version or None)
        call = parse_grpc_call(req, info, raw)
        results = await self.engine.infer(call)
        return encode_grpc_response(info, call, results)

    async def ModelInfer(self, message: tuple[pb.ModelInferRequest, list[memoryview]], context):
        req, raw = message   # parsed by ``grpc_wire.split_infer_request``
        return await self._run("infer", req.model_name, context, lambda: self._infer(req, raw))

    async def ModelStreamInfer(self, request_iterator, context) -> AsyncIterator:
        """Requests of one stream run concurrently (they batch together); each response,
        or its error, is sent as soon as it is ready, carrying the request's id."""
        queue: asyncio.Queue = asyncio.Queue()
        pending: set[asyncio.Task] = set()

        async def one(data: bytes) -> None:
            await queue.put(await self.stream_message(data))

        async def read() -> None:
            try:
                async for req in request_iterator:
                    task = asyncio.create_task(one(req))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                if pending:
                    await asyncio.gather(*list(pending))
            finally:
                await queue.put(None)

        reader = asyncio.create_task(read())
        try:
            while (msg := await queue.get()) is not None:
                yield msg
        finally:
            reader.cancel()
            for task in list(pending):
                task.cancel()

    async def stream_message(self, data: bytes | memoryview) -> pb.ModelStreamInferResponse:
        """The answer to one message of a ``ModelStreamInfer`` stream: the inference, or
        its error as ``error_message`` with the request's id (the stream goes on). Never
        raises: the messages of a stream are independent, so a server may run each as it
        arrives (``grpc_h2`` does, without the generator above)."""
        t0 = time.perf_counter()
        status = 200
        req = pb.ModelInferRequest()
        try:
            try:
                req, raw = split_infer_request(data)
            except DecodeError as e:
                raise RequestError(f"cannot parse ModelInferRequest: {e}") from None
            msg = pb.ModelStreamInferResponse(infer_response=await self._infer(req, raw))
        except Exception as e:
            status = status_of(e)
            msg = pb.ModelStreamInferResponse(
                error_message=error_message(e, status),
                infer_response=pb.ModelInferResponse(
                    model_name=req.model_name, model_version=req.model_version, id=req.id))
        self.engine.record_request(self._label(req.model_name), "grpc_stream_infer",
                                   status, time.perf_counter() - t0)
        return msg

    # --- shared memory ------------------------------------------------------------------

    async def SystemSharedMemoryStatus(self, req, context):
        async def fn():
            regions = await self.engine.shm_status(req.name or None)
            resp = pb.SystemSharedMemoryStatusResponse()
            for r in regions:
                resp.regions[r["name"]].CopyFrom(
                    pb.SystemSharedMemoryStatusResponse.RegionStatus(**r))
            return resp
        return await self._run("shm", "", context, fn)

    async def SystemSharedMemoryRegister(self, req, context):
        async def fn():
            await self.engine.shm_register(req.name, req.key, req.offset, req.byte_size)
            return pb.SystemSharedMemoryRegisterResponse()
        return await self._run("shm", "", context, fn)

    async def SystemSharedMemoryUnregister(self, req, context):
        async def fn():
            await self.engine.shm_unregister(req.name or None)
            return pb.SystemSharedMemoryUnregisterResponse()
        return await self._run("shm", "", context, fn)

    async def _unsupported(self, req, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            "not supported by this server (CUDA shared memory, model "
                            "loading, tracing and log settings); use system shared memory")


_UNARY = {
    "ServerLive": (pb.ServerLiveRequest, pb.ServerLiveResponse),
    "ServerReady": (pb.ServerReadyRequest, pb.ServerReadyResponse),
    "ModelReady": (pb.ModelReadyRequest, pb.ModelReadyResponse),
    "ServerMetadata": (pb.ServerMetadataRequest, pb.ServerMetadataResponse),
    "ModelMetadata": (pb.ModelMetadataRequest, pb.ModelMetadataResponse),
    "ModelInfer": (pb.ModelInferRequest, pb.ModelInferResponse),
    "ModelConfig": (pb.ModelConfigRequest, pb.ModelConfigResponse),
    "ModelStatistics": (pb.ModelStatisticsRequest, pb.ModelStatisticsResponse),
    "RepositoryIndex": (pb.RepositoryIndexRequest, pb.RepositoryIndexResponse),
    "SystemSharedMemoryStatus": (pb.SystemSharedMemoryStatusRequest,
                                 pb.SystemSharedMemoryStatusResponse),
    "SystemSharedMemoryRegister": (pb.SystemSharedMemoryRegisterRequest,
                                   pb.SystemSharedMemoryRegisterResponse),
    "SystemSharedMemoryUnregister": (pb.SystemSharedMemoryUnregisterRequest,
                                     pb.SystemSharedMemoryUnregisterResponse),
}
_PARSERS = {"ModelInfer": split_infer_request}   # tensors as views, not protobuf copies
_UNSUPPORTED = ("RepositoryModelLoad", "RepositoryModelUnload", "CudaSharedMemoryStatus",
                "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister", "TraceSetting",
                "LogSettings")


def _parsing(method, message_type, parse=None):
    """Wrap an RPC to parse its request itself (with ``parse``, else ``FromString``): a
    message that is not valid protobuf gets INVALID_ARGUMENT with the reason (grpcio's own
    deserializer answers UNKNOWN)."""
    parse = parse or message_type.FromString

    async def handler(data: bytes, context):
        try:
            req = parse(data)
        except DecodeError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"cannot parse {message_type.DESCRIPTOR.name}: {e}")
        return await method(req, context)
    return handler


class Rpc(NamedTuple):
    """One method of the service as a server runs it: ``handler(request bytes, context)``
    (unary) or ``handler(async iterator of request bytes, context)`` (an async generator:
    ``stream``), and what turns its response messages into bytes."""

    handler: Callable[..., Any]
    serialize: Callable[[Any], bytes]
    stream: bool = False
    each: Callable[[Any], Any] | None = None   # a stream of independent messages: the
    #                                            answer to one (``stream_message``)
    tensors: bool = False   # its requests carry tensors: a server may receive them into
    #                         the engine's arena (``grpc_h2``)


def rpc_table(service: InferenceService) -> dict[str, Rpc]:
    """The service's methods by name: the one list that grpcio's generic handler and the
    built-in HTTP/2 server (``grpc_h2``) both serve."""
    table = {name: Rpc(_parsing(getattr(service, name), req, _PARSERS.get(name)),
                       resp.SerializeToString, tensors=name == "ModelInfer")
             for name, (req, resp) in _UNARY.items()}
    for name in _UNSUPPORTED:
        table[name] = Rpc(service._unsupported, bytes)
    table["ModelStreamInfer"] = Rpc(service.ModelStreamInfer,
                                    pb.ModelStreamInferResponse.SerializeToString, stream=True,
                                    each=service.stream_message, tensors=True)
    return table


def generic_handler(service: InferenceService) -> grpc.GenericRpcHandler:
    handlers = {}
    for name, rpc in rpc_table(service).items():
        make = (grpc.stream_stream_rpc_method_handler if rpc.stream
                else grpc.unary_unary_rpc_method_handler)
        handlers[name] = make(rpc.handler, response_serializer=rpc.serialize)
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


def grpc_options(max_message_bytes: int, reuse_port: bool) -> list[tuple[str, Any]]:
    return [("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.so_reuseport", int(reuse_port))]


async def start_grpc_server(engine: Any, host: str, port: int, max_message_bytes: int,
                            reuse_port: bool = False) -> tuple[grpc.aio.Server, int]:
    """A started grpc.aio server on ``host:port`` (0 picks a port); returns it and its port.

    ``reuse_port`` is for front-end workers sharing one port (the engine process checked
    that the port is free first); without it a port in use is refused. Raises ``OSError``
    when the address cannot be bound (grpcio's own error is a bare RuntimeError)."""
    server = grpc.aio.server(options=grpc_options(max_message_bytes, reuse_port))
    server.add_generic_rpc_handlers((generic_handler(InferenceService(engine)),))
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as e:
        raise OSError(f"grpcio: {e}") from None
    if not bound:
        raise OSError("grpcio could not bind it (address in use?)")
    await server.start()
    return server, bound
