"""Serving throughput: the batcher, and HTTP, gRPC and shared memory over it, in one run.

    python benchmarks/serve_bench.py --synthetic            # numpy model, fixed cost per batch
    python benchmarks/serve_bench.py --synthetic --dtype uint8
    python benchmarks/serve_bench.py --bundle X.bundle      # a real bundle (runtime_py.load)

Figures (images per second, preprocessed tensors in, logits out; no image decoding):
  raw     model.infer on a ready batch of --batch images, back to back, one thread.
  batcher --clients threads, each submitting one image and waiting for its result.
          Target: >= 0.90 x raw.
  http / grpc / shm paths: --http-clients clients in --http-procs client processes, one
          image per request, against `runtime_py.server.run.serve` (the code of `bundle
          serve`) on loopback, each over the batcher alone with the same number of clients:
    http      binary tensor extension in and out, keep-alive connections
    grpc      ModelInfer with raw_input_contents (prebuilt request bytes) over its own
              connection, from the client named by --grpc-client (below)
    http_shm  HTTP JSON header only; input and output in a registered /dev/shm region
    grpc_shm  the same over gRPC
    grpc_stream  ModelStreamInfer: one bidirectional stream per client, kept open, one
              request on it at a time (what perf_analyzer --streaming does; grpcio's
              cost per message on an open stream is about half its cost per call)
          each with the front-ends in the engine process (--workers 0) and with front-end
          worker processes (--workers-list). Target: http >= 0.85, grpc >= 0.90,
          shm >= 0.95. The client processes share this host's CPUs with the server.
          Each path's ratio is over the batcher measured right before it (same clients):
          on a shared host the load changes over a run, and a reference measured a
          minute earlier moved the ratios by +-30%.

HTTP clients (--http-client): "raw" (default) is a lean keep-alive socket client, as wrk
is: the request's bytes are built once, sent with one sendall, and the response read with
recv_into into one preallocated buffer, so the clients (which share this host's CPUs with
the server) cost as little as they can. "stdlib" is the earlier http.client client (a
request built and parsed in Python each time), kept for comparison with older figures.
gRPC clients (--grpc-client): "raw" (default) is benchmarks/h2_grpc_client.py, the same
idea over HTTP/2 (what h2load or ghz are, and perf_analyzer is for Triton): the header
block and message are built once, sent with one sendmsg under the server's flow control
windows, and the answer's frames walked in Python. "grpcio" is grpcio's channel and bare
stub, what tritonclient.grpc wraps (--grpc-channels per-process: one connection per client
process); on the H200 it spent 0.45-0.62 ms of CPU per request against the raw HTTP
client's 0.10, and the clients' GIL then set the gRPC figure. "raw,grpcio" measures each.
The server's HTTP front-end is --http-server (builtin: runtime_py/server/http1.py, the
default of `bundle serve`; uvicorn: the ASGI server).

CPU by role (Linux; "n/a" elsewhere): next to each figure, the CPU time over the same
measured window (utime + stime of /proc/<pid>/stat, every thread) of the client processes,
each front-end worker process and the engine process (this one: batcher and model, and
the front-ends when workers=0), as seconds per 1000 images and as cores busy (1.00: one
core all the time), each process shown as "its cores/its busiest thread's cores". A role
whose processes, or their busiest threads (an event loop, grpcio's poller), sit at ~1.00
is what caps that path; `cpu_by_role` in --json.

A script, not a test: numbers depend on the host. The synthetic model sleeps --cost-ms
per batch (a GPU-like engine whose time barely grows with the batch and releases the GIL).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import socket
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_args import names_of, positive_int, positive_ints, stage_modes  # noqa: E402
from batch_timeline import BatchTimeline, format_summary  # noqa: E402
from role_cpu import RoleSampler, children_running, format_report  # noqa: E402
from runtime_py.batcher import EARLY_DISPATCH_RULES, Batcher  # noqa: E402
from runtime_py.server.run import GRPC_SERVERS  # noqa: E402

GRPC_CLIENTS = ("raw", "grpcio")


def make_model(args):
    if args.synthetic:
        from runtime_py.testing import ToyModel

        class LightToyModel(ToyModel):
            """A GPU engine's profile on the host: logits from the first 64 values of each
            row (the full ToyModel reads every byte), and ``infer_async`` as the GPU
            runners have it: batches run one after another on a "device" thread, so the
            batcher keeps two in flight (its copy-in of batch k+1 overlaps batch k)."""

            def __init__(self, *a, **kw):
                super().__init__(*a, **kw)
                from concurrent.futures import ThreadPoolExecutor
                self._device = ThreadPoolExecutor(1, thread_name_prefix="light-device")

            def reference(self, x: np.ndarray) -> np.ndarray:
                n = x.shape[0]
                m = x.reshape(n, -1)[:, :64].mean(axis=1, dtype=np.float32)
                return (m[:, None] * self.weight.sum(axis=0)[None]).astype(np.float32)

            def infer_async(self, feeds):
                from runtime_py.pending import Pending
                # no copy: the batcher frees a batch's slot only once it completed
                return Pending(self._device.submit(self.infer, feeds).result)

        cls = LightToyModel if args.light else ToyModel
        return cls("synthetic", size=args.image_size, max_batch_size=args.batch,
                   cost_ms=args.cost_ms, per_row_ms=args.per_row_ms, dtype=args.dtype)
    import runtime_py
    sizes = getattr(args, "cuda_graph_sizes", None)
    sized = {} if sizes is None else {"cuda_graph_sizes": sizes}
    model = runtime_py.load(args.bundle, backend=args.backend, **sized)
    if args.enqueue and hasattr(model.runner, "enqueue"):
        model.runner.enqueue = args.enqueue      # torch-aoti: "held" (default) or "torch"
    return model


def one_image(model, n: int = 1) -> dict[str, np.ndarray]:
    feeds = {}
    for spec in model.inputs:
        dims = spec.shape[1:]
        if any(not isinstance(d, int) or d < 0 for d in dims):
            raise SystemExit(f"input {spec.name} has dynamic dims {spec.shape}: not benchmarkable")
        rng = np.random.default_rng(0)
        feeds[spec.name] = (rng.random((n, *dims)) * (255 if spec.dtype == "uint8" else 1)
                            ).astype(spec.dtype)
    return feeds


def bench_raw(model, batch: int, seconds: float) -> float:
    feeds = one_image(model, batch)
    model.infer(feeds)                                   # warm-up
    done, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        model.infer(feeds)
        done += batch
    return done / elapsed


#: The batcher's per-batch timeline over each measured window (listener added in main).
TIMELINE = BatchTimeline()


def bench_batcher(batcher: Batcher, feeds, clients: int, seconds: float, warmup: float
                  ) -> tuple[float, dict]:
    """``clients`` threads, one image per request (``Batcher.infer``, the blocking call a
    threaded service makes); images completed per second, and the CPU of this process
    over the window (the clients are its threads here: role "engine").

    The clients' first requests are queued together by this thread, so that they start as
    one cohort: threads released by a barrier reach the batcher one GIL hand-off after
    another, milliseconds apart on a loaded host. Behind an engine with two batches in
    flight (the synthetic ``--light`` one, a GPU runner), clients split into two cohorts
    stay split: the batcher's cohort rule waits for the rows the last batch delivered,
    not for those still in flight. With the synthetic engine's fixed cost per batch that
    halves the figure (2-core: 384-392 against 688-752 img/s in the same run, for the
    batcher and for the network paths alike). Queuing together does not always prevent
    it: a batcher still expecting the previous window's smaller cohort can dispatch
    before the last of these are queued (seen once in three rounds). ``--repeats`` shows
    which windows split."""
    start = threading.Barrier(clients + 1)
    t_begin = t_end = 0.0
    counts = [0] * clients
    first: list = []

    def client(i: int) -> None:
        start.wait()
        first[i].result()
        n = 0
        while True:
            batcher.infer(feeds)
            now = time.perf_counter()
            if now >= t_end:
                break
            if now >= t_begin:
                n += 1
        counts[i] = n

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    t_begin = time.perf_counter() + warmup
    t_end = t_begin + seconds
    sampler = RoleSampler({"engine": [os.getpid()]})
    first.extend(batcher.submit(feeds) for _ in range(clients))
    start.wait()
    time.sleep(max(0.0, t_begin - time.perf_counter()))
    sampler.start()
    TIMELINE.start()
    time.sleep(max(0.0, t_end - time.perf_counter()))
    TIMELINE.stop()
    sampler.stop()
    for t in threads:
        t.join()
    return sum(counts) / seconds, sampler.report(sum(counts))


def _client_proc(kind: str, port: int, model: str, feeds: dict, threads: int, start,
                 warmup: float, seconds: float, out, ready, http_client: str = "raw",
                 grpc_channels: str = "per-client", grpc_client: str = "raw") -> None:
    """One client process: ``threads`` clients of one kind; completions in the window.

    The process says ``ready`` once its clients are connected, and every client sends its
    first request at ``start.value`` (set by the parent when all client processes are
    ready, the same moment in every process), then counts completions from ``warmup``
    seconds later for ``seconds``. Clients that start as soon as their process is up, on a
    loaded host, started up to seconds apart and could stay split into cohorts that
    alternate in part-empty batches for the whole run (a batching state, not a front-end
    cost: it halved the ratio of one run and not of the next, whichever the server); a
    start a fixed 3 s after spawning was missed by 32 processes on the H200 (their
    figures were 0.4x, their CPU unmeasured)."""
    counts = [0] * threads
    errors: list[str] = []
    made = threading.Barrier(threads + 1)

    def run(i: int) -> None:
        try:
            one = _client(kind, port, model, feeds, f"{os.getpid()}_{i}", http_client,
                          grpc_channels, grpc_client)
        except Exception as e:   # reported, not hidden: a failing path has no figure
            errors.append(f"{kind}: {type(e).__name__}: {e}")
            made.wait()
            return
        made.wait()
        try:
            while not start.value:
                time.sleep(0.005)
            t_start = start.value
            t_begin, t_end = t_start + warmup, t_start + warmup + seconds
            while (wait := t_start - time.time()) > 0:
                time.sleep(min(wait, 0.05))
            n = 0
            try:
                while True:
                    one()
                    now = time.time()
                    if now >= t_end:
                        break
                    if now >= t_begin:
                        n += 1
            finally:
                one.close()
            counts[i] = n
        except Exception as e:
            errors.append(f"{kind}: {type(e).__name__}: {e}")

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    made.wait()
    ready.put(os.getpid())
    for t in ts:
        t.join()
    out.put(errors[0] if errors else sum(counts))


class _Call:
    def __init__(self, fn, close):
        self.fn, self.close = fn, close

    def __call__(self):
        self.fn()


class _RawHttp:
    """One keep-alive HTTP/1.1 connection sending the same prebuilt request each time (the
    way wrk measures a server): one sendall, the response read with recv_into into a
    preallocated buffer, its status checked."""

    def __init__(self, port: int, path: str, body: bytes, headers: dict) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Content-Length: {len(body)}\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n")
        self.request = head.encode("latin-1") + body
        self.buf = bytearray(1 << 20)
        self.view = memoryview(self.buf)

    def __call__(self) -> None:
        self.sock.sendall(self.request)
        got, end = 0, -1
        while end < 0:
            n = self.sock.recv_into(self.view[got:])
            if not n:
                raise ConnectionError("the server closed the connection")
            got += n
            end = self.buf.find(b"\r\n\r\n", 0, got)
        head = bytes(self.buf[:end]).lower()
        i = head.find(b"\r\ncontent-length:") + 17
        j = head.find(b"\r\n", i)
        total = end + 4 + int(head[i:j if j > 0 else None])
        if total > len(self.buf):
            self.buf.extend(bytes(total - len(self.buf)))
            self.view = memoryview(self.buf)
        while got < total:
            n = self.sock.recv_into(self.view[got:total])
            if not n:
                raise ConnectionError("the server closed the connection")
            got += n
        if not head.startswith(b"http/1.1 200"):
            raise RuntimeError(f"{bytes(self.buf[:min(total, 300)])!r}")

    def close(self) -> None:
        self.sock.close()


def _client(kind: str, port: int, model: str, feeds: dict, tag: str,
            http_client: str = "raw", grpc_channels: str = "per-client",
            grpc_client: str = "raw") -> _Call:
    """A callable sending one request of ``kind``; ``.close()`` frees what it holds.

    gRPC clients: "raw" is ``h2_grpc_client`` (one connection per client, the request's
    bytes built once); "grpcio" is grpcio's channel and stub, what tritonclient wraps.

    gRPC: grpcio shares one TCP connection between the channels of a process that have
    the same target and arguments (its global subchannel pool; tritonclient's clients in
    one process do so). ``grpc_channels="per-client"`` gives each client its own
    connection (a local subchannel pool), as each HTTP client has its own; with
    "per-process" the connections are as many as the client processes, and the front-end
    workers, which share the port with SO_REUSEPORT (the kernel spreads connections, not
    requests), may get 0, 1 or more of them each."""
    from runtime_py.server.protocol import kserve_datatype

    path = f"/v2/models/{model}/infer"
    shm = None
    if kind.endswith("_shm"):
        shm = _ShmPair(port if kind.startswith("http") else None, feeds, tag)
    if kind.startswith("http"):
        if shm is None:
            header = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": kserve_datatype(v.dtype),
                                  "parameters": {"binary_data_size": v.nbytes}} for k, v in feeds.items()],
                      "parameters": {"binary_data_output": True}}
            h = json.dumps(header).encode()
            body = h + b"".join(np.ascontiguousarray(v).tobytes() for v in feeds.values())
            headers = {"Inference-Header-Content-Length": str(len(h)),
                       "Content-Type": "application/octet-stream"}
        else:
            body = json.dumps(shm.http_header()).encode()
            headers = {"Content-Type": "application/json"}

        def close():
            conn.close()
            if shm is not None:
                shm.close()

        if http_client == "raw":
            conn = _RawHttp(port, path, body, headers)
            return _Call(conn, close)
        conn = http.client.HTTPConnection("127.0.0.1", port)
        conn.connect()
        # http.client sends a body larger than its header buffer in a second write: without
        # TCP_NODELAY, Nagle + delayed ACK stall each request ~40 ms on loopback.
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def send():
            conn.request("POST", path, body=body, headers=headers)
            r = conn.getresponse()
            data = r.read()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {data[:200]!r}")
        return _Call(send, close)

    import grpc
    from tritonclient.grpc import service_pb2 as pb

    options = [("grpc.max_send_message_length", 1 << 30),
               ("grpc.max_receive_message_length", 1 << 30)]
    if grpc_channels == "per-client":
        options.append(("grpc.use_local_subchannel_pool", 1))
    req = pb.ModelInferRequest(model_name=model)
    for k, v in feeds.items():
        t = req.inputs.add(name=k, datatype=kserve_datatype(v.dtype), shape=list(v.shape))
        if shm is None:
            req.raw_input_contents.append(np.ascontiguousarray(v).tobytes())
        else:
            shm.grpc_params(t.parameters, k)
    if shm is not None:
        o = req.outputs.add(name=shm.out_name)
        shm.grpc_params(o.parameters, None)
    data = req.SerializeToString()

    def channel_of():
        return grpc.insecure_channel(f"127.0.0.1:{port}", options=options)

    if grpc_client == "raw":
        return _raw_grpc(kind, port, data, shm, channel_of)
    channel = channel_of()
    if shm is not None:
        shm.register_grpc(channel)
    infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    if kind == "grpc_stream":
        return _GrpcStream(channel, data)

    def close():
        if shm is not None:
            shm.close(channel)
        channel.close()
    return _Call(lambda: infer(data), close)


def _raw_grpc(kind: str, port: int, data: bytes, shm, channel_of) -> _Call:
    """``h2_grpc_client``'s unary call or stream with the prebuilt ``data``; a stream's
    answer that carries an error message raises (its first field, error_message, is
    serialized first when set). Shared-memory regions are registered and unregistered
    over a grpcio channel (``channel_of()``) opened for that alone."""
    from h2_grpc_client import StreamCall, UnaryCall

    if shm is not None:
        with channel_of() as channel:
            shm.register_grpc(channel)

    def close():
        one.close()
        if shm is not None:
            with channel_of() as channel:
                shm.close(channel)

    if kind != "grpc_stream":
        one = UnaryCall(port, "ModelInfer", data)
        return _Call(one, close)
    one = StreamCall(port, "ModelStreamInfer", data)

    def call():
        answer = one()
        if answer[:1] == b"\x0a":
            from tritonclient.grpc import service_pb2 as pb
            raise RuntimeError(pb.ModelStreamInferResponse.FromString(answer).error_message)
    return _Call(call, close)


class _GrpcStream:
    """One ModelStreamInfer stream held open: each call puts the prebuilt request on it and
    reads the one response (an error message in it raises)."""

    def __init__(self, channel, data: bytes) -> None:
        import queue

        from tritonclient.grpc import service_pb2 as pb

        self.channel, self.data, self.requests = channel, data, queue.SimpleQueue()
        self.parse = pb.ModelStreamInferResponse.FromString

        def requests():
            while (item := self.requests.get()) is not None:
                yield item
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer",
                                       response_deserializer=None)
        self.responses = stream(requests())

    def __call__(self) -> None:
        self.requests.put(self.data)
        msg = self.parse(next(self.responses))
        if msg.error_message:
            raise RuntimeError(msg.error_message)

    def close(self) -> None:
        self.requests.put(None)
        for _ in self.responses:      # the server ends the stream once ours has ended
            pass
        self.channel.close()


class _ShmPair:
    """One client's input and output regions in /dev/shm, registered with the server."""

    def __init__(self, http_port: int | None, feeds: dict, tag: str) -> None:
        from multiprocessing import shared_memory

        self.feeds = feeds
        self.in_bytes = sum(v.nbytes for v in feeds.values())
        self.out_name, self.out_bytes = "logits", 1 << 16
        self.key = f"bench_{tag}"
        self.mem_in = shared_memory.SharedMemory(self.key + "_in", create=True, size=self.in_bytes)
        self.mem_out = shared_memory.SharedMemory(self.key + "_out", create=True, size=self.out_bytes)
        off = 0
        self.offsets = {}
        for k, v in feeds.items():
            self.mem_in.buf[off:off + v.nbytes] = np.ascontiguousarray(v).tobytes()
            self.offsets[k] = (off, v.nbytes)
            off += v.nbytes
        self.http_port = http_port
        if http_port is not None:
            for suffix, size in (("_in", self.in_bytes), ("_out", self.out_bytes)):
                self._http("POST", f"/v2/systemsharedmemory/region/{self.key}{suffix}/register",
                           {"key": "/" + self.key + suffix, "offset": 0, "byte_size": size})

    def _http(self, method, path, doc=None):
        c = http.client.HTTPConnection("127.0.0.1", self.http_port)
        c.request(method, path, body=json.dumps(doc or {}).encode())
        r = c.getresponse()
        r.read()
        c.close()
        if r.status != 200:
            raise RuntimeError(f"{path}: HTTP {r.status}")

    def http_header(self) -> dict:
        from runtime_py.server.protocol import kserve_datatype
        return {"inputs": [{"name": k, "shape": list(v.shape), "datatype": kserve_datatype(v.dtype),
                            "parameters": {"shared_memory_region": self.key + "_in",
                                           "shared_memory_offset": self.offsets[k][0],
                                           "shared_memory_byte_size": self.offsets[k][1]}}
                           for k, v in self.feeds.items()],
                "outputs": [{"name": self.out_name, "parameters": {
                    "shared_memory_region": self.key + "_out",
                    "shared_memory_byte_size": self.out_bytes}}]}

    def register_grpc(self, channel) -> None:
        from tritonclient.grpc import service_pb2 as pb
        reg = channel.unary_unary("/inference.GRPCInferenceService/SystemSharedMemoryRegister",
                                  request_serializer=pb.SystemSharedMemoryRegisterRequest.SerializeToString)
        for suffix, size in (("_in", self.in_bytes), ("_out", self.out_bytes)):
            reg(pb.SystemSharedMemoryRegisterRequest(name=self.key + suffix, key="/" + self.key + suffix,
                                                     offset=0, byte_size=size))

    def grpc_params(self, params, input_name) -> None:
        if input_name is None:
            params["shared_memory_region"].string_param = self.key + "_out"
            params["shared_memory_byte_size"].int64_param = self.out_bytes
        else:
            params["shared_memory_region"].string_param = self.key + "_in"
            params["shared_memory_offset"].int64_param = self.offsets[input_name][0]
            params["shared_memory_byte_size"].int64_param = self.offsets[input_name][1]

    def close(self, channel=None) -> None:
        try:
            if self.http_port is not None:
                for suffix in ("_in", "_out"):
                    self._http("POST", f"/v2/systemsharedmemory/region/{self.key}{suffix}/unregister")
            elif channel is not None:
                from tritonclient.grpc import service_pb2 as pb
                unreg = channel.unary_unary(
                    "/inference.GRPCInferenceService/SystemSharedMemoryUnregister",
                    request_serializer=pb.SystemSharedMemoryUnregisterRequest.SerializeToString)
                for suffix in ("_in", "_out"):
                    unreg(pb.SystemSharedMemoryUnregisterRequest(name=self.key + suffix))
        finally:
            for m in (self.mem_in, self.mem_out):
                m.close()
                m.unlink()


class _Server:
    """``run.serve`` over one batcher on a background thread (the code of `bundle serve`)."""

    def __init__(self, model, batcher: Batcher, workers: int, http_server: str = "builtin",
                 grpc_server: str = "builtin") -> None:
        from runtime_py.server.engine import Engine
        from runtime_py.server.run import bind_http

        self.engine = Engine({model.name: model}, {model.name: batcher})
        self.sock = bind_http("127.0.0.1", 0)
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.addresses: dict = {}
        self.workers = workers
        self.http_server = http_server
        self.grpc_server = grpc_server
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from runtime_py.server.run import _serve_here, run_async
        from runtime_py.server.workers import serve_with_workers

        def on_ready(addresses):
            self.addresses = addresses
            self.ready.set()
        options = dict(max_body_bytes=1 << 30, log_level="warning", access_log=False,
                       on_ready=on_ready, stop=self.stop, http_server=self.http_server,
                       grpc_server=self.grpc_server)
        try:
            if self.workers:
                serve_with_workers(self.engine, self.sock, "127.0.0.1", 0, self.workers, **options)
            else:
                run_async(_serve_here(self.engine, self.sock, "127.0.0.1", 0, **options))
        except BaseException as e:
            self.error = e
            self.ready.set()

    def __enter__(self):
        self.thread.start()
        if not self.ready.wait(90) or self.error:
            raise SystemExit(f"server did not start: {self.error}")
        return self

    def port(self, kind: str) -> int:
        return int(self.addresses["http" if kind.startswith("http") else "grpc"].rsplit(":", 1)[1])

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(60)
        self.sock.close()
        self.engine.close()


def _client_context():
    """The start method of the client processes: a fork server that has imported numpy
    and the runtime's server modules once, so that each client process is a fork of it,
    not a new interpreter importing them. With "spawn", 32 client processes took ~17 s to
    come up per figure on the H200 (h200-2026-12-05/call2-pair.log), four times the
    figure's measured 4 s; here 16 took 1.9 s against 0.3-0.5 s. The fork server is
    single-threaded, so forking it is safe where forking this process (server and
    batcher threads) would not be. Modules are preloaded by their installed names: before
    3.12 the fork server does not get this script's sys.path (the benchmarks folder), and
    a preload it cannot import is skipped silently."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["__main__", "numpy", "runtime_py.server.run",
                                "runtime_py.server.protocol"])
    return ctx


def bench_path(kind: str, server: _Server, model, feeds, clients: int, procs: int,
               seconds: float, warmup: float, http_client: str = "raw",
               profile: str | None = None, grpc_channels: str = "per-client",
               grpc_client: str = "raw") -> tuple[float | str, dict]:
    """Images per second of one network path (or the first client error), and the CPU of
    each role over the measured window: the client processes, the front-end worker
    processes (none with workers=0: the front-ends then run in the engine process) and
    the engine process (this one: batcher, engine, and the front-ends with workers=0)."""
    ctx = _client_context()
    out, ready, start = ctx.Queue(), ctx.Queue(), ctx.Value("d", 0.0)
    procs = max(1, min(procs, clients))
    per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    ps = [ctx.Process(target=_client_proc, args=(kind, server.port(kind), model.name, feeds, n,
                                                 start, warmup, seconds, out, ready,
                                                 http_client, grpc_channels, grpc_client))
          for n in per]
    for p in ps:
        p.start()
    for _ in ps:                    # every client process up and connected (or failed)
        ready.get(timeout=120)
    t_start = time.time() + 0.2
    t_begin = t_start + warmup
    t_end = t_begin + seconds
    start.value = t_start
    hook = None
    if profile:
        hook = _start_profile(profile, t_begin, seconds, [p.pid for p in ps])
    workers = children_running(os.getpid(), "runtime_py.server.workers")
    sampler = RoleSampler({"clients": [p.pid for p in ps],
                           **({"workers": workers} if workers else {}),
                           "engine": [os.getpid()]})
    sampling = threading.Thread(target=_sample_window, args=(sampler, t_begin, t_end), daemon=True)
    sampling.start()
    got = [out.get(timeout=seconds + warmup + 90) for _ in ps]
    for p in ps:
        p.join()
    sampling.join()
    if hook is not None:
        hook.join()
    bad = [g for g in got if isinstance(g, str)]
    if bad:
        return bad[0], {}
    return sum(got) / seconds, sampler.report(sum(got))


def _sample_window(sampler: RoleSampler, t_begin: float, t_end: float) -> None:
    """Start ``sampler`` at ``t_begin`` and stop it at ``t_end`` (``time.time()`` clock, as
    the clients count completions by it)."""
    time.sleep(max(0.0, t_begin - time.time()))
    sampler.start()
    TIMELINE.start()
    time.sleep(max(0.0, t_end - time.time()))
    TIMELINE.stop()
    sampler.stop()


def _start_profile(command: str, t_begin: float, seconds: float,
                   clients: list[int]) -> threading.Thread:
    """Runs ``command`` (a shell line) when the measured window of a path begins, with
    ``{pid}`` the server's process (the front-end in the engine process runs here),
    ``{clients}`` the client processes' ids (comma-separated) and ``{seconds}``: e.g.
    ``py-spy record -p {pid} -d {seconds} -r 250 --format raw -o prof.txt``. Its output
    goes to stderr, after the path's clients have started."""
    import subprocess

    def run() -> None:
        time.sleep(max(0.0, t_begin - time.time()))
        line = command.format(pid=os.getpid(), clients=",".join(map(str, clients)),
                              seconds=max(1, int(seconds) - 1))
        subprocess.run(line, shell=True, stdout=sys.stderr)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


KINDS = ("http", "grpc", "http_shm", "grpc_shm", "grpc_stream")
TARGETS = {"http": 0.85, "grpc": 0.90, "http_shm": 0.95, "grpc_shm": 0.95, "grpc_stream": 0.90}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--bundle", help="path of a .bundle (loaded with runtime_py.load)")
    src.add_argument("--synthetic", action="store_true", help="numpy model with a fixed per-batch cost")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--early-dispatch", default="off", metavar="RULES",
                    help="the batcher's early_dispatch (bundle serve --early-dispatch): off, "
                         "on or auto; a comma-separated list (e.g. off,auto) measures each "
                         "path under each rule in turn, side by side (the order reversed "
                         "on every other path)")
    ap.add_argument("--stage-ahead", type=stage_modes, default="off", metavar="MODES",
                    help="the batcher's stage_ahead (bundle serve --stage-ahead): off, on, "
                         "or both (off,on) to measure each path with each, side by side")
    ap.add_argument("--enqueue", choices=["held", "torch"],
                    help="torch-aoti bundles: enqueue batches through CUDA runtime calls that "
                         "keep the GIL (held, the default) or through torch's calls")
    ap.add_argument("--event-sync", default=None, metavar="MODES",
                    help="torch-aoti bundles: how the batcher's completion thread waits for a "
                         "batch (the runner's event_sync; default: the runner's own, block): "
                         "spin or block; a comma-separated "
                         "list (spin,block) measures each path under each mode in turn, side "
                         "by side (the order reversed on every other path)")
    ap.add_argument("--batch", type=int, default=32, help="raw batch size and the batcher's max batch")
    ap.add_argument("--clients", type=int, default=32, help="batcher clients (single images)")
    ap.add_argument("--http-clients", type=int, default=16, help="clients of each network path")
    ap.add_argument("--http-procs", type=positive_ints, default="4", metavar="N[,N..]",
                    help="client processes per network path; several (e.g. 8,32): one figure "
                         "for each, side by side (how much of a path's time is its clients' "
                         "GIL: the clients of one process share one)")
    ap.add_argument("--paths", default=",".join(KINDS), help=f"comma-separated, of {KINDS}")
    ap.add_argument("--workers-list", default="0,2",
                    help="front-end worker counts to measure (0: in the engine process)")
    ap.add_argument("--pinned-slots-list", default="64",
                    help="slots of each worker's arena page-locked for a GPU engine "
                         "(runtime_py.server.workers.PINNED_SLOTS, 64); '64,0' measures each "
                         "path with the rows copied from the arenas and gathered on the host")
    ap.add_argument("--max-delay-ms", type=float, default=2.0)
    ap.add_argument("--seconds", type=float, default=5.0, help="measured time per figure")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--repeats", type=positive_int, default=1, metavar="N",
                    help="measure each path N times, each time next to its own batcher "
                         "figure (reference before the path, then after it, alternating); "
                         "the figure shown is the round with the median ratio, and every "
                         "round's ratio is printed (on a shared host one pair of 3-5 s "
                         "windows moved by +-10%%)")
    ap.add_argument("--cost-ms", type=float, default=20.0, help="synthetic: sleep per batch")
    ap.add_argument("--light", action="store_true",
                    help="synthetic: a GPU engine's profile (logits from 64 values per image, "
                         "so the host pays only the sleep; batches run on a device thread, "
                         "two in flight)")
    ap.add_argument("--per-row-ms", type=float, default=0.0, help="synthetic: extra sleep per image")
    ap.add_argument("--image-size", type=int, default=299, help="synthetic: input is 3 x N x N")
    ap.add_argument("--dtype", default="float32", choices=["float32", "uint8"],
                    help="synthetic: the input's dtype (uint8: pixels, 4x fewer bytes)")
    ap.add_argument("--http-server", default="builtin", choices=["builtin", "uvicorn"],
                    help="the server's HTTP front-end (bundle serve --http-server)")
    ap.add_argument("--grpc-server", type=names_of(GRPC_SERVERS), default="builtin",
                    metavar="NAME[,NAME..]",
                    help="the server's gRPC front-end (bundle serve --grpc-server): builtin, "
                         "grpcio, or both (gRPC paths measured with each, side by side)")
    ap.add_argument("--http-client", default="raw", choices=["raw", "stdlib"],
                    help="raw: lean keep-alive socket client (prebuilt request bytes); "
                         "stdlib: http.client, as before")
    ap.add_argument("--grpc-client", type=names_of(GRPC_CLIENTS), default="raw",
                    metavar="NAME[,NAME..]",
                    help="raw: h2_grpc_client, a lean HTTP/2 client (prebuilt request bytes, "
                         "as the raw HTTP client; perf_analyzer's part for Triton); grpcio: "
                         "grpcio's stub, what tritonclient wraps; both (raw,grpcio): each gRPC "
                         "path measured with each, side by side")
    ap.add_argument("--grpc-channels", default="per-client", choices=["per-client", "per-process"],
                    help="per-client: each gRPC client its own connection (default); "
                         "per-process: the clients of a process share one (grpcio's default "
                         "for channels of equal arguments, as tritonclient's are)")
    ap.add_argument("--profile-server", metavar="CMD",
                    help="shell command run at the start of each network path's measured "
                         "window; {pid}: the server process, {clients}: the client "
                         "processes, {seconds}: the window (e.g. py-spy record -p {pid} ...)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args(argv)
    rules = [r.strip() for r in args.early_dispatch.split(",") if r.strip()]
    bad = [r for r in rules if r not in EARLY_DISPATCH_RULES]
    if not rules or bad:
        ap.error(f"--early-dispatch: each rule must be off, on or auto, got {bad or rules}")

    syncs = [m.strip() for m in (args.event_sync or "").split(",") if m.strip()]
    from runtime_py.engines.torch_aoti import EVENT_SYNC_MODES

    if args.event_sync is not None and (not syncs or any(m not in EVENT_SYNC_MODES
                                                         for m in syncs)):
        ap.error(f"--event-sync: each mode must be one of {', '.join(EVENT_SYNC_MODES)}, "
                 f"got {syncs}")

    model = make_model(args)
    set_sync = getattr(getattr(model, "runner", None), "set_event_sync", None)
    if set_sync is None and syncs:
        ap.error("--event-sync: only torch-aoti bundles have a choice")
    if syncs:
        set_sync(syncs[0])
    else:      # one figure per path, under the runner's own mode (none: not torch-aoti)
        syncs = [getattr(getattr(model, "runner", None), "event_sync", None)]
    procs_list = args.http_procs
    grpc_clients = args.grpc_client
    stages = args.stage_ahead
    variants = [(rule, stage, sync, procs) for rule in rules for stage in stages
                for sync in syncs for procs in procs_list]
    feeds = one_image(model, 1)
    raw = bench_raw(model, args.batch, args.seconds)
    paths = {}
    timelines = {}
    rule_use: dict[str, dict] = {}
    ratio_rounds: dict[str, list[float]] = {}
    with Batcher(model, max_batch_size=args.batch, max_delay_ms=args.max_delay_ms,
                 early_dispatch=rules[0], stage_ahead=stages[0] == "on") as b:
        b.add_listener(TIMELINE)
        batched, cpu_batched = bench_batcher(b, feeds, args.clients, args.seconds, args.warmup)
        timelines["batcher"] = TIMELINE.summary()
        batched_h, cpu_batched_h = bench_batcher(b, feeds, args.http_clients, args.seconds,
                                                 args.warmup)
        timelines["batcher_same_clients"] = TIMELINE.summary()
        refs, cpu = {}, {}
        if not args.json:   # each figure as it is measured (a run cut short keeps them)
            _print_head(model, args, raw, batched, batched_h, cpu_batched, cpu_batched_h,
                        timelines)
        from runtime_py.server import workers as workers_module

        default_pinned = workers_module.PINNED_SLOTS
        grpc_servers = args.grpc_server
        for workers, pinned, grpc_server in [
                (int(w), int(p), g) for w in args.workers_list.split(",") if w.strip()
                for p in args.pinned_slots_list.split(",") if p.strip() for g in grpc_servers]:
            if workers == 0 and pinned != default_pinned:
                continue     # no arenas without workers
            # paths other than gRPC are measured with the first gRPC server only
            kinds = [k for k in args.paths.split(",") if k and (
                grpc_server == grpc_servers[0] or k.startswith("grpc"))]
            if not kinds:
                continue
            workers_module.PINNED_SLOTS = pinned
            tag = f"_w{workers}" + (f"_p{pinned}" if pinned != default_pinned else "")
            try:
                with _Server(model, b, workers, args.http_server, grpc_server) as server:
                    # workers that just said hello still finish starting (imports, the gRPC
                    # server's threads): measured at once, the first path's batcher figure
                    # came out 25% low on the H200 (docs/measurements/h200-2026-12-02-c)
                    time.sleep(2.0)
                    for j, kind in enumerate(kinds):
                        each = [(*v, c) for v in variants for c in (
                            grpc_clients if kind.startswith("grpc") else [None])]
                        for rule, stage, sync, procs, client in (
                                each if j % 2 == 0 else each[::-1]):
                            key = kind + tag + (
                                f"_{grpc_server}" if len(grpc_servers) > 1
                                and kind.startswith("grpc") else "") + (
                                f"@{rule}" if len(rules) > 1 else "") + (
                                f"@stage-{stage}" if len(stages) > 1 else "") + (
                                f"@{sync}" if len(syncs) > 1 else "") + (
                                f"@p{procs}" if len(procs_list) > 1 else "") + (
                                f"@{client}" if client and len(grpc_clients) > 1 else "")
                            if sync is not None:
                                set_sync(sync)
                            rounds = []
                            for r in range(args.repeats):
                                rounds.append(_round(
                                    b, rule, stage == "on", r % 2 == 1, feeds, args,
                                    lambda: bench_path(
                                        kind, server, model, feeds, args.http_clients,
                                        procs, args.seconds, args.warmup, args.http_client,
                                        args.profile_server, args.grpc_channels,
                                        client or "raw")))
                                if args.repeats > 1 and not args.json:
                                    _print_round(key, r, rounds[-1])
                            mid = _median_round(rounds)
                            refs[key], paths[key], cpu[key], timelines[key], rule_use[key] = mid
                            if args.repeats > 1:
                                ratio_rounds[key] = [
                                    round(v / ref, 3) for ref, v, *_ in rounds
                                    if not isinstance(v, str)]
                            if not args.json:
                                _print_path(key, paths[key], refs, cpu, args, timelines,
                                            rule_use)
            finally:
                workers_module.PINNED_SLOTS = default_pinned
        sizes = dict(sorted(b.batch_size_counts.items()))
    result = {
        "model": model.name,
        "input": {k: [*v.shape[1:], v.dtype.name] for k, v in feeds.items()},
        "synthetic_cost_ms": args.cost_ms if args.synthetic else None,
        "raw_batch": args.batch,
        "raw_img_s": round(raw, 1),
        "batcher_clients": args.clients,
        "batcher_img_s": round(batched, 1),
        "batcher_over_raw": round(batched / raw, 3),
        "net_clients": args.http_clients,
        "http_server": args.http_server,
        "grpc_server": grpc_servers,
        "http_client": args.http_client,
        "grpc_channels": args.grpc_channels,
        "grpc_client": grpc_clients,
        "client_procs": procs_list,
        "batcher_same_clients_img_s": round(batched_h, 1),
        "paths_img_s": {k: (round(v, 1) if not isinstance(v, str) else v) for k, v in paths.items()},
        "batcher_before_each_path_img_s": {k: round(v, 1) for k, v in refs.items()},
        "paths_over_batcher": {k: round(v / refs[k], 3) for k, v in paths.items()
                               if not isinstance(v, str)},
        "repeats": args.repeats,
        "paths_over_batcher_rounds": ratio_rounds,
        "cpu_by_role": {"batcher": cpu_batched, "batcher_same_clients": cpu_batched_h, **cpu},
        "batch_size_counts": sizes,
        "timeline_ms": timelines,
        "early_dispatch": rules,
        "stage_ahead": stages,
        "event_sync": syncs,
        "dispatch_rule_use": rule_use,
        "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"batch sizes seen by the batcher: {sizes}")
    return result


def _print_head(model, args, raw, batched, batched_h, cpu_batched, cpu_batched_h,
                timelines) -> None:
    feeds = one_image(model, 1)
    print(f"model {model.name}  input { {k: [*v.shape[1:], v.dtype.name] for k, v in feeds.items()} }"
          f"  cpus {os.cpu_count()}  http server {args.http_server}, client {args.http_client}"
          f", grpc client {','.join(args.grpc_client)}"
          + (f" ({args.grpc_channels} connections)" if "grpcio" in args.grpc_client else "")
          + (f"  synthetic cost {args.cost_ms} ms/batch" if args.synthetic else ""))
    print(f"raw model.infer, batch {args.batch:<3}                  {raw:10.1f} img/s")
    print(f"batcher, {args.clients} clients x 1 image             {batched:10.1f} img/s"
          f"   {batched / raw:.3f} x raw      (target >= 0.90)")
    print(f"    {format_report(cpu_batched)}  (clients are threads of the engine process)")
    print(f"    {format_summary(timelines['batcher'])}")
    print(f"batcher, {args.http_clients} clients x 1 image             {batched_h:10.1f} img/s")
    print(f"    {format_report(cpu_batched_h)}")
    print(f"    {format_summary(timelines['batcher_same_clients'])}", flush=True)


def _round(b: Batcher, rule: str, stage: bool, path_first: bool, feeds, args,
           measure_path) -> tuple:
    """One path's figure and its batcher reference, measured back to back: (reference
    img/s, path img/s or its error, CPU by role, the path's timeline, its dispatch rule
    use). ``path_first`` puts the reference after the path (rounds alternate, so that a
    load that drifts over a round does not favour one side)."""
    ref = None
    b.stage_ahead = stage
    if not path_first:
        b.early_dispatch = rule      # a fresh choice for "auto"
        ref, _ = bench_batcher(b, feeds, args.http_clients, args.seconds, args.warmup)
    b.early_dispatch = rule
    batches0, early0, rows0, staged0 = b.batches, b.early_batches, b.rows, _staged_used(b)
    v, cpu = measure_path()
    timeline = TIMELINE.summary()
    use = _rule_use(b, batches0, early0)
    use["staged_share"] = round((_staged_used(b) - staged0) / max(1, b.rows - rows0), 3)
    if path_first:
        b.early_dispatch = rule
        ref, _ = bench_batcher(b, feeds, args.http_clients, args.seconds, args.warmup)
    return ref, v, cpu, timeline, use


def _staged_used(b: Batcher) -> int:
    """Rows the batcher's model found staged at dispatch and did not copy again (0 for a
    model that does not stage)."""
    return int(getattr(b.model, "staged_rows_used", 0))


def _median_round(rounds: list[tuple]) -> tuple:
    """The round whose ratio is the median (the lower one of an even count), so that the
    figure printed and its CPU and timeline come from one real round; a failed round
    makes the path failed."""
    failed = [r for r in rounds if isinstance(r[1], str)]
    if failed:
        return failed[0]
    ordered = sorted(rounds, key=lambda r: r[1] / r[0])
    return ordered[(len(ordered) - 1) // 2]


def _print_round(key: str, i: int, one: tuple) -> None:
    ref, v = one[0], one[1]
    shown = f"FAILED: {v}" if isinstance(v, str) else (
        f"{v:10.1f} img/s   {v / ref:.3f} x batcher ({ref:.0f})")
    print(f"    round {i + 1} of {key}: {shown}", flush=True)


def _rule_use(b: Batcher, batches0: int, early0: int) -> dict:
    """How the batcher's dispatch rule went over one path's run: the share of batches
    collected under the early rule and, for "auto", what its last trial measured."""
    batches = b.batches - batches0
    use = {"rule": b.dispatch_mode,
           "early_share": round((b.early_batches - early0) / batches, 3) if batches else 0.0}
    choice = b.dispatch_choice
    if choice is not None:
        use.update(chosen=choice.chosen, trials=choice.trials, switches=choice.switches,
                   last_rates_img_s=[round(r) for r in choice.last_rates or ()])
    return use


def _print_path(key: str, v: float | str, refs: dict, cpu: dict, args, timelines,
                rule_use: dict | None = None) -> None:
    base, _, rule = key.partition("@")
    rule = rule.replace("@", " ")
    kind, workers = base.rsplit("_w", 1)
    workers, _, pinned = workers.partition("_p")
    label = f"{kind:<8} {args.http_clients} clients, workers={workers}" + (
        f" pinned={pinned}" if pinned else "") + (f" {rule}" if rule else "")
    if isinstance(v, str):
        print(f"{label:<40} FAILED: {v}", flush=True)
        return
    print(f"{label:<40} {v:10.1f} img/s   {v / refs[key]:.3f} x batcher"
          f" ({refs[key]:.0f} just before)  (target >= {TARGETS[kind]:.2f})")
    print(f"    {format_report(cpu[key])}")
    print(f"    {format_summary(timelines[key])}", flush=True)
    use = (rule_use or {}).get(key)
    if use and (use["rule"] != "off" or use["early_share"]):
        print(f"    dispatch: {use}", flush=True)
    elif use and use.get("staged_share"):
        print(f"    rows staged ahead of their dispatch: {use['staged_share']:.0%}", flush=True)


if __name__ == "__main__":
    main()
