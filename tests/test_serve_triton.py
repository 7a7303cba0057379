"""`bundle serve` against Triton's own clients: tritonclient.http and tritonclient.grpc
(sync, async, streaming, system shared memory) on a real small bundle, with the front-ends
in the engine process and in two worker processes. Outputs equal `model.infer`; every
malformed gRPC request and every misuse of shared memory gets a status code and the
server keeps serving; several workers feed one batcher; shutdown leaves nothing behind."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("tritonclient.grpc")
pytest.importorskip("starlette")

import tritonclient.grpc as tgrpc  # noqa: E402

try:
    import tritonclient.http as thttp
except RuntimeError as exc:   # tritonclient raises this, not ImportError, without gevent
    pytest.skip(f"tritonclient has no http support here ({exc.__cause__}): "
                "pip install 'tritonclient[http]'", allow_module_level=True)
import tritonclient.utils.shared_memory as tshm  # noqa: E402
from tritonclient.grpc import service_pb2 as pb  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_bundles import write_source_bundle  # noqa: E402

BUNDLE_CLI = [sys.executable, "-m", "bundler.cli"]
MODEL = "tiny-fp32-1"
MAX_BODY_MB = 1
STARTUP_S = 90


def _children(pid: int) -> list[int]:
    """Direct children of ``pid``, from /proc."""
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                kids.append(int(entry))
    return kids


def _commands(pids: list[int]) -> dict[int, str]:
    """Each pid's command line and state, for an assertion's message (a flake on a fresh
    machine, 2026-12-06, left no more than the test's name)."""
    found = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            cmd, state = "(gone)", "-"
        found[pid] = f"{state} {cmd[:200]}"
    return found


class Server:
    """`bundle serve` in a subprocess; ports read from its "serving on" line."""

    def __init__(self, bundle: Path, *args: str) -> None:
        cmd = [*BUNDLE_CLI, "serve", str(bundle), "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + STARTUP_S
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                raise AssertionError(f"server did not start: {self.log}") from None
            if line is None:
                raise AssertionError(f"server exited: {self.log}")
            m = re.search(r"serving on http://127\.0\.0\.1:(\d+)(?: and gRPC 127\.0\.0\.1:(\d+))?",
                          line)
            if m:
                self.http_port = int(m.group(1))
                self.grpc_port = int(m.group(2)) if m.group(2) else None
                break

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)
            self.lines.put(line)
        self.lines.put(None)

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def stop(self, sig: int = signal.SIGINT) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory) -> Path:
    return write_source_bundle(tmp_path_factory.mktemp("serve_triton"))


@pytest.fixture(scope="module")
def tiny_model(tiny_bundle):
    import runtime_py

    with runtime_py.load(tiny_bundle) as model:
        yield model


@pytest.fixture(scope="module", params=[(0, "builtin"), (2, "builtin"), (0, "grpcio"),
                                        (2, "grpcio")],
                ids=["in-process", "2-workers", "in-process-grpcio", "2-workers-grpcio"])
def server(request, tiny_bundle):
    """Each front-end layout with each gRPC server (the built-in HTTP/2 one, the default,
    and grpcio's): tritonclient must not tell them apart."""
    workers, grpc_server = request.param
    # "auto" dispatch: every test below also runs under the rule that measures itself
    # (and with --stage-ahead, which an ONNX Runtime engine ignores: the flag is taken)
    s = Server(tiny_bundle, "--grpc-port", "0", "--workers", str(workers),
               "--max-delay-ms", "20", "--max-body-mb", str(MAX_BODY_MB),
               "--early-dispatch", "auto", "--stage-ahead", "--grpc-server", grpc_server)
    s.workers = workers
    s.grpc_server = grpc_server
    yield s
    s.stop()


def image(seed: int, n: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 3, 8, 8), dtype=np.float32)


def close(a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def assert_serves(server: Server) -> None:
    """One good request over each protocol still succeeds."""
    x = image(99)
    for mod, url in ((thttp, server.http), (tgrpc, server.grpc)):
        c = mod.InferenceServerClient(url)
        i = mod.InferInput("input", x.shape, "FP32")
        i.set_data_from_numpy(x)
        assert c.infer(MODEL, [i]).as_numpy("logits").shape == (1, 4)
        c.close()


# --- health, metadata, Triton extensions -----------------------------------------------

@pytest.mark.parametrize("mod", [thttp, tgrpc], ids=["http", "grpc"])
def test_health_metadata_config_repository(server, tiny_model, mod):
    c = mod.InferenceServerClient(server.http if mod is thttp else server.grpc)
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready(MODEL)
    if mod is thttp:
        assert not c.is_model_ready("nope")
    else:   # as Triton: an unknown model is an error, not "not ready"
        with pytest.raises(InferenceServerException, match="NOT_FOUND"):
            c.is_model_ready("nope")
    as_json = mod is thttp
    meta = c.get_model_metadata(MODEL, as_json=True) if mod is tgrpc else c.get_model_metadata(MODEL)
    assert meta["name"] == MODEL and meta["inputs"][0]["datatype"] == "FP32"
    assert [int(d) for d in meta["inputs"][0]["shape"]] == [-1, 3, 8, 8]
    config = c.get_model_config(MODEL) if as_json else c.get_model_config(MODEL, as_json=True)["config"]
    assert int(config["max_batch_size"]) == tiny_model.max_batch_size == 4
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert [int(d) for d in config["input"][0]["dims"]] == [3, 8, 8]
    assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == 20000
    # the bundle is made with random weights: flagged where a client can see it
    assert config["parameters"]["random_weights"]["string_value"] == "true"
    if as_json:
        assert meta["parameters"]["random_weights"] is True
    index = c.get_model_repository_index() if as_json else \
        c.get_model_repository_index(as_json=True)["models"]
    assert [(m["name"], m["state"]) for m in index] == [(MODEL, "READY")]
    server_meta = c.get_server_metadata() if as_json else c.get_server_metadata(as_json=True)
    assert "system_shared_memory" in server_meta["extensions"]
    c.close()


# --- inference: sync, async, streaming --------------------------------------------------

@pytest.mark.parametrize("mod", [thttp, tgrpc], ids=["http", "grpc"])
def test_sync_infer_equals_model_infer(server, tiny_model, mod):
    c = mod.InferenceServerClient(server.http if mod is thttp else server.grpc)
    for seed, n in ((1, 1), (2, 3), (3, 4)):
        x = image(seed, n)
        i = mod.InferInput("input", x.shape, "FP32")
        i.set_data_from_numpy(x)
        r = c.infer(MODEL, [i], outputs=[mod.InferRequestedOutput("logits")], request_id=f"r{seed}")
        close(r.as_numpy("logits"), tiny_model.infer(x)["logits"])
        assert r.get_response(as_json=True)["id"] == f"r{seed}" if mod is tgrpc else \
            r.get_response()["id"] == f"r{seed}"
    c.close()


def test_async_infer_http_and_grpc(server, tiny_model):
    xs = [image(10 + k, 1 + k % 3) for k in range(8)]
    hc = thttp.InferenceServerClient(server.http, concurrency=4)
    pending = []
    for x in xs:
        i = thttp.InferInput("input", x.shape, "FP32")
        i.set_data_from_numpy(x)
        pending.append(hc.async_infer(MODEL, [i]))
    for x, p in zip(xs, pending):
        close(p.get_result().as_numpy("logits"), tiny_model.infer(x)["logits"])
    hc.close()

    gc = tgrpc.InferenceServerClient(server.grpc)
    results: dict[int, object] = {}
    done = threading.Event()

    def callback(k, result, error):
        results[k] = error if error is not None else result.as_numpy("logits")
        if len(results) == len(xs):
            done.set()

    for k, x in enumerate(xs):
        i = tgrpc.InferInput("input", x.shape, "FP32")
        i.set_data_from_numpy(x)
        gc.async_infer(MODEL, [i], callback=lambda result, error, k=k: callback(k, result, error))
    assert done.wait(30)
    for k, x in enumerate(xs):
        close(results[k], tiny_model.infer(x)["logits"])
    gc.close()


def test_grpc_stream_infer_with_an_error_in_the_stream(server, tiny_model):
    c = tgrpc.InferenceServerClient(server.grpc)
    got: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    xs = {f"s{k}": image(20 + k) for k in range(5)}
    for rid, x in xs.items():
        i = tgrpc.InferInput("input", x.shape, "FP32")
        i.set_data_from_numpy(x)
        c.async_stream_infer(MODEL, [i], request_id=rid)
    bad = tgrpc.InferInput("input", [1, 3, 8, 8], "FP16")
    bad.set_data_from_numpy(np.zeros((1, 3, 8, 8), np.float16))
    c.async_stream_infer(MODEL, [bad], request_id="bad")
    seen, errors = {}, []
    for _ in range(len(xs) + 1):
        result, error = got.get(timeout=30)
        if error is not None:
            errors.append(str(error))
        else:
            seen[result.get_response().id] = result.as_numpy("logits")
    c.stop_stream()
    c.close()
    assert len(errors) == 1 and "FP16" in errors[0]
    for rid, x in xs.items():
        close(seen[rid], tiny_model.infer(x)["logits"])


# --- malformed gRPC requests ------------------------------------------------------------

def _raw_request(shape=(1, 3, 8, 8), datatype="FP32", data: bytes | None = None,
                 model=MODEL, name="input", extra_raw=0) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name=model)
    req.inputs.add(name=name, datatype=datatype, shape=list(shape))
    if data is None:
        data = image(0).tobytes()
    req.raw_input_contents.append(data)
    for _ in range(extra_raw):
        req.raw_input_contents.append(data)
    return req


MALFORMED = {
    "shape does not match the bytes": (_raw_request(shape=(2, 3, 8, 8)),
                                       "INVALID_ARGUMENT", "needs"),
    "wrong non-batch dim": (_raw_request(shape=(1, 3, 8, 4), data=b"\0" * 384),
                            "INVALID_ARGUMENT", "input"),
    "dtype": (_raw_request(datatype="FP16", data=b"\0" * 384), "INVALID_ARGUMENT", "FP16"),
    "unknown dtype": (_raw_request(datatype="FLOAT"), "INVALID_ARGUMENT", "datatype"),
    "short bytes": (_raw_request(data=b"\0" * 10), "INVALID_ARGUMENT", "10 bytes"),
    "extra raw contents": (_raw_request(extra_raw=1), "INVALID_ARGUMENT", "raw_input_contents"),
    "negative dim": (_raw_request(shape=(-1, 3, 8, 8)), "INVALID_ARGUMENT", "shape"),
    "huge shape": (_raw_request(shape=(1 << 40, 1 << 40, 3, 8)), "INVALID_ARGUMENT", "shape"),
    "unknown input": (_raw_request(name="pixels"), "INVALID_ARGUMENT", "unknown input"),
    "unknown model": (_raw_request(model="nope"), "NOT_FOUND", "unknown model"),
    "no inputs": (pb.ModelInferRequest(model_name=MODEL), "INVALID_ARGUMENT", "inputs"),
    "oversize message": (_raw_request(shape=(1500, 3, 8, 8), data=b"\0" * (1500 * 768)),
                         "RESOURCE_EXHAUSTED", ""),
}


def test_malformed_grpc_requests_get_status_codes_and_server_keeps_serving(server):
    with grpc.insecure_channel(server.grpc) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                    request_serializer=pb.ModelInferRequest.SerializeToString,
                                    response_deserializer=pb.ModelInferResponse.FromString)
        for case, (req, code, text) in MALFORMED.items():
            with pytest.raises(grpc.RpcError) as e:
                infer(req, timeout=30)
                pytest.fail(f"{case}: accepted")
            assert e.value.code().name == code, case
            assert text in e.value.details(), (case, e.value.details())
        # a method the server does not have, and garbage bytes for a message
        raw = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as e:
            raw(b"\xff\xff\xff", timeout=30)
        assert e.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)
        cuda = channel.unary_unary("/inference.GRPCInferenceService/CudaSharedMemoryStatus")
        with pytest.raises(grpc.RpcError) as e:
            cuda(b"", timeout=30)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert_serves(server)


# --- system shared memory ---------------------------------------------------------------

@pytest.mark.parametrize("mod", [thttp, tgrpc], ids=["http", "grpc"])
def test_shared_memory_inputs_and_outputs(server, tiny_model, mod):
    tag = f"{mod.__name__.split('.')[-1]}_{server.workers}_{os.getpid()}"
    c = mod.InferenceServerClient(server.http if mod is thttp else server.grpc)
    x = image(30, 3)
    want = tiny_model.infer(x)["logits"]
    hin = tshm.create_shared_memory_region(f"in_{tag}", f"/trtb_in_{tag}", 64 + x.nbytes)
    hout = tshm.create_shared_memory_region(f"out_{tag}", f"/trtb_out_{tag}", 256)
    try:
        tshm.set_shared_memory_region(hin, [x], offset=64)
        c.register_system_shared_memory(f"in_{tag}", f"/trtb_in_{tag}", 64 + x.nbytes)
        c.register_system_shared_memory(f"out_{tag}", f"/trtb_out_{tag}", 256)
        status = c.get_system_shared_memory_status()
        names = [r["name"] for r in status] if mod is thttp else list(status.regions)
        assert f"in_{tag}" in names and f"out_{tag}" in names
        i = mod.InferInput("input", x.shape, "FP32")
        i.set_shared_memory(f"in_{tag}", x.nbytes, offset=64)
        o = mod.InferRequestedOutput("logits")
        o.set_shared_memory(f"out_{tag}", want.nbytes, offset=16)
        r = c.infer(MODEL, [i], outputs=[o])
        out = r.get_output("logits")
        params = out["parameters"] if mod is thttp else out.parameters
        region = params["shared_memory_region"]
        assert (region if mod is thttp else region.string_param) == f"out_{tag}"
        close(tshm.get_contents_as_numpy(hout, np.float32, [3, 4], offset=16), want)
        # an shm input with an output returned in the response
        r = c.infer(MODEL, [i])
        close(r.as_numpy("logits"), want)
        c.unregister_system_shared_memory(f"in_{tag}")
        c.unregister_system_shared_memory(f"out_{tag}")
        status = c.get_system_shared_memory_status()
        names = [r["name"] for r in status] if mod is thttp else list(status.regions)
        assert f"in_{tag}" not in names
    finally:
        tshm.destroy_shared_memory_region(hin)
        tshm.destroy_shared_memory_region(hout)
        c.close()


def _shm_error(fn) -> str:
    with pytest.raises(InferenceServerException) as e:
        fn()
    return f"{e.value.status()} {e.value.message()}"


@pytest.mark.parametrize("mod", [thttp, tgrpc], ids=["http", "grpc"])
def test_shared_memory_misuse_is_refused(server, mod):
    tag = f"m_{mod.__name__.split('.')[-1]}_{server.workers}_{os.getpid()}"
    bad = "400" if mod is thttp else "StatusCode.INVALID_ARGUMENT"
    c = mod.InferenceServerClient(server.http if mod is thttp else server.grpc)
    x = image(40)
    h = tshm.create_shared_memory_region(tag, f"/{tag}", x.nbytes)
    unlinked = False
    try:
        tshm.set_shared_memory_region(h, [x])
        # keys that do not exist, or that try to leave /dev/shm
        assert _shm_error(lambda: c.register_system_shared_memory(
            "r", "/no_such_key_" + tag, 16)).startswith(bad)
        assert _shm_error(lambda: c.register_system_shared_memory(
            "r", "/../etc/passwd", 16)).startswith(bad)
        # a window beyond the key's size
        assert _shm_error(lambda: c.register_system_shared_memory(
            tag, f"/{tag}", x.nbytes + 1)).startswith(bad)
        c.register_system_shared_memory(tag, f"/{tag}", x.nbytes)

        def infer_with(region, size, offset=0):
            i = mod.InferInput("input", x.shape, "FP32")
            i.set_shared_memory(region, size, offset=offset)
            return lambda: c.infer(MODEL, [i])

        assert "not registered" in _shm_error(infer_with("unregistered", x.nbytes))
        msg = _shm_error(infer_with(tag, x.nbytes, offset=4))
        assert msg.startswith(bad) and "beyond" in msg
        msg = _shm_error(infer_with(tag, x.nbytes - 4))
        assert msg.startswith(bad) and "needs" in msg
        # the client removes the key while it is still registered
        tshm.destroy_shared_memory_region(h)
        unlinked = True
        msg = _shm_error(infer_with(tag, x.nbytes))
        assert msg.startswith(bad) and "removed" in msg
        c.unregister_system_shared_memory(tag)
    finally:
        if not unlinked:
            tshm.destroy_shared_memory_region(h)
        c.close()
    assert_serves(server)


def test_unregister_while_a_request_uses_the_region_is_safe(server, tiny_model):
    """Requests keep their view of the region: unregistering (or re-registering) in the
    middle of a stream of requests never crashes the server or corrupts an answer."""
    tag = f"u_{server.workers}_{os.getpid()}"
    x = image(50, 2)
    want = tiny_model.infer(x)["logits"]
    h = tshm.create_shared_memory_region(tag, f"/{tag}", x.nbytes)
    c = tgrpc.InferenceServerClient(server.grpc)
    try:
        tshm.set_shared_memory_region(h, [x])
        outcomes = []

        def hammer():
            cc = tgrpc.InferenceServerClient(server.grpc)
            for _ in range(30):
                i = tgrpc.InferInput("input", x.shape, "FP32")
                i.set_shared_memory(tag, x.nbytes)
                try:
                    outcomes.append(cc.infer(MODEL, [i]).as_numpy("logits"))
                except InferenceServerException as e:
                    outcomes.append(str(e))
            cc.close()

        threads = [threading.Thread(target=hammer) for _ in range(3)]
        for t in threads:
            t.start()
        for _ in range(10):
            c.register_system_shared_memory(tag, f"/{tag}", x.nbytes)
            time.sleep(0.005)
            c.unregister_system_shared_memory(tag)
        for t in threads:
            t.join()
    finally:
        tshm.destroy_shared_memory_region(h)
        c.close()
    assert len(outcomes) == 90
    for o in outcomes:
        if isinstance(o, str):
            assert "not registered" in o
        else:
            close(o, want)
    assert_serves(server)


# --- statistics, metrics, several workers ----------------------------------------------

def test_concurrent_clients_are_batched_and_counted_once(server, tiny_model):
    """Concurrent requests on separate connections (spread over the workers) merge into
    batches of the one batcher, each gets its own rows back (a worker's arena block reused
    too early would hand it another request's input), and /metrics and the statistics
    count each request once."""
    import httpx

    before = thttp.InferenceServerClient(server.http).get_inference_statistics(MODEL)
    n_before = before["model_stats"][0]["inference_stats"]["success"]["count"]
    barrier = threading.Barrier(12)
    failures = []

    def client(k):
        mod = thttp if k % 2 else tgrpc
        c = mod.InferenceServerClient(server.http if mod is thttp else server.grpc)
        barrier.wait()
        for j in range(3):
            x = image(100 * k + j, 1 + (k + j) % 3)
            i = mod.InferInput("input", x.shape, "FP32")
            i.set_data_from_numpy(x)
            try:
                got = c.infer(MODEL, [i]).as_numpy("logits")
                close(got, tiny_model.infer(x)["logits"])
            except Exception as e:
                failures.append(e)
        c.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    stats = thttp.InferenceServerClient(server.http).get_inference_statistics(MODEL)
    s = stats["model_stats"][0]
    assert s["inference_stats"]["success"]["count"] - n_before == 36
    assert s["inference_count"] >= 36 * 2
    assert max(b["batch_size"] for b in s["batch_stats"]) > 1
    text = httpx.get(f"http://{server.http}/metrics", timeout=30).text

    def counter(endpoint):
        m = re.search(rf'trt_bundle_requests_total{{endpoint="{endpoint}",model="{MODEL}",'
                      rf'status="200"}} ([0-9.]+)', text)
        return float(m.group(1)) if m else 0.0

    assert counter("infer") >= 18 and counter("grpc_infer") >= 18, (text, server.log[-30:])
    assert re.search(r'trt_bundle_batch_size_bucket\{le="1.0",model="tiny-fp32-1"\} ([0-9.]+)', text)
    g = tgrpc.InferenceServerClient(server.grpc).get_inference_statistics(MODEL, as_json=True)
    assert int(g["model_stats"][0]["inference_stats"]["success"]["count"]) >= 36


# --- the command: ports, errors, shutdown ---------------------------------------------

def _shm_names() -> set[str]:
    """/dev/shm's entries less multiprocessing's named semaphores ("sem.mp-..."): the server
    makes none (no multiprocessing locks or queues; its workers' arenas are memfds), and
    a forkserver benchmark's queues (serve_bench's clients) name theirs there while they
    live, which a fresh-user run once saw appear during this test's shutdown check."""
    return {n for n in os.listdir("/dev/shm") if not n.startswith("sem.mp-")}


def test_serve_reports_caps_binds_and_shuts_down_cleanly(tiny_bundle):
    shm_before = _shm_names()
    s = Server(tiny_bundle, "--grpc-port", "0", "--workers", "2", "--max-batch", "64")
    try:
        log = "".join(s.log)
        assert "RANDOM WEIGHTS" in log
        assert "--max-batch 64 capped to 4" in log
        assert s.http_port > 0 and s.grpc_port > 0
        workers = _children(s.proc.pid)
        assert len(workers) == 2, (workers, _commands(workers))
        assert_serves(s)
        # a second server on the same ports fails with exit 7 and says why
        for args in (["--port", str(s.http_port)],
                     ["--port", "0", "--grpc-port", str(s.grpc_port), "--workers", "0"],
                     ["--port", "0", "--grpc-port", str(s.grpc_port), "--workers", "2"]):
            r = subprocess.run([*BUNDLE_CLI, "serve", str(tiny_bundle), *args],
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 7, (args, r.stderr)
            assert "error: cannot listen" in r.stderr or "error: cannot bind" in r.stderr
            assert "Traceback" not in r.stderr
    finally:
        code = s.stop(signal.SIGTERM)
    assert code == 0, "".join(s.log)[-3000:]
    one = Server(tiny_bundle, "--workers", "0")   # in-process front-end: drains, exits 0 too
    try:
        assert one.grpc_port is None and _children(one.proc.pid) == []
    finally:
        code = one.stop(signal.SIGTERM)
    assert code == 0, "".join(one.log)[-3000:]
    for pid in workers:
        assert _gone(pid), (pid, _commands([pid]))
    assert _shm_names() - shm_before == set()


@pytest.mark.parametrize("kind", ["builtin", "grpcio"])
def test_both_grpc_servers_refuse_a_taken_port_with_one_message(kind):
    """The same error class and advice whichever server tried (grpcio's own error is a
    RuntimeError; the CLI maps AddressInUseError to exit 7)."""
    import asyncio
    import socket

    from runtime_py.errors import AddressInUseError
    from runtime_py.server.run import start_grpc

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(AddressInUseError) as e:
            asyncio.run(start_grpc(kind, None, "127.0.0.1", port, 1 << 20))
    assert str(e.value).startswith(f"cannot listen for gRPC on 127.0.0.1:{port}: ")
    assert "--grpc-port (0 picks a free one)" in str(e.value)


@pytest.mark.parametrize("choice, passed", [("bundle", None), ("on", True), ("off", False)])
def test_serve_hands_its_cudnn_benchmark_choice_to_every_load(tmp_path, monkeypatch,
                                                             choice, passed):
    """`bundle serve --cudnn-benchmark`: "bundle" (default) leaves the runner option out,
    so each torch-aoti runner reads its manifest; on / off pass True / False to every
    bundle's load. The load here stops the command (nothing is served)."""
    from click.testing import CliRunner

    import runtime_py
    from bundler.cli import cli
    from runtime_py.errors import BundleError

    seen: list[dict] = []

    def load(path, **options):
        seen.append(options)
        raise BundleError("stop here")

    monkeypatch.setattr(runtime_py, "load", load)
    path = tmp_path / "a.bundle"
    path.write_bytes(b"")
    args = ["serve", str(path)] + ([] if choice == "bundle" else ["--cudnn-benchmark", choice])
    done = CliRunner().invoke(cli, args)
    assert "stop here" in done.output and len(seen) == 1, done.output
    assert seen[0].get("cudnn_benchmark", None) is passed
    assert ("cudnn_benchmark" in seen[0]) == (choice != "bundle")
    wrong = CliRunner().invoke(cli, ["serve", str(path), "--cudnn-benchmark", "yes"])
    assert wrong.exit_code == 2 and "'yes' is not one of 'bundle', 'on', 'off'" in wrong.output


def test_an_unknown_early_dispatch_rule_is_a_usage_error(tiny_bundle):
    r = subprocess.run([*BUNDLE_CLI, "serve", str(tiny_bundle), "--early-dispatch", "soon"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "'soon' is not one of 'off', 'on', 'auto'" in r.stderr
    assert "Traceback" not in r.stderr


def _sockets(pid: int) -> int:
    """How many sockets process ``pid`` holds open."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def _open_connections(conn) -> dict[str, int]:
    """The server's ``trt_bundle_frontend_connections`` gauge for HTTP, by worker, scraped
    over ``conn`` (a keep-alive connection)."""
    conn.request("GET", "/metrics")
    r = conn.getresponse()
    text = r.read().decode()
    assert r.status == 200
    found = re.findall(r'^trt_bundle_frontend_connections\{protocol="http",worker="(\d+)"\} '
                       r'(\S+)$', text, re.M)
    return {w: int(float(v)) for w, v in found}


def test_http_connections_are_dealt_out_evenly_to_the_workers(tiny_bundle):
    """The engine process accepts HTTP connections and hands each worker its share (with
    the listening socket shared, whichever worker woke first took it: on the H200 the
    busiest worker did 3x the idlest's work): 8 connections over 2 workers are 4 each,
    and every one is answered.

    Each kept connection follows a short one, as a client that registers its shared
    memory region over a connection of its own does. Counted as handed out, every short
    connection went to one worker and every kept one to the other (0 and 8); counted
    while open (workers report closes), the shares stay even, and the metrics gauge says
    so."""
    import http.client

    def connect():
        c = http.client.HTTPConnection("127.0.0.1", s.http_port, timeout=30)
        c.request("GET", "/v2/health/ready")
        r = c.getresponse()
        r.read()
        assert r.status == 200
        return c

    s = Server(tiny_bundle, "--workers", "2")
    conns = []
    try:
        workers = _children(s.proc.pid)
        before = {pid: _sockets(pid) for pid in workers}
        conns.append(connect())           # kept; /metrics is scraped over it
        for _ in range(7):
            connect().close()             # a short one first
            deadline = time.monotonic() + 10
            while sum(_open_connections(conns[0]).values()) != len(conns):
                assert time.monotonic() < deadline, _open_connections(conns[0])
                time.sleep(0.02)
            conns.append(connect())
        held = {pid: _sockets(pid) - before[pid] for pid in workers}
        assert sorted(held.values()) == [4, 4], held
        assert _open_connections(conns[0]) == {"0": 4, "1": 4}
        for c in conns:                                 # keep-alive: each still served
            c.request("GET", "/v2/health/live")
            assert c.getresponse().status == 200
    finally:
        for c in conns:
            c.close()
        assert s.stop(signal.SIGTERM) == 0


def _gone(pid: int) -> bool:
    """True once ``pid`` no longer exists (reaped by its parent)."""
    return not os.path.exists(f"/proc/{pid}")



# --- a uint8-input model (pixels, as uint8-input bundles take them) --------------------

@pytest.mark.parametrize("workers", [0, 1], ids=["in-process", "1-worker"])
def test_uint8_input_model_over_http_grpc_and_shared_memory(workers):
    """The server never assumes float32: UINT8 tensors in binary, raw and shared-memory
    form reach the model bit-exact (served through ``run.serve``, the code of the CLI)."""
    from runtime_py.server.run import serve
    from runtime_py.testing import ToyModel

    model = ToyModel("pixels", dtype="uint8", max_batch_size=8)
    ready, stop, addresses = threading.Event(), threading.Event(), {}

    def on_ready(a):
        addresses.update(a)
        ready.set()

    t = threading.Thread(target=serve, args=([model],), kwargs=dict(
        port=0, grpc_port=0, workers=workers, log_level="warning", on_ready=on_ready,
        stop=stop), daemon=True)
    t.start()
    try:
        assert ready.wait(60)
        x = np.random.default_rng(7).integers(0, 256, (2, 3, 8, 8), dtype=np.uint8)
        want = model.reference(x)
        tag = f"u8_{workers}_{os.getpid()}"
        h = tshm.create_shared_memory_region(tag, f"/{tag}", x.nbytes)
        tshm.set_shared_memory_region(h, [x])
        try:
            for mod, url in ((thttp, addresses["http"].split("//")[1]),
                             (tgrpc, addresses["grpc"])):
                c = mod.InferenceServerClient(url)
                meta = c.get_model_metadata("pixels", as_json=True) if mod is tgrpc else \
                    c.get_model_metadata("pixels")
                assert meta["inputs"][0]["datatype"] == "UINT8"
                i = mod.InferInput("input", x.shape, "UINT8")
                i.set_data_from_numpy(x)
                np.testing.assert_array_equal(c.infer("pixels", [i]).as_numpy("logits"), want)
                c.register_system_shared_memory(tag, f"/{tag}", x.nbytes)
                i = mod.InferInput("input", x.shape, "UINT8")
                i.set_shared_memory(tag, x.nbytes)
                np.testing.assert_array_equal(c.infer("pixels", [i]).as_numpy("logits"), want)
                c.unregister_system_shared_memory(tag)
                f = mod.InferInput("input", x.shape, "FP32")
                f.set_data_from_numpy(x.astype(np.float32))
                with pytest.raises(InferenceServerException, match="UINT8"):
                    c.infer("pixels", [f])
                c.close()
        finally:
            tshm.destroy_shared_memory_region(h)
    finally:
        stop.set()
        t.join(60)
    assert not t.is_alive()


def test_http_errors_cross_the_worker_boundary_with_their_status(server):
    """Refusals raised in the engine process reach the client with their own status and
    message, whichever process parsed the request."""
    import httpx

    with httpx.Client(base_url=f"http://{server.http}", timeout=30) as c:
        r = c.post(f"/v2/models/{MODEL}/classify", content=b"\x89PNG not really",
                   headers={"Content-Type": "image/png"})
        assert r.status_code == 400 and "preprocessing" in r.json()["error"]
        r = c.post("/v2/systemsharedmemory/region/x/register", content=b"{oops")
        assert r.status_code == 400 and "JSON" in r.json()["error"]
        r = c.get("/v2/systemsharedmemory/region/never/status")
        assert r.status_code == 404
        r = c.post("/v2/cudasharedmemory/region/x/register", json={})
        assert r.status_code == 400 and "not supported" in r.json()["error"]
        r = c.get("/v2/models/nope/config")
        assert r.status_code == 404
        r = c.get(f"/v2/models/{MODEL}/versions/0/stats")
        assert r.status_code == 404
