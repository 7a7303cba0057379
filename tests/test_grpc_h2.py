"""The built-in gRPC server (``runtime_py/server/grpc_h2.py``) at the HTTP/2 level: a raw
client that speaks frames, so that what tritonclient never sends (bad prefaces, oversize
frames, undecodable headers, split prefixes, resets, tiny windows) is exercised. The
tritonclient-level behaviour (every RPC, errors, shared memory, workers) is in
``test_serve_triton.py``, run against both gRPC servers."""

from __future__ import annotations

import gzip
import socket
import struct
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("tritonclient.grpc")
pytest.importorskip("starlette")

from tritonclient.grpc import service_pb2 as pb  # noqa: E402

from runtime_py.server import hpack  # noqa: E402
from runtime_py.server.grpc_h2 import (  # noqa: E402
    CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, MAX_FRAME, PADDED, PING,
    PREFACE, READ_AHEAD, RST_STREAM, SETTINGS, WINDOW_UPDATE, frame)

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_bundles import served_source_bundle  # noqa: E402

SERVICE = "/inference.GRPCInferenceService/"
COMPRESSION_ERROR, FRAME_SIZE_ERROR, PROTOCOL_ERROR = 9, 6, 1


@pytest.fixture(scope="module", params=[0, 1], ids=["in-process", "1-worker"])
def server(request, tmp_path_factory):
    """``serve`` on a thread with the built-in gRPC server: its gRPC port and model."""
    with served_source_bundle(tmp_path_factory.mktemp("grpc_h2"), workers=request.param,
                              grpc_server="builtin", max_body_bytes=1 << 20) as served:
        yield served


class Client:
    """HTTP/2 frames over a socket, by hand."""

    def __init__(self, port: int, settings: dict[int, int] | None = None,
                 preface: bytes = PREFACE) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        body = b"".join(struct.pack(">HI", k, v) for k, v in (settings or {}).items())
        self.sock.sendall(preface + frame(SETTINGS, 0, 0, body))
        self.buf = b""
        self.decoder = hpack.Decoder()

    def send(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def frame(self, timeout: float = 10.0) -> tuple[int, int, int, bytes] | None:
        """The next frame (type, flags, stream, payload); None when the server closed."""
        self.sock.settimeout(timeout)
        while True:
            if len(self.buf) >= 9:
                word, flags, sid = struct.unpack(">IBI", self.buf[:9])
                length, ftype = word >> 8, word & 0xFF
                if len(self.buf) >= 9 + length:
                    payload, self.buf = self.buf[9:9 + length], self.buf[9 + length:]
                    return ftype, flags, sid & 0x7FFFFFFF, payload
            try:
                got = self.sock.recv(1 << 16)
            except ConnectionResetError:
                return None
            if not got:
                return None
            self.buf += got

    def goaway(self) -> int:
        """The error code of the GOAWAY the server sends before closing."""
        while (f := self.frame()) is not None:
            if f[0] == GOAWAY:
                return struct.unpack(">I", f[3][4:8])[0]
        raise AssertionError("closed without a GOAWAY")

    def response(self, sid: int, timeout: float = 10.0) -> tuple[dict, bytes, dict]:
        """Headers, DATA bytes and trailers of stream ``sid`` (trailers-only: headers
        empty, the fields in trailers)."""
        blocks: list[dict] = []
        data = b""
        while True:
            f = self.frame(timeout)
            assert f is not None, "the server closed the connection"
            ftype, flags, fsid, payload = f
            if ftype == PING and not flags & 1:
                self.send(frame(PING, 1, 0, payload))
            if fsid != sid:
                continue
            if ftype == HEADERS:
                blocks.append(dict(self.decoder.decode(payload)))
            elif ftype == DATA:
                data += payload
            elif ftype == RST_STREAM:
                raise AssertionError(f"stream reset: {payload.hex()}")
            if ftype in (HEADERS, DATA) and flags & END_STREAM:
                head = blocks[0] if len(blocks) == 2 else {}
                return head, data, blocks[-1]


def request_headers(method: str, *, verb: bytes = b"POST",
                    content_type: bytes = b"application/grpc", extra=()) -> bytes:
    return hpack.encode_headers([(b":method", verb), (b":scheme", b"http"),
                                 (b":path", (SERVICE + method).encode()),
                                 (b":authority", b"test"), (b"content-type", content_type),
                                 (b"te", b"trailers"), *extra])


def message(msg, flag: int = 0) -> bytes:
    body = msg if isinstance(msg, bytes) else msg.SerializeToString()
    return bytes([flag]) + struct.pack(">I", len(body)) + body


def call(c: Client, sid: int, method: str, msg) -> tuple[dict, bytes, dict]:
    block = request_headers(method)
    c.send(frame(HEADERS, END_HEADERS, sid, block), frame(DATA, END_STREAM, sid, message(msg)))
    return c.response(sid)


def infer_request(model, x: np.ndarray) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name=model.name)
    req.inputs.add(name=model.inputs[0].name, datatype="FP32", shape=list(x.shape))
    req.raw_input_contents.append(x.tobytes())
    return req


class NoEngine:
    """An engine with no models: every inference is refused (NOT_FOUND) after it is
    received."""
    infos: dict = {}

    def lookup(self, name: str, version: str | None = None):
        from runtime_py.server.engine import lookup_info
        return lookup_info(self.infos, name, version)

    def record_request(self, model: str, endpoint: str, status: int, seconds: float) -> None:
        pass


async def bare_server(max_message_bytes: int, engine=None):
    """A built-in gRPC server (with no models by default), started on a free port;
    (server, client)."""
    import asyncio

    from runtime_py.server.grpc_h2 import BuiltinGrpcServer
    from runtime_py.server.run import listening_socket

    server = BuiltinGrpcServer(engine or NoEngine(), max_message_bytes)
    sock = listening_socket("127.0.0.1", 0)
    await server.start(sock)
    return server, await asyncio.to_thread(Client, sock.getsockname()[1])


async def frame_in_parts(server, c: Client, data: bytes, n: int):
    """Opens ModelInfer on stream 1 and sends the first ``n`` bytes of the DATA frame
    ``data``; the server's connection once it is taking that frame in parts."""
    import asyncio

    c.send(frame(HEADERS, END_HEADERS, 1, request_headers("ModelInfer")), data[:n])
    for _ in range(200):
        conns = list(server.connections)
        if conns and conns[0].data_left:
            return conns[0]
        await asyncio.sleep(0.01)
    raise AssertionError("the frame was not taken in parts")


def test_unary_calls_and_inference_equal_the_model(server):
    port, model = server
    c = Client(port)
    head, data, trailers = call(c, 1, "ServerLive", pb.ServerLiveRequest())
    assert head[b":status"] == b"200" and trailers[b"grpc-status"] == b"0"
    assert pb.ServerLiveResponse.FromString(data[5:]).live
    x = np.random.default_rng(0).random((2, 3, 8, 8), dtype=np.float32)
    _, data, trailers = call(c, 3, "ModelInfer", infer_request(model, x))
    assert trailers[b"grpc-status"] == b"0"
    resp = pb.ModelInferResponse.FromString(data[5:])
    out = np.frombuffer(resp.raw_output_contents[0], np.float32).reshape(resp.outputs[0].shape)
    want = model.infer({model.inputs[0].name: x})
    np.testing.assert_allclose(out, next(iter(want.values())), rtol=1e-5, atol=1e-5)


def test_a_message_split_over_tiny_padded_frames_and_continuations(server):
    """The 5-byte prefix and the message cut at every few bytes, padded DATA frames, the
    header block continued: all reassembled."""
    port, model = server
    c = Client(port)
    x = np.random.default_rng(1).random((1, 3, 8, 8), dtype=np.float32)
    body = message(infer_request(model, x))
    block = request_headers("ModelInfer")
    frames = [frame(HEADERS, 0, 1, block[:5]), frame(CONTINUATION, 0, 1, block[5:9]),
              frame(CONTINUATION, END_HEADERS, 1, block[9:])]
    for i in range(0, len(body), 3):
        piece = body[i:i + 3]
        if i % 2:
            frames.append(frame(DATA, PADDED, 1, bytes([4]) + piece + b"\0" * 4))
        else:
            frames.append(frame(DATA, 0, 1, piece))
    frames.append(frame(DATA, END_STREAM, 1, b""))
    c.send(*frames)
    _, data, trailers = c.response(1)
    assert trailers[b"grpc-status"] == b"0", trailers
    resp = pb.ModelInferResponse.FromString(data[5:])
    assert list(resp.outputs[0].shape)[0] == 1


def padded_infer_request(model, x: np.ndarray, pad: int) -> bytes:
    """An infer request made ``pad`` bytes longer by an unknown field (number 99) after
    its tensor: protobuf skips it, so the answer is the tensor's."""
    tail = b"\x9a\x06" + _varint(pad) + b"\x07" * pad     # field 99, length-delimited
    return infer_request(model, x).SerializeToString() + tail


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def test_a_large_frame_arriving_in_pieces_is_answered(server):
    """A 200 KB DATA frame sent 8 KB at a time (the server takes it in parts as the bytes
    come, ``_data_part``), its last piece in one write with the next frame (a PING): the
    answer equals the model's, the PING is answered, and the connection goes on."""
    port, model = server
    c = Client(port)
    x = np.random.default_rng(5).random((1, 3, 8, 8), dtype=np.float32)
    body = message(padded_infer_request(model, x, 200_000))
    data = frame(DATA, END_STREAM, 1, body)
    ping = frame(PING, 0, 0, b"12345678")
    c.send(frame(HEADERS, END_HEADERS, 1, request_headers("ModelInfer")))
    for i in range(0, len(data), 8192):
        piece = data[i:i + 8192]
        c.send(piece if i + 8192 < len(data) else piece + ping)
        time.sleep(0.002)
    _, out, trailers = c.response(1)
    assert trailers[b"grpc-status"] == b"0", trailers
    resp = pb.ModelInferResponse.FromString(out[5:])
    got = np.frombuffer(resp.raw_output_contents[0], np.float32).reshape(resp.outputs[0].shape)
    want = next(iter(model.infer({model.inputs[0].name: x}).values()))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    _, _, trailers = call(c, 3, "ServerLive", pb.ServerLiveRequest())
    assert trailers[b"grpc-status"] == b"0"


def test_a_refused_message_in_a_frame_taken_in_parts_drops_the_rest():
    """A frame taken in parts whose message is refused at its prefix (over the size
    limit): RESOURCE_EXHAUSTED, the frame's remaining bytes are dropped as they come, and
    a call after it on the same connection is answered. While the frame comes, the
    partial frame is not kept in the receive buffer (nothing left to move there); with
    no arena blocks to read into, reads stay long after it."""
    import asyncio

    async def main() -> None:
        server, c = await bare_server(1 << 16)
        payload = b"\0" + struct.pack(">I", 1 << 17) + b"\1" * 150_000
        data = frame(DATA, END_STREAM, 1, payload)
        conn = await frame_in_parts(server, c, data, 20_000)
        assert conn.data_left == len(payload) - (20_000 - 9)
        assert conn.start == conn.end, "a partial frame left in the receive buffer"
        c.send(data[20_000:])
        _, _, trailers = await asyncio.to_thread(c.response, 1)
        assert trailers[b"grpc-status"] == b"8", trailers
        _, out, trailers = await asyncio.to_thread(call, c, 3, "ServerLive",
                                                   pb.ServerLiveRequest())
        assert trailers[b"grpc-status"] == b"0" and conn.data_left == 0
        # no arena blocks here (the in-process server): big frames keep long reads
        assert len(conn.get_buffer(-1)) > READ_AHEAD
        await server.stop(grace=1.0)

    asyncio.run(main())


def test_a_message_with_an_arena_block_is_read_straight_into_it():
    """In a worker an inference's message gets a block of the engine's arena; once its
    DATA frame is taken in parts, the next reads go into that block (``get_buffer``
    returns a view of it), and the block holds the message's bytes when it is done. After
    a message in big frames the reads outside messages are short (``READ_AHEAD``: the
    next message's head, then its bulk into its block); after one in small frames, not."""
    import asyncio

    class ArenaEngine(NoEngine):
        def __init__(self) -> None:
            self.blocks: list[bytearray] = []
            self.released = 0

        def arena_block(self, size: int, aligned_at: int = 0):
            self.blocks.append(bytearray(size))
            return memoryview(self.blocks[-1]), self._release

        def _release(self) -> None:
            self.released += 1

    async def main() -> None:
        engine = ArenaEngine()
        server, c = await bare_server(1 << 20, engine)
        body = padded_infer_request(SimpleNamespace(name="m", inputs=[SimpleNamespace(
            name="x")]), np.ones((1, 3, 8, 8), np.float32), 150_000)
        data = frame(DATA, END_STREAM, 1, message(body))
        conn = await frame_in_parts(server, c, data, 20_000)
        into = conn.get_buffer(-1)        # what the next read would fill
        assert len(engine.blocks) == 1 and into.obj is engine.blocks[0]
        assert len(into) == len(body) - (20_000 - 9 - 5)
        c.send(data[20_000:])
        _, _, trailers = await asyncio.to_thread(c.response, 1)
        assert trailers[b"grpc-status"] == b"5", trailers  # NOT_FOUND, after receiving it
        assert bytes(engine.blocks[0]) == body and engine.released == 1
        assert len(conn.get_buffer(-1)) == READ_AHEAD
        small = [frame(DATA, 0, 3, data[i:i + 16384]) for i in range(9, len(data), 16384)]
        c.send(frame(HEADERS, END_HEADERS, 3, request_headers("ModelInfer")), *small,
               frame(DATA, END_STREAM, 3, b""))
        _, _, trailers = await asyncio.to_thread(c.response, 3)
        assert bytes(engine.blocks[1]) == body and engine.released == 2
        assert len(conn.get_buffer(-1)) > READ_AHEAD
        await server.stop(grace=1.0)

    asyncio.run(main())


def test_responses_wait_for_the_clients_window(server):
    """With a 10-byte stream window the server sends 10 bytes of DATA, then waits for the
    client's WINDOW_UPDATE before the rest and the trailers."""
    port, _ = server
    c = Client(port, {4: 10})
    c.send(frame(HEADERS, END_HEADERS, 1, request_headers("ServerMetadata")),
           frame(DATA, END_STREAM, 1, message(pb.ServerMetadataRequest())))
    got = b""
    while len(got) < 10:
        f = c.frame()
        assert f is not None
        if f[2] == 1 and f[0] == DATA:
            got += f[3]
        assert not (f[2] == 1 and f[1] & END_STREAM)
    assert len(got) == 10
    deadline = time.monotonic() + 0.3                # nothing more on stream 1 meanwhile
    while (left := deadline - time.monotonic()) > 0:
        try:
            f = c.frame(timeout=left)
        except TimeoutError:
            break
        assert f is not None and f[2] != 1, f
    c.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1 << 20)))
    _, rest, trailers = c.response(1)
    assert trailers[b"grpc-status"] == b"0"
    resp = pb.ServerMetadataResponse.FromString((got + rest)[5:])
    assert resp.name and "system_shared_memory" in resp.extensions


def test_gzip_compressed_request(server):
    port, model = server
    c = Client(port)
    x = np.random.default_rng(2).random((1, 3, 8, 8), dtype=np.float32)
    packed = gzip.compress(infer_request(model, x).SerializeToString())
    c.send(frame(HEADERS, END_HEADERS, 1,
                 request_headers("ModelInfer", extra=[(b"grpc-encoding", b"gzip")])),
           frame(DATA, END_STREAM, 1, message(packed, flag=1)))
    _, data, trailers = c.response(1)
    assert trailers[b"grpc-status"] == b"0", trailers
    assert pb.ModelInferResponse.FromString(data[5:]).outputs


@pytest.mark.parametrize("case", ["unknown-method", "not-post", "not-grpc", "truncated",
                                  "no-message", "two-messages", "oversize", "bad-protobuf",
                                  "compressed-without-encoding", "unknown-encoding"])
def test_refusals_end_the_stream_and_the_connection_keeps_serving(server, case):
    port, model = server
    c = Client(port)
    good = message(pb.ServerLiveRequest())
    method, body, extra, verb, ctype = "ServerLive", good, [], b"POST", b"application/grpc"
    if case == "unknown-method":
        method = "NoSuchMethod"
    elif case == "not-post":
        verb = b"GET"
    elif case == "not-grpc":
        ctype = b"application/json"
    elif case == "truncated":
        body = b"\0\0\0\0\x09abc"
    elif case == "no-message":
        body = b""
    elif case == "two-messages":
        body = good + good
    elif case == "oversize":
        method, body = "ModelInfer", b"\0" + struct.pack(">I", (1 << 20) + 1)
    elif case == "bad-protobuf":
        method, body = "ModelInfer", message(b"\xff\xff\xff")
    elif case == "compressed-without-encoding":
        body = message(b"", flag=1)
    elif case == "unknown-encoding":
        extra = [(b"grpc-encoding", b"snappy")]
    block = request_headers(method, verb=verb, content_type=ctype, extra=extra)
    c.send(frame(HEADERS, END_HEADERS, 1, block), frame(DATA, END_STREAM, 1, body))
    head, _, trailers = c.response(1)
    want = {"unknown-method": b"12", "truncated": b"13", "no-message": b"12",
            "two-messages": b"12", "oversize": b"8", "bad-protobuf": b"3",
            "compressed-without-encoding": b"13", "unknown-encoding": b"12"}
    if case == "not-post":
        assert trailers[b":status"] == b"405"
    elif case == "not-grpc":
        assert trailers[b":status"] == b"415"
    else:
        assert trailers[b"grpc-status"] == want[case], trailers
        assert trailers.get(b"grpc-message"), "a refusal says why"
    _, data, trailers = call(c, 3, "ServerLive", pb.ServerLiveRequest())
    assert trailers[b"grpc-status"] == b"0"


def test_a_reset_stream_is_dropped_and_the_connection_goes_on(server):
    port, model = server
    c = Client(port)
    x = np.random.default_rng(3).random((1, 3, 8, 8), dtype=np.float32)
    body = message(infer_request(model, x))
    c.send(frame(HEADERS, END_HEADERS, 1, request_headers("ModelInfer")),
           frame(DATA, 0, 1, body[:20]), frame(RST_STREAM, 0, 1, struct.pack(">I", 8)))
    c.send(frame(HEADERS, END_HEADERS, 3, request_headers("ModelInfer")),
           frame(DATA, END_STREAM, 3, body))
    _, data, trailers = c.response(3)
    assert trailers[b"grpc-status"] == b"0"


def test_ping_is_answered(server):
    port, _ = server
    c = Client(port)
    c.send(frame(PING, 0, 0, b"12345678"))
    while (f := c.frame()) is not None:
        if f[0] == PING:
            assert f[1] & 1 and f[3] == b"12345678"
            return
    raise AssertionError("no PING ACK")


@pytest.mark.parametrize("case", ["preface", "frame-size", "hpack", "even-stream",
                                  "stream-backwards", "data-on-idle", "settings-length",
                                  "continuation-missing"])
def test_connection_errors_get_a_goaway_with_the_code(server, case):
    port, _ = server
    ok = request_headers("ServerLive")
    if case == "preface":
        c = Client(port, preface=b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert c.goaway() == PROTOCOL_ERROR
        return
    c = Client(port)
    code = PROTOCOL_ERROR
    if case == "frame-size":
        c.send(struct.pack(">I", (MAX_FRAME + 1) << 8 | DATA)[:4] + b"\0" + struct.pack(">I", 1))
        code = FRAME_SIZE_ERROR
    elif case == "hpack":
        c.send(frame(HEADERS, END_HEADERS, 1, b"\x80"))   # index 0
        code = COMPRESSION_ERROR
    elif case == "even-stream":
        c.send(frame(HEADERS, END_HEADERS, 2, ok))
    elif case == "stream-backwards":
        c.send(frame(HEADERS, END_HEADERS, 5, ok), frame(DATA, END_STREAM, 5, message(b"")))
        c.response(5)
        c.send(frame(HEADERS, END_HEADERS, 3, ok))
    elif case == "data-on-idle":
        c.send(frame(DATA, 0, 7, b"abc"))
    elif case == "settings-length":
        c.send(frame(SETTINGS, 0, 0, b"\0\0\0"))
        code = FRAME_SIZE_ERROR
    elif case == "continuation-missing":
        c.send(frame(HEADERS, 0, 1, ok[:3]), frame(DATA, 0, 1, b"x"))
    assert c.goaway() == code


def test_a_stream_refused_midway_stops_its_handler():
    """A ModelStreamInfer whose request ends inside a message is INTERNAL, and nothing
    of it is left running (a refused stream must not leave a task waiting forever)."""
    import asyncio

    async def main() -> None:
        server, c = await bare_server(1 << 20)
        c.send(frame(HEADERS, END_HEADERS, 1, request_headers("ModelStreamInfer")),
               frame(DATA, END_STREAM, 1, b"\0\0\0\0\x09abc"))
        _, _, trailers = await asyncio.to_thread(c.response, 1)
        assert trailers[b"grpc-status"] == b"13", trailers
        for _ in range(100):
            if not server.tasks:
                break
            await asyncio.sleep(0.01)
        assert not server.tasks, server.tasks
        await server.stop(grace=1.0)

    asyncio.run(main())


def test_stream_messages_are_answered_each_then_ok_and_an_empty_stream_is_ok(server):
    port, model = server
    c = Client(port)
    x = np.random.default_rng(4).random((1, 3, 8, 8), dtype=np.float32)
    good = infer_request(model, x)
    good.id = "a"
    bad = pb.ModelInferRequest(model_name="no-such-model", id="b")
    c.send(frame(HEADERS, END_HEADERS, 1, request_headers("ModelStreamInfer")),
           frame(DATA, 0, 1, message(good) + message(bad)), frame(DATA, END_STREAM, 1, b""))
    head, data, trailers = c.response(1)
    assert head[b":status"] == b"200" and trailers[b"grpc-status"] == b"0"
    answers = {}
    while data:
        n = struct.unpack(">I", data[1:5])[0]
        r = pb.ModelStreamInferResponse.FromString(data[5:5 + n])
        answers[r.infer_response.id] = r
        data = data[5 + n:]
    assert set(answers) == {"a", "b"}
    assert not answers["a"].error_message and answers["a"].infer_response.outputs
    assert "no-such-model" in answers["b"].error_message
    c.send(frame(HEADERS, END_HEADERS | END_STREAM, 3, request_headers("ModelStreamInfer")))
    head, data, trailers = c.response(3)
    assert trailers[b"grpc-status"] == b"0" and data == b""


def test_a_dealt_connection_reports_its_close_with_its_tag():
    """A worker tells the engine when a connection dealt to it is gone
    (``run.receive_connections`` -> ``RemoteEngine.connection_closed``), so that the
    engine deals by connections open: reported once, with the connection's tag, only
    after the client closed it; a connection of a tag no server here takes is closed and
    reported at once."""
    import asyncio

    from runtime_py.server.grpc_h2 import BuiltinGrpcServer
    from runtime_py.server.run import receive_connections

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        server = BuiltinGrpcServer(object(), 1 << 20)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        closed: list[int] = []
        reported = asyncio.Event()

        def on_closed(tag: int) -> None:
            closed.append(tag)
            reported.set()

        receive_connections(loop, theirs, {b"g"[0]: server}, on_closed)
        listener = socket.create_server(("127.0.0.1", 0))
        clients = []
        try:
            for tag in (b"x", b"g"):
                client = socket.create_connection(listener.getsockname())
                accepted, _ = listener.accept()
                socket.send_fds(ours, [tag], [accepted.fileno()])
                accepted.close()
                client.setblocking(False)
                clients.append(client)
            await asyncio.wait_for(reported.wait(), 10)
            assert closed == [b"x"[0]]          # the untaken tag, at once
            reported.clear()
            # the gRPC server's SETTINGS arrive: it serves the connection; nothing reported
            assert (await asyncio.wait_for(loop.sock_recv(clients[1], 9), 10))[3] == SETTINGS
            await asyncio.sleep(0.05)
            assert closed == [b"x"[0]]
            clients[1].close()
            await asyncio.wait_for(reported.wait(), 10)
            await asyncio.sleep(0.05)
            return closed
        finally:
            loop.remove_reader(theirs.fileno())
            for s in (ours, theirs, listener, *clients):
                s.close()
            for conn in list(server.connections):
                conn.transport.abort()

    assert asyncio.run(main()) == [b"x"[0], b"g"[0]]
