"""benchmarks/h2_grpc_client.py, the lean gRPC client serve_bench measures gRPC servers
with, against both of `bundle serve`'s gRPC servers: grpcio's (an independent HTTP/2
implementation: HPACK dynamic table, 64 KiB initial windows, 16 KiB frames, PINGs) and the
built-in one. Its answers must be the model's, and its errors the servers' status codes,
or the benchmark's figures would count failed calls."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("tritonclient.grpc")
pytest.importorskip("starlette")

import grpc  # noqa: E402
from tritonclient.grpc import service_pb2 as pb  # noqa: E402

from benchmark_modules import load_benchmark  # noqa: E402
from synthetic_bundles import served_source_bundle  # noqa: E402

_h2 = load_benchmark("h2_grpc_client")
GrpcStatusError, StreamCall, UnaryCall = _h2.GrpcStatusError, _h2.StreamCall, _h2.UnaryCall


@pytest.fixture(scope="module", params=["builtin", "grpcio"])
def server(request, tmp_path_factory):
    with served_source_bundle(tmp_path_factory.mktemp("h2_client"), workers=0,
                              grpc_server=request.param, max_body_bytes=4 << 20) as served:
        yield served


def infer_request(model, x: np.ndarray, name: str | None = None, pad: int = 0) -> bytes:
    """``pad`` bytes of a request parameter the server ignores make the message large
    (the model takes at most 4 tiny images)."""
    req = pb.ModelInferRequest(model_name=name or model.name)
    if pad:
        req.parameters["padding"].string_param = "x" * pad
    req.inputs.add(name=model.inputs[0].name, datatype="FP32", shape=list(x.shape))
    req.raw_input_contents.append(x.tobytes())
    return req.SerializeToString()


def output_of(resp) -> np.ndarray:
    return np.frombuffer(resp.raw_output_contents[0], np.float32).reshape(resp.outputs[0].shape)


def test_unary_calls_answer_what_the_model_does(server):
    """A 768 KB request is over grpcio's 64 KiB window and 16 KiB frames, so it goes out
    as the server's WINDOW_UPDATEs come."""
    port, model = server
    live = UnaryCall(port, "ServerLive", b"")
    assert pb.ServerLiveResponse.FromString(live()).live
    live.close()
    x = np.random.default_rng(0).random((4, 3, 8, 8), dtype=np.float32)
    want = next(iter(model.infer({model.inputs[0].name: x}).values()))
    call = UnaryCall(port, "ModelInfer", infer_request(model, x, pad=768_000))
    try:
        for _ in range(30):
            out = output_of(pb.ModelInferResponse.FromString(call()))
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    finally:
        call.close()


def test_a_failed_call_raises_its_status_and_the_connection_serves_on(server):
    port, model = server
    x = np.zeros((1, 3, 8, 8), np.float32)
    bad = UnaryCall(port, "ModelInfer", infer_request(model, x, name="no_such_model"))
    with pytest.raises(GrpcStatusError) as e:
        bad()
    assert e.value.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert "no_such_model" in e.value.message
    bad.set_request(infer_request(model, x))       # the same connection
    try:
        out = output_of(pb.ModelInferResponse.FromString(bad()))
        want = next(iter(model.infer({model.inputs[0].name: x}).values()))
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    finally:
        bad.close()


def test_a_stream_answers_each_message_and_ends_cleanly(server):
    port, model = server
    x = np.random.default_rng(1).random((3, 3, 8, 8), dtype=np.float32)
    want = next(iter(model.infer({model.inputs[0].name: x}).values()))
    stream = StreamCall(port, "ModelStreamInfer", infer_request(model, x, pad=300_000))
    for _ in range(10):
        msg = pb.ModelStreamInferResponse.FromString(stream())
        assert not msg.error_message
        np.testing.assert_allclose(output_of(msg.infer_response), want, rtol=1e-5, atol=1e-5)
    stream.close()       # reads the server's trailers: raises on a non-zero status


def test_the_client_keeps_within_the_servers_windows():
    """A hand-driven server grants 1,000 bytes per stream and tops the window up only once
    it is spent: every DATA frame must fit what was granted (the real servers grant MiBs,
    so they would not notice a client that ignored its windows)."""
    import socket
    import struct

    from runtime_py.server import hpack
    from runtime_py.server.grpc_h2 import (
        DATA, END_HEADERS, END_STREAM, HEADERS, PREFACE, SETTINGS, WINDOW_UPDATE, frame)

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    seen: dict = {"overruns": [], "data": 0}
    body = b"\x08\x01"            # what the server answers: any message
    request = bytes(range(256)) * 40          # 10,240 bytes

    def read_exact(sock, n):
        out = b""
        while len(out) < n:
            got = sock.recv(n - len(out))
            assert got, "the client closed"
            out += got
        return out

    def serve_one():
        sock, _ = listener.accept()
        with sock:
            assert read_exact(sock, len(PREFACE)) == PREFACE
            sock.sendall(frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 1000)))
            window = {"conn": 65535, "stream": 1000}
            while True:
                word, flags, sid = struct.unpack(">IBI", read_exact(sock, 9))
                length, ftype = word >> 8, word & 0xFF
                read_exact(sock, length)
                if ftype != DATA:
                    continue
                seen["data"] += length
                if length > min(window.values()):
                    seen["overruns"].append((length, dict(window)))
                window["conn"] -= length
                window["stream"] -= length
                if flags & END_STREAM:
                    break
                if window["stream"] <= 0:
                    window["stream"] += 1000
                    window["conn"] += 1000
                    sock.sendall(frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", 1000))
                                 + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1000)))
            sock.sendall(
                frame(HEADERS, END_HEADERS, sid, hpack.encode_headers(
                    [(b":status", b"200"), (b"content-type", b"application/grpc")]))
                + frame(DATA, 0, sid, b"\0" + struct.pack(">I", len(body)) + body)
                + frame(HEADERS, END_HEADERS | END_STREAM, sid,
                        hpack.encode_headers([(b"grpc-status", b"0")])))
            sock.recv(1)

    thread = threading.Thread(target=serve_one, daemon=True)
    thread.start()
    call = UnaryCall(port, "ModelInfer", request)
    try:
        assert call() == body
    finally:
        call.close()
    thread.join(10)
    listener.close()
    assert seen["data"] == len(request) + 5
    assert not seen["overruns"], f"DATA over the granted window: {seen['overruns'][:3]}"


def test_an_oversize_request_is_refused_and_the_connection_serves_on(server):
    """Both servers refuse a message over ``max_body_bytes`` (4 MiB here) before reading
    all of it: the client must stop sending and raise the status instead of waiting for
    window that will not come."""
    port, model = server
    x = np.zeros((1, 3, 8, 8), np.float32)
    call = UnaryCall(port, "ModelInfer", infer_request(model, x, pad=6 << 20))
    call.conn.sock.settimeout(20)
    try:
        with pytest.raises(GrpcStatusError) as e:
            call()
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        call.set_request(infer_request(model, x))
        out = output_of(pb.ModelInferResponse.FromString(call()))
        want = next(iter(model.infer({model.inputs[0].name: x}).values()))
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    finally:
        call.close()
