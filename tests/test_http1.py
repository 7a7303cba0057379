"""The built-in HTTP/1.1 front-end (``runtime_py/server/http1.py``): framing driven byte by
byte through the protocol (every split of a pipelined stream, disconnect mid-body, 413
without reading, back-pressure), and a real server on loopback (keep-alive, pipelining,
HTTP/1.0, malformed requests, concurrent clients whose results equal ``model.infer``)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import numpy as np
import pytest

from runtime_py.batcher import Batcher
from runtime_py.server import ServerThread, create_app
from runtime_py.server.http1 import BuiltinHttpServer, HttpConnection, parse_head, BadRequest
from runtime_py.testing import ToyModel

pytest.importorskip("starlette")

MAX_BODY = 64 * 1024
TIMEOUT = 10.0


@pytest.fixture
def toy():
    model = ToyModel(name="toy", size=2)
    batcher = Batcher(model, max_delay_ms=0.5)
    app = create_app({"toy": model}, {"toy": batcher}, max_body_bytes=MAX_BODY)
    yield model, app
    model.gate = None
    batcher.close(drain=False, timeout=TIMEOUT)


def image(seed: int, size: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).random((1, 3, size, size), dtype=np.float32)


def infer_request(x: np.ndarray, extra_headers: bytes = b"") -> bytes:
    header = json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    body = header + x.tobytes()
    return (b"POST /v2/models/toy/infer HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n"
            b"Inference-Header-Content-Length: %d\r\n%s\r\n" % (len(body), len(header),
                                                              extra_headers)) + body


def read_responses(data: bytes) -> list[tuple[int, dict[bytes, bytes], bytes]]:
    """Every complete response in ``data``: (status, headers, body)."""
    out, pos = [], 0
    while (end := data.find(b"\r\n\r\n", pos)) >= 0:
        lines = data[pos:end].split(b"\r\n")
        headers = dict(line.lower().split(b": ", 1) for line in lines[1:])
        n = int(headers[b"content-length"])
        if len(data) < end + 4 + n:
            break
        out.append((int(lines[0].split()[1]), headers, data[end + 4:end + 4 + n]))
        pos = end + 4 + n
    return out


def logits_of(headers: dict, body: bytes) -> np.ndarray:
    n = int(headers[b"inference-header-content-length"])
    return np.frombuffer(body[n:], np.float32)


class FakeTransport(asyncio.Transport):
    """Records what the protocol writes and how it pauses; the 'kernel' side of a test."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = False
        self.reading = True
        self.hold = False           # True: writes stay 'unsent' (a slow client)
        self.protocol: HttpConnection | None = None

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 1), "sockname": ("127.0.0.1", 2)}.get(name, default)

    def set_write_buffer_limits(self, high=None, low=None):
        pass

    def writelines(self, parts):
        for p in parts:
            self.out += p
        if self.hold:
            self.protocol.pause_writing()

    def write(self, data):
        self.writelines([data])

    def close(self):
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def abort(self):
        self.close()

    def is_closing(self):
        return self.closed

    def pause_reading(self):
        self.reading = False

    def resume_reading(self):
        self.reading = True


async def drive(app, chunks: list[bytes], *, until: int, after=None,
                hold: bool = False) -> FakeTransport:
    """Feed ``chunks`` to a new connection as separate reads (each through ``get_buffer``,
    as the kernel would, waiting while reading is paused), then wait for ``until``
    responses."""
    server = BuiltinHttpServer(app)
    t = FakeTransport()
    t.hold = hold
    conn = HttpConnection(server)
    t.protocol = conn
    conn.connection_made(t)
    for chunk in chunks:
        pos = 0
        while pos < len(chunk):
            for _ in range(2000):
                if t.reading:
                    break
                await asyncio.sleep(0.001)
            assert t.reading, "reading stayed paused"
            buf = conn.get_buffer(-1)
            assert len(buf) > 0
            n = min(len(buf), len(chunk) - pos)
            buf[:n] = chunk[pos:pos + n]
            pos += n
            conn.buffer_updated(n)
    if after is not None:
        await after(conn, t)
    for _ in range(int(TIMEOUT * 1000)):
        if len(read_responses(bytes(t.out))) >= until and not server.tasks:
            break
        await asyncio.sleep(0.001)
    return t


def test_parse_head_refuses_ambiguous_framing():
    ok = parse_head(b"POST /v2/models/m%20x/infer?a=1 HTTP/1.0\r\nContent-Length: 5\r\n"
                    b"Connection: keep-alive")
    assert (ok.method, ok.path, ok.query, ok.length, ok.keep_alive) == \
        ("POST", "/v2/models/m x/infer", b"a=1", 5, True)
    assert parse_head(b"GET http://h:1/v2?x HTTP/1.1").path == "/v2"
    bad = {
        b"GET /v2 HTTP/2.0": 400,
        b"GET  /v2 HTTP/1.1": 400,
        b"G@T /v2 HTTP/1.1": 400,
        b"GET /v2 HTTP/1.1\r\nBad Header: x": 400,
        b"GET /v2 HTTP/1.1\r\nX: a\r\n folded": 400,
        b"GET /v2 HTTP/1.1\r\nX : a": 400,
        b"GET /v2 HTTP/1.1\r\nX: a\x00b": 400,
        b"POST /v2 HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2": 400,
        b"POST /v2 HTTP/1.1\r\nContent-Length: -1": 400,
        b"POST /v2 HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked": 400,
        b"POST /v2 HTTP/1.1\r\nTransfer-Encoding: gzip": 501,
        b"POST /v2 HTTP/1.1\r\nExpect: magic": 417,
    }
    for head, status in bad.items():
        with pytest.raises(BadRequest) as e:
            parse_head(head)
        assert e.value.status == status, head


def test_every_split_of_a_pipelined_stream_gives_the_same_answers(toy):
    model, app = toy
    x1, x2 = image(1), image(2)
    stream = (infer_request(x1) + b"GET /v2/health/live HTTP/1.1\r\n\r\n"
              + infer_request(x2, b"Connection: close\r\n"))
    want = [model.infer({"input": x})["logits"].ravel() for x in (x1, x2)]

    def check(t: FakeTransport) -> None:
        got = read_responses(bytes(t.out))
        assert [g[0] for g in got] == [200, 200, 200]
        assert np.array_equal(logits_of(*got[0][1:]), want[0])
        assert json.loads(got[1][2]) == {"live": True}
        assert np.array_equal(logits_of(*got[2][1:]), want[1])
        assert got[2][1][b"connection"] == b"close" and t.closed

    async def main():
        check(await drive(app, [stream[i:i + 1] for i in range(len(stream))],
                          until=3))
        for i in range(1, len(stream)):
            check(await drive(app, [stream[:i], stream[i:]], until=3))
    asyncio.run(main())


def test_disconnect_mid_body_returns_the_buffer_to_the_pool(toy):
    model, app = toy
    request = infer_request(image(3))
    size = len(request) - request.index(b"\r\n\r\n") - 4

    async def lost(conn, t):
        conn.connection_lost(None)

    async def main():
        for cut in (request.index(b"\r\n\r\n") + 4, len(request) - 1):
            t = await drive(app, [request[:cut]], until=0, after=lost)
            assert t.out == b"" and app.pool.held == size
            assert len(app.pool._free[size]) == 1     # the same buffer, back each time
    asyncio.run(main())
    assert model.calls == []


def test_oversize_body_is_refused_before_it_is_read(toy):
    model, app = toy
    head = (b"POST /v2/models/toy/infer HTTP/1.1\r\nContent-Length: %d\r\n"
            b"Inference-Header-Content-Length: 10\r\n\r\n" % (MAX_BODY + 1))

    async def main():
        t = await drive(app, [head + b"x" * 100], until=1)
        (status, headers, body), = read_responses(bytes(t.out))
        assert status == 413 and b"exceeds the limit" in body and t.closed
        assert app.pool.held == 0 and not app.pool._free   # no buffer was taken for it
    asyncio.run(main())


def test_next_request_waits_until_the_response_is_flushed(toy):
    """A client that does not read its answers: the protocol stops answering (and, once
    its input buffer is full, reading) instead of queueing responses without bound."""
    model, app = toy
    stream = infer_request(image(4)) * 3

    async def slow(conn, t):
        for _ in range(200):
            if read_responses(bytes(t.out)):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert len(read_responses(bytes(t.out))) == 1     # held: no second answer
        t.hold = False
        conn.resume_writing()

    async def main():
        t = await drive(app, [stream], until=3, after=slow, hold=True)
        assert [r[0] for r in read_responses(bytes(t.out))] == [200, 200, 200]
    asyncio.run(main())


# --- a real server on loopback ----------------------------------------------------------

@pytest.fixture
def served(toy):
    model, app = toy
    with ServerThread(app, http_server="builtin") as srv:
        yield model, app, srv


def _recv_all(sock: socket.socket, responses: int) -> list:
    data = b""
    sock.settimeout(TIMEOUT)
    while len(read_responses(data)) < responses:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return read_responses(data)


def test_keep_alive_pipelining_http10_and_close(served):
    model, app, srv = served
    xs = [image(i) for i in range(5)]
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        for x in xs[:2]:                                   # keep-alive, one at a time
            s.sendall(infer_request(x))
            (status, h, body), = _recv_all(s, 1)
            assert status == 200
            assert np.array_equal(logits_of(h, body), model.infer({"input": x})["logits"].ravel())
        s.sendall(b"".join(infer_request(x) for x in xs[2:]))   # pipelined: in order
        got = _recv_all(s, 3)
        for x, (status, h, body) in zip(xs[2:], got):
            assert np.array_equal(logits_of(h, body), model.infer({"input": x})["logits"].ravel())
    with socket.create_connection(("127.0.0.1", srv.port)) as s:   # HTTP/1.0: closed after
        s.sendall(b"GET /v2/health/live HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        (status, h, body), = _recv_all(s, 1)
        assert status == 200 and h[b"connection"] == b"keep-alive"
        s.sendall(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
        assert _recv_all(s, 1)[0][0] == 200
        assert s.recv(10) == b""


@pytest.mark.parametrize("request_bytes,status", [
    (b"NOT HTTP\r\n\r\n", 400),
    (b"GET /v2 HTTP/1.1\r\nno colon\r\n\r\n", 400),
    (b"GET /v2 HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n", 431),
    (b"POST /v2/models/toy/infer HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400),
    (b"POST /v2/models/toy/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
    (b"GET http://h\xd0/v2/health/live HTTP/1.1\r\n\r\n", 400),      # found by fuzzing:
    (b"GET http://[h/v2/health/live HTTP/1.1\r\n\r\n", 400),          # urlsplit raised
], ids=["request-line", "header-line", "head-too-large", "content-length", "chunk-size",
        "absolute-form-not-ascii", "absolute-form-bad-ipv6"])
def test_malformed_requests_get_a_4xx_and_the_connection_is_closed(served, request_bytes, status):
    model, app, srv = served
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        try:
            s.sendall(request_bytes)
        except OSError:
            pass    # the server may close before reading all of an oversize head
        got = _recv_all(s, 1)
        assert got[0][0] == status and "error" in json.loads(got[0][2])
        try:
            assert s.recv(10) == b""
        except ConnectionResetError:
            pass    # closed with the rest of the request unread: a reset, also closed
    with socket.create_connection(("127.0.0.1", srv.port)) as s:   # still serving
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\n\r\n")
        assert _recv_all(s, 1)[0][0] == 200


def test_chunked_and_expect_continue_bodies(served):
    model, app, srv = served
    x = image(7)
    full = infer_request(x)
    head, body = full.split(b"\r\n\r\n", 1)
    head = head.replace(b"Content-Length: %d" % len(body), b"Transfer-Encoding: chunked")
    chunked = head + b"\r\n\r\n" + b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 100]), body[i:i + 100])
                                         for i in range(0, len(body), 100)) + b"0\r\n\r\n"
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(chunked)
        (status, h, b), = _recv_all(s, 1)
        assert np.array_equal(logits_of(h, b), model.infer({"input": x})["logits"].ravel())
        s.sendall(full.replace(b"Host: t\r\n", b"Expect: 100-continue\r\n").split(b"\r\n\r\n")[0]
                  + b"\r\n\r\n")
        s.settimeout(TIMEOUT)
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(body)
        (status, h, b), = _recv_all(s, 1)
        assert status == 200


def test_concurrent_clients_get_their_own_results(served):
    """16 keep-alive clients with distinct images: each answer is model.infer of its own
    image (a body buffer handed to two requests at once would mix them up), and the
    batcher merged them."""
    model, app, srv = served
    errors: list[str] = []

    def client(k: int) -> None:
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            for i in range(15):
                x = image(1000 * k + i)
                s.sendall(infer_request(x))
                (status, h, body), = _recv_all(s, 1)
                if status != 200 or not np.array_equal(
                        logits_of(h, body), model.infer({"input": x})["logits"].ravel()):
                    errors.append(f"client {k} request {i}: {status}")

    threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert max(model.calls) > 1
    text = _get(srv, "/metrics")
    assert 'trt_bundle_requests_total{endpoint="infer",model="toy",status="200"} 240.0' in text


def _get(srv, path: str) -> str:
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(b"GET %s HTTP/1.1\r\n\r\n" % path.encode())
        return _recv_all(s, 1)[0][2].decode()


def test_worker_reads_the_body_into_its_arena_and_sends_it_by_place(toy):
    """In a front-end worker the body's destination is a block of the arena shared with the
    engine (64-byte aligned tensors), the message names its place, no second block is
    taken for a copy, and the block is free again once the engine has answered."""
    import mmap
    from types import SimpleNamespace

    from runtime_py.server import create_engine_app
    from runtime_py.server.engine import ModelInfo
    from runtime_py.server.workers import RemoteEngine, SlotArena, _messages

    model, _ = toy
    info = ModelInfo.of(model, SimpleNamespace(max_batch_size=8, max_delay_s=0.001))
    buf = mmap.mmap(-1, 16 * 4096)
    arena = SlotArena(buf, 4096, 16)
    sent: list[dict] = []

    class Conn:
        def send_bytes(self, data: bytes) -> None:
            sent.extend(_messages(data))

    engine = RemoteEngine(Conn(), arena, {"toy": info})
    app = create_engine_app(engine, max_body_bytes=MAX_BODY)
    x = image(5)
    want = model.infer({"input": x})["logits"]

    async def engine_side(conn, t):
        for _ in range(2000):
            infers = [m for m in sent if m.get("op") == "infer"]
            if infers:
                break
            await asyncio.sleep(0.001)
        msg, = infers
        (name, dtype, shape, (kind, offset)), = msg["feeds"]
        assert kind == "arena" and offset % 64 == 0
        got = np.frombuffer(buf, dtype, int(np.prod(shape)), offset).reshape(shape)
        assert np.array_equal(got, x)
        assert arena.free.count(False) == 1
        engine._resolve({"id": msg["id"], "ok": True, "outputs": [
            ["logits", "float32", list(want.shape), want.tobytes(), None]]})

    async def main():
        t = await drive(app, [infer_request(x)], until=1, after=engine_side)
        (status, h, body), = read_responses(bytes(t.out))
        assert status == 200 and np.array_equal(logits_of(h, body), want.ravel())
    asyncio.run(main())
    assert all(arena.free)
    assert [r[:3] for m in sent for r in m.get("records", ())] == [["toy", "infer", 200]]


def test_worker_sends_the_request_reports_of_one_loop_turn_in_one_message(toy):
    """A worker's reports of answered requests (``record_request``) are gathered over one
    turn of its event loop and sent together; a request to the engine made before they
    went carries them, so the engine applies them before it (``EngineHost.record``)."""
    import mmap
    from types import SimpleNamespace

    from runtime_py.server.engine import ModelInfo
    from runtime_py.server.workers import EngineHost, RemoteEngine, SlotArena, _messages

    model, _ = toy
    info = ModelInfo.of(model, SimpleNamespace(max_batch_size=8, max_delay_s=0.001))
    sent: list[dict] = []

    class Conn:
        def send_bytes(self, data: bytes) -> None:
            sent.extend(_messages(data))

    engine = RemoteEngine(Conn(), SlotArena(mmap.mmap(-1, 4 * 4096), 4096, 4), {"toy": info})
    recorded = []
    host = EngineHost(SimpleNamespace(record_request=lambda *a: recorded.append(list(a))))

    async def main():
        engine._loop = asyncio.get_running_loop()
        for k in range(3):
            engine.record_request("toy", "grpc_infer", 200, 0.001 * k)
        assert sent == []                       # not before the end of this turn
        await asyncio.sleep(0)
        assert [m["op"] for m in sent] == ["records"]

        async def answer_then_ask():   # a request answered, then another sent, in one turn
            engine.record_request("toy", "infer", 400, 0.5)
            return await engine._call({"op": "stats", "name": None, "version": None})
        call = asyncio.ensure_future(answer_then_ask())
        await asyncio.sleep(0)
        assert [m["op"] for m in sent] == ["records", "stats"]   # the report went with it
        engine._resolve({"id": sent[-1]["id"], "ok": True, "value": {}})
        await call
        await asyncio.sleep(0)
        assert len(sent) == 2                   # nothing left to flush

    asyncio.run(main())
    for m in sent:
        host.record(m)
    assert recorded == [["toy", "grpc_infer", 200, 0.0], ["toy", "grpc_infer", 200, 0.001],
                        ["toy", "grpc_infer", 200, 0.002], ["toy", "infer", 400, 0.5]]
    assert "records" not in sent[-1]            # taken off before the op is answered


def test_worker_and_engine_write_the_messages_of_one_loop_turn_as_one_frame(toy):
    """The requests a worker makes in one turn of its loop go to the engine in one frame,
    and the engine's replies of one turn (a batch's requests finish together) go back in
    one frame per worker; each reply still reaches its own request."""
    import mmap
    from types import SimpleNamespace

    from runtime_py.server.engine import ModelInfo
    from runtime_py.server.workers import (EngineHost, RemoteEngine, SlotArena, _Worker,
                                           _messages)

    model, _ = toy
    info = ModelInfo.of(model, SimpleNamespace(max_batch_size=8, max_delay_s=0.001))
    frames: list[list[dict]] = []

    class Conn:
        def send_bytes(self, data: bytes) -> None:
            frames.append(_messages(data))

    worker_side = RemoteEngine(Conn(), SlotArena(mmap.mmap(-1, 4 * 4096), 4096, 4),
                               {"toy": info})
    replies: list[list[dict]] = []

    class WorkerConn:
        def send_bytes(self, data: bytes) -> None:
            replies.append(_messages(data))

    async def stats(name, version):
        await asyncio.sleep(0.01)
        return {"model": name}
    host = EngineHost(SimpleNamespace(record_request=lambda *a: None, stats=stats))
    w = _Worker(0, None, WorkerConn(), None)

    async def main():
        loop = asyncio.get_running_loop()
        worker_side._loop = loop
        worker_side._outbox.bind(loop)
        w.outbox.bind(loop)
        calls = [asyncio.ensure_future(worker_side._call(
            {"op": "stats", "name": f"m{k}", "version": None})) for k in range(3)]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert [[m["name"] for m in f] for f in frames] == [["m0", "m1", "m2"]]
        await asyncio.gather(*(host.handle(w, m) for m in frames[0]))
        await asyncio.sleep(0)
        assert len(replies) == 1 and len(replies[0]) == 3
        for r in replies[0]:
            worker_side._resolve(r)
        got = await asyncio.gather(*calls)
        assert [g["value"]["model"] for g in got] == ["m0", "m1", "m2"]

    asyncio.run(main())


def test_a_frame_that_cannot_be_written_fails_its_requests_with_503(toy):
    import mmap
    from types import SimpleNamespace

    from runtime_py.server.engine import ModelInfo
    from runtime_py.server.protocol import RequestError
    from runtime_py.server.workers import RemoteEngine, SlotArena

    model, _ = toy
    info = ModelInfo.of(model, SimpleNamespace(max_batch_size=8, max_delay_s=0.001))

    class BrokenConn:
        def send_bytes(self, data: bytes) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    engine = RemoteEngine(BrokenConn(), SlotArena(mmap.mmap(-1, 4 * 4096), 4096, 4),
                          {"toy": info})
    released = []

    async def main():
        loop = asyncio.get_running_loop()
        engine._loop = loop
        engine._outbox.bind(loop)
        with pytest.raises(RequestError) as e:
            await engine._call({"op": "stats", "name": None, "version": None},
                               on_reply=lambda: released.append(1))
        assert e.value.status == 503 and released == [1]
        assert engine._pending == {}

    asyncio.run(main())
