"""A lean gRPC client over one HTTP/2 connection, for measuring gRPC servers (what h2load
and ghz are to HTTP/2 and gRPC servers, and ``serve_bench``'s raw HTTP client to HTTP ones).

Why: on the H200 the Python gRPC client (grpcio, what ``tritonclient.grpc`` wraps) spent
0.45-0.62 ms of CPU per request against 0.10 ms for the raw HTTP client, and its threads
queue on their process's GIL; the clients then came back 4.2-5.1 ms after each batch
(HTTP: 3.2 ms) and the engine waited for them. The gRPC path's figure measured the client
as much as the server. Here the request's bytes (header block and length-prefixed
message) are built once; a call sends them in one ``sendmsg`` under the peer's flow
control windows and reads the answer with ``recv_into`` into one preallocated buffer,
walking the frames in Python. Triton's perf_analyzer (C++) plays this part for Triton.

It speaks what a gRPC client must: the preface and SETTINGS (waiting for the server's,
whose frame size and initial window it then honours), flow control both ways (it grants
2^31-1 per stream and gives the connection's bytes back with its next request), PING and
SETTINGS acknowledgements, HPACK decoding of every header block (grpcio's server indexes
into the dynamic table), and ``grpc-status`` / ``grpc-message`` in trailers, a non-zero
status raised as ``GrpcStatusError``. No TLS, compression or concurrent streams on one
connection: one call at a time, as each benchmark client makes them.
"""

from __future__ import annotations

import socket
import struct
from urllib.parse import unquote

from runtime_py.server import hpack
from runtime_py.server.grpc_h2 import (
    ACK, CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PADDED, PING,
    PREFACE, RST_STREAM, SETTINGS, WINDOW_UPDATE, frame)

SERVICE = "/inference.GRPCInferenceService/"
_FRAME = struct.Struct(">IBI")
_U32 = struct.Struct(">I")
_MAX_WINDOW = (1 << 31) - 1
_DEFAULT_WINDOW = 65535
_GIVE_BACK = 1 << 20      # connection bytes received before they are given back
_CANCEL = 8               # RST_STREAM's error code when we stop sending


class GrpcStatusError(RuntimeError):
    """A call that ended with a non-zero ``grpc-status``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"grpc-status {code}: {message}")
        self.code, self.message = code, message


def message(body: bytes) -> bytes:
    """``body`` as one uncompressed gRPC length-prefixed message."""
    return b"\0" + _U32.pack(len(body)) + body


class H2Connection:
    """One HTTP/2 connection: frames out under the peer's windows, frames in, one stream
    served at a time (``sid``)."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 60.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.authority = f"{host}:{port}".encode()
        self.buf = bytearray(1 << 20)
        self.view = memoryview(self.buf)
        self.start = self.end = 0
        self.decoder = hpack.Decoder()
        self.max_frame = 16384
        self.peer_initial = _DEFAULT_WINDOW      # the server's window for a new stream
        self.conn_window = _DEFAULT_WINDOW       # our sending window on the connection
        self.stream_window = 0                   # ... and on the current stream
        self.received = 0                        # connection bytes not yet given back
        self.pending: list[bytes] = []           # control frames to send with the next write
        self.next_sid = 1
        self.sid = 0
        self.early: list = []     # the current stream's frames read while sending
        self.blocks: dict[bytes, bytes] = {}     # request header block by path
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0, struct.pack(
            ">HIHI", 2, 0, 4, _MAX_WINDOW)) + frame(WINDOW_UPDATE, 0, 0, _U32.pack(
                _MAX_WINDOW - _DEFAULT_WINDOW)))
        self.settings_seen = False
        while not self.settings_seen:
            self._frame()

    # --- sending --------------------------------------------------------------------------

    def open(self, path: bytes, end_stream: bool = False) -> int:
        """A new stream with the request headers of ``path``: its id."""
        self.sid, self.next_sid = self.next_sid, self.next_sid + 2
        self.stream_window = self.peer_initial
        self.early.clear()
        block = self.blocks.get(path)
        if block is None:
            block = self.blocks[path] = hpack.encode_headers([
                (b":method", b"POST"), (b":scheme", b"http"), (b":path", path),
                (b":authority", self.authority), (b"content-type", b"application/grpc"),
                (b"te", b"trailers")])
        self.pending.append(frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0),
                                  self.sid, block))
        return self.sid

    def send(self, data: bytes | memoryview, end_stream: bool) -> None:
        """``data`` on the current stream as DATA frames, as fast as the windows allow
        (the frames wait in one ``sendmsg`` with anything pending). A server that answers
        before it has read everything (a refusal of an oversize message) ends the send:
        its frames are kept for ``read_stream`` and the rest of ``data`` is cancelled."""
        view = memoryview(data)
        pos, total = 0, len(view)
        while True:
            out = self.pending
            self.pending = []
            if self.received >= _GIVE_BACK:
                out.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self.received)))
                self.received = 0
            while pos < total:
                n = min(total - pos, self.max_frame, self.conn_window, self.stream_window)
                if n <= 0:
                    break
                last = pos + n == total
                out.append(_FRAME.pack(n << 8 | DATA, END_STREAM if last and end_stream else 0,
                                       self.sid))
                out.append(view[pos:pos + n])
                pos += n
                self.conn_window -= n
                self.stream_window -= n
            if total == 0 and end_stream:
                out.append(frame(DATA, END_STREAM, self.sid))
            if out:
                self._sendmsg(out)
            if pos >= total:
                return
            ftype, flags, sid, payload = self._frame()   # wait for window
            if sid != self.sid or ftype not in (DATA, HEADERS, RST_STREAM):
                continue
            self.early.append((ftype, flags, self._headers(flags, payload)
                               if ftype == HEADERS else bytes(payload)))
            if ftype == RST_STREAM or flags & END_STREAM:
                self.pending.append(frame(RST_STREAM, 0, self.sid, _U32.pack(_CANCEL)))
                return

    def _sendmsg(self, buffers: list) -> None:
        """All of ``buffers`` (a socket with a timeout may take part of a sendmsg)."""
        sent = self.sock.sendmsg(buffers)
        total = sum(len(b) for b in buffers)
        if sent < total:
            self.sock.sendall(b"".join(bytes(b) for b in buffers)[sent:])

    # --- receiving ------------------------------------------------------------------------

    def _fill(self, need: int) -> None:
        """At least ``need`` bytes buffered from ``start``."""
        if self.start + need > len(self.buf):
            n = self.end - self.start
            if need > len(self.buf):
                self.buf = bytearray(max(need, 2 * len(self.buf)))
                self.buf[:n] = self.view[self.start:self.end]
                self.view = memoryview(self.buf)
            else:
                self.buf[:n] = self.buf[self.start:self.end]
            self.start, self.end = 0, n
        while self.end - self.start < need:
            got = self.sock.recv_into(self.view[self.end:])
            if not got:
                raise ConnectionError("the server closed the connection")
            self.end += got

    def _frame(self) -> tuple[int, int, int, memoryview]:
        """The next frame (type, flags, stream, payload: valid until the next read), with
        the connection-level ones (SETTINGS, PING, WINDOW_UPDATE, GOAWAY) handled."""
        self._fill(9)
        word, flags, sid = _FRAME.unpack_from(self.buf, self.start)
        length, ftype = word >> 8, word & 0xFF
        self._fill(9 + length)
        payload = self.view[self.start + 9:self.start + 9 + length]
        self.start += 9 + length
        if self.start == self.end:
            self.start = self.end = 0
        sid &= 0x7FFFFFFF
        if ftype == DATA:
            self.received += length
        elif ftype == SETTINGS and not flags & ACK:
            for k in range(0, length, 6):
                key, value = struct.unpack_from(">HI", payload, k)
                if key == 4:
                    self.stream_window += value - self.peer_initial
                    self.peer_initial = value
                elif key == 5:
                    self.max_frame = value
            self.settings_seen = True
            self.pending.append(frame(SETTINGS, ACK, 0))
        elif ftype == PING and not flags & ACK:
            self.pending.append(frame(PING, ACK, 0, payload))
        elif ftype == WINDOW_UPDATE:
            inc = _U32.unpack_from(payload)[0] & 0x7FFFFFFF
            if sid == 0:
                self.conn_window += inc
            elif sid == self.sid:
                self.stream_window += inc
        elif ftype == GOAWAY:
            code = _U32.unpack_from(payload, 4)[0]
            raise ConnectionError(f"GOAWAY {code}: {bytes(payload[8:])!r}")
        return ftype, flags, sid, payload

    def _headers(self, flags: int, payload: memoryview) -> list[tuple[bytes, bytes]]:
        """The decoded header block starting with this HEADERS frame's payload."""
        if flags & PADDED:
            payload = payload[1:len(payload) - payload[0]]
        if flags & 0x20:        # PRIORITY
            payload = payload[5:]
        block = bytes(payload)
        while not flags & END_HEADERS:
            ftype, flags, _, payload = self._frame()
            if ftype != CONTINUATION:
                raise ConnectionError(f"frame type {ftype} inside a header block")
            block += bytes(payload)
        return self.decoder.decode(block)

    def read_stream(self, into: bytearray, until_message: bool) -> bool:
        """Reads the current stream's frames into ``into`` (its DATA payloads, appended)
        until its end (True) or, with ``until_message``, one whole gRPC message (False).
        A non-zero ``grpc-status`` raises ``GrpcStatusError``."""
        while True:
            if self.pending:
                self._sendmsg(self.pending)
                self.pending = []
            if self.early:
                ftype, flags, payload = self.early.pop(0)
            else:
                ftype, flags, sid, payload = self._frame()
                if sid != self.sid:
                    continue
                if ftype == HEADERS:
                    payload = self._headers(flags, payload)
            if ftype == DATA:
                if flags & PADDED:
                    payload = payload[1:len(payload) - payload[0]]
                into += payload
                if until_message and len(into) >= 5 and len(into) >= 5 + _U32.unpack_from(
                        into, 1)[0]:
                    return False
            elif ftype == HEADERS:
                fields = dict(payload)
                status = fields.get(b"grpc-status")
                if status is not None and status != b"0":
                    raise GrpcStatusError(int(status), unquote(
                        fields.get(b"grpc-message", b"").decode("latin-1")))
                if b":status" in fields and fields[b":status"] != b"200":
                    raise GrpcStatusError(-1, f"HTTP {fields[b':status'].decode()}")
            elif ftype == RST_STREAM:
                raise ConnectionError(f"stream reset: {_U32.unpack_from(payload)[0]}")
            if flags & END_STREAM and ftype in (DATA, HEADERS):
                return True

    def close(self) -> None:
        self.sock.close()


class UnaryCall:
    """Calls one unary RPC with the same prebuilt request on one connection; a call
    returns the response message's bytes (without its 5-byte prefix)."""

    def __init__(self, port: int, method: str, request: bytes) -> None:
        self.conn = H2Connection(port)
        self.path = (SERVICE + method).encode()
        self.request = message(request)
        self.answer = bytearray()

    def set_request(self, request: bytes) -> None:
        """Later calls send ``request`` (same method, same connection)."""
        self.request = message(request)

    def __call__(self) -> bytes:
        conn, answer = self.conn, self.answer
        del answer[:]
        conn.open(self.path)
        conn.send(self.request, end_stream=True)
        conn.read_stream(answer, until_message=False)
        if len(answer) < 5:
            raise GrpcStatusError(-1, "no response message")
        return bytes(answer[5:])

    def close(self) -> None:
        self.conn.close()


class StreamCall:
    """One ``ModelStreamInfer``-like stream held open: a call sends the prebuilt message
    on it and returns the one response message's bytes."""

    def __init__(self, port: int, method: str, request: bytes) -> None:
        self.conn = H2Connection(port)
        self.conn.open((SERVICE + method).encode())
        self.request = message(request)
        self.answer = bytearray()

    def __call__(self) -> bytes:
        answer = self.answer
        del answer[:]
        self.conn.send(self.request, end_stream=False)
        if self.conn.read_stream(answer, until_message=True):
            raise GrpcStatusError(-1, "the server ended the stream")
        n = _U32.unpack_from(answer, 1)[0]
        if len(answer) != 5 + n:
            raise GrpcStatusError(-1, "more than one message for one request")
        return bytes(answer[5:])

    def close(self) -> None:
        """Ends our side and reads the server's end (its trailers)."""
        try:
            self.conn.send(b"", end_stream=True)
            self.conn.read_stream(bytearray(), until_message=False)
        finally:
            self.conn.close()
