"""The built-in HTTP/1.1 front-end (``bundle serve --http-server builtin``, the default):
inference requests read from the socket straight into their final buffer.

Why: with uvicorn, a 1 MB binary tensor request cost ~2 ms of front-end CPU, of which
uvicorn's two copies of the body (``bytearray +=``, ``bytes()``) and our copy out of its
chunks were ~36%, and the response's two sends (headers, then body: the first one wakes
the client) ~17% (py-spy, docs/measurements/serve_2core.md). Here the connection is an
``asyncio.BufferedProtocol``: once the request head of ``POST /v2/models/{m}/infer`` with
a ``Content-Length`` is parsed, ``get_buffer`` hands the kernel the rest of the body's own
buffer (pooled; in a worker process a block of the arena it shares with the engine, see
``workers.RemoteEngine.body_buffer``), so ``recv_into`` writes the tensor bytes where the
engine reads them. The response goes out in one ``writelines``.

Everything else (the other routes, chunked bodies) is handed to the same ASGI app uvicorn
serves (``app.create_engine_app``) through a small adapter, with the body read whole
first (up to the body limit). What a request means (parsing, limits, errors, metrics) is
the app's; this module only frames HTTP/1.1.

Framing rules: requests on one connection are answered one at a time, in order
(pipelined requests wait in a 64 KiB input buffer; reading pauses when it is full, and
while a response is not yet flushed to a slow client: back-pressure both ways). A
malformed request line or header is a 400, a head over 64 KiB a 431, then the connection
is closed; a body over the limit is refused with 413 by its declared length, before it
is read, and the connection closed. A client that goes away mid-body gets its buffer back
to the pool at once; one that goes away while its request runs gets it back when the
engine has answered. HTTP/1.0 and ``Connection: close`` close after the response.
"""

from __future__ import annotations

import asyncio
import http
import logging
import re
import socket
import time
from email.utils import formatdate
from typing import Any, Callable
from urllib.parse import unquote, urlsplit

from .infer_route import _INFER, answer_infer, infer_label
from .protocol import RequestError

log = logging.getLogger(__name__)
access_log = logging.getLogger("runtime_py.server.access")

MAX_HEAD_BYTES = 64 * 1024          # request line + headers, as uvicorn/h11 allow
_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_REQUEST_LINE = re.compile(rb"(" + _TOKEN + rb") ([^\x00-\x20\x7f]+) HTTP/1\.([01])")
# a field value has no control characters but tab; obs-fold (a line starting with a space)
# is refused by the name pattern
_FIELD = re.compile(rb"(" + _TOKEN + rb"):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*")
_HEADER_LENGTH = b"inference-header-content-length"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class BadRequest(Exception):
    """A request whose framing cannot be trusted: answered with ``status``, then closed."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Head:
    """A parsed request line and header block."""

    __slots__ = ("method", "target", "path", "query", "minor", "headers", "length",
                 "chunked", "keep_alive", "expect_continue", "header_length")

    def __init__(self, method: str, target: bytes, minor: int,
                 headers: list[tuple[bytes, bytes]]) -> None:
        self.method, self.target, self.minor, self.headers = method, target, minor, headers
        self.length: int | None = None
        self.chunked = self.expect_continue = False
        self.keep_alive = minor == 1
        self.header_length: str | None = None
        raw = target
        if not raw.startswith(b"/"):
            if raw == b"*":
                raw = b"*"
            else:   # absolute form: http://host/path
                try:
                    parts = urlsplit(raw)
                except ValueError:    # non-ASCII bytes (UnicodeDecodeError), "http://[x/..."
                    raise BadRequest(f"malformed request target {target[:100]!r}") from None
                if not parts.scheme or not parts.netloc:
                    raise BadRequest(f"malformed request target {target[:100]!r}")
                raw = (parts.path or b"/") + (b"?" + parts.query if parts.query else b"")
        path, _, self.query = raw.partition(b"?")
        try:
            text = path.decode("ascii")
        except UnicodeDecodeError:
            raise BadRequest("the request target must be ASCII (percent-encode the rest)") from None
        self.path = unquote(text) if "%" in text else text


def parse_head(data: bytes) -> Head:
    """The request line and headers of ``data`` (the head without its final CRLF CRLF);
    ``BadRequest`` for anything the framing cannot be sure of (smuggling vectors included:
    two different Content-Lengths, Content-Length with Transfer-Encoding, obs-fold)."""
    lines = data.split(b"\r\n")
    line = _REQUEST_LINE.fullmatch(lines[0])
    if line is None:
        raise BadRequest(f"malformed request line {lines[0][:100]!r}")
    headers: list[tuple[bytes, bytes]] = []
    length = None
    connection: list[bytes] = []
    head = Head(line[1].decode("ascii"), line[2], int(line[3]), headers)
    for raw in lines[1:]:
        field = _FIELD.fullmatch(raw)
        if field is None:
            raise BadRequest(f"malformed header line {raw[:100]!r}")
        name, value = field[1].lower(), field[2]
        headers.append((name, value))
        if name == b"content-length":
            if not value.isdigit() or (length is not None and int(value) != length):
                raise BadRequest(f"invalid Content-Length {value[:40]!r}")
            length = int(value)
        elif name == b"transfer-encoding":
            if [c.strip() for c in value.lower().split(b",")] != [b"chunked"]:
                raise BadRequest(f"unsupported Transfer-Encoding {value[:40]!r}", 501)
            head.chunked = True
        elif name == b"connection":
            connection += [c.strip() for c in value.lower().split(b",")]
        elif name == b"expect":
            if value.lower() != b"100-continue":
                raise BadRequest(f"unsupported Expect {value[:40]!r}", 417)
            head.expect_continue = head.minor == 1
        elif name == _HEADER_LENGTH:
            head.header_length = value.decode("latin-1")
    if head.chunked and length is not None:
        raise BadRequest("a request has either Content-Length or Transfer-Encoding, not both")
    if head.chunked and head.minor == 0:
        raise BadRequest("chunked transfer coding needs HTTP/1.1")
    head.length = length
    if b"close" in connection:
        head.keep_alive = False
    elif b"keep-alive" in connection:
        head.keep_alive = True
    return head


_date_cache = [0, b""]


def _date_header() -> bytes:
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[:] = [now, b"date: " + formatdate(now, usegmt=True).encode() + b"\r\n"]
    return _date_cache[1]


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode("latin-1")


_STATUS_LINES = {s.value: _status_line(s.value) for s in http.HTTPStatus}


def response_head(status: int, headers: list[tuple[bytes, bytes]], close: bool,
                  http10: bool = False) -> bytes:
    """Status line and header block of a response; ``headers`` must have its length.
    An HTTP/1.0 client that asked for keep-alive is told it is kept."""
    parts = [_STATUS_LINES.get(status) or _status_line(status), _date_header()]
    parts += [b"%s: %s\r\n" % kv for kv in headers]
    if close:
        parts.append(b"connection: close\r\n")
    elif http10:
        parts.append(b"connection: keep-alive\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


def _error_body(message: str) -> bytes:
    from .infer_route import _error_json
    return _error_json(message)


class ChunkedBody:
    """Decodes a chunked request body, incrementally, into one bytearray; stops once it
    holds more than ``limit`` bytes (the app then refuses it with 413)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.left = -1        # bytes of the current chunk still to come; -1: a size line
        self.done = self.over = False
        self._trailers = False

    def feed(self, buf: bytearray, start: int, end: int) -> int:
        """Consume what it can of ``buf[start:end]``; returns the new start."""
        while start < end and not (self.done or self.over):
            if self.left > 0:
                n = min(self.left, end - start)
                self.data += buf[start:start + n]
                start += n
                self.left -= n
                if len(self.data) > self.limit:
                    self.over = True
                continue
            eol = buf.find(b"\r\n", start, end)
            if eol < 0:
                if end - start > 1024:
                    raise BadRequest("malformed chunked body")
                return start
            line = bytes(buf[start:eol])
            start = eol + 2
            if self._trailers:
                if not line:
                    self.done = True
                continue
            if self.left == 0:           # the CRLF after a chunk's data
                if line:
                    raise BadRequest("malformed chunked body")
                self.left = -1
                continue
            size = line.split(b";", 1)[0].strip()
            try:
                n = int(size, 16)
            except ValueError:
                raise BadRequest("malformed chunk size") from None
            if n < 0 or not size.isalnum():
                raise BadRequest("malformed chunk size")
            if n == 0:
                self._trailers = True
            else:
                self.left = n
        return start


class HttpConnection(asyncio.BufferedProtocol):
    """One client connection (see the module's docstring for its rules)."""

    def __init__(self, server: "BuiltinHttpServer") -> None:
        self.server = server
        self.inbuf = bytearray(MAX_HEAD_BYTES)
        self.inview = memoryview(self.inbuf)
        self.start = self.end = 0             # unconsumed input: inbuf[start:end]
        self.transport: asyncio.Transport | None = None
        self.head: Head | None = None          # the request whose body is being read
        self.body: Any = None                  # its destination (bytearray / memoryview)
        self.body_view: memoryview | None = None
        self.body_got = 0
        self.release: Callable[[], None] | None = None
        self.chunked: ChunkedBody | None = None
        self.route: Any = None                 # the inference route's match, or None
        self.busy = False                      # a request is being answered
        self.closing = False                   # no more requests on this connection
        self.closed = False
        self.read_paused = self.write_paused = False
        self.lost: asyncio.Future | None = None
        self.client = self.local = None

    # --- asyncio callbacks ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        # paused whenever anything is left unsent: the next request waits for the flush
        transport.set_write_buffer_limits(high=0)
        self.client = transport.get_extra_info("peername")
        self.local = transport.get_extra_info("sockname")
        self.lost = asyncio.get_running_loop().create_future()
        self.server.connections.add(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.body_view is not None:
            return self.body_view[self.body_got:]
        if self.end == len(self.inbuf):
            self._compact()
        return self.inview[self.end:]

    def buffer_updated(self, nbytes: int) -> None:
        if self.body_view is not None:
            self.body_got += nbytes
            if self.body_got == len(self.body_view):
                self._body_complete()
                self._process()
            return
        self.end += nbytes
        self._process()

    def eof_received(self) -> bool:
        return False     # close; an answer still in flight is dropped

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = self.closing = True
        self.server.connections.discard(self)
        if not self.busy:
            self._release_body()
        if self.lost is not None and not self.lost.done():
            self.lost.set_result(None)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if not self.busy:
            self._process()

    # --- framing --------------------------------------------------------------------------

    def _compact(self) -> None:
        n = self.end - self.start
        if self.start:
            self.inbuf[:n] = self.inbuf[self.start:self.end]
            self.start, self.end = 0, n

    def _process(self) -> None:
        """Start on the next request in the input buffer, if any and if free to."""
        while not (self.busy or self.closing or self.write_paused
                   or self.body_view is not None):
            if self.chunked is not None:
                try:
                    self.start = self.chunked.feed(self.inbuf, self.start, self.end)
                except BadRequest as e:
                    self._refuse(e)
                    return
                if self.chunked.done or self.chunked.over:
                    body, over = self.chunked.data, self.chunked.over
                    self.chunked = None
                    if over:
                        self.closing = True   # the rest of the body is not read
                    self._dispatch_app(self.head, body)
                    continue
                break
            while self.start < self.end and self.inbuf[self.start] in b"\r\n":
                self.start += 1               # CRLFs between requests are ignored
            end = self.inbuf.find(b"\r\n\r\n", self.start, self.end)
            if end < 0:
                if self.end - self.start >= MAX_HEAD_BYTES:
                    self._refuse(BadRequest("request head too large", 431))
                    return
                break
            try:
                head = parse_head(bytes(self.inview[self.start:end]))
            except BadRequest as e:
                self._refuse(e)
                return
            self.start = end + 4
            self._begin(head)
        if self.start == self.end:
            self.start = self.end = 0
        if self.body_view is None:
            full = self.end == len(self.inbuf) and self.start == 0
            if full and not self.read_paused:
                self.transport.pause_reading()
                self.read_paused = True
            elif not full and self.read_paused and not self.closed:
                self.transport.resume_reading()
                self.read_paused = False
        elif self.read_paused and not self.closed:
            self.transport.resume_reading()
            self.read_paused = False

    def _begin(self, head: Head) -> None:
        self.head = head
        server = self.server
        match = _INFER.fullmatch(head.path) if head.method == "POST" else None
        self.route = match
        if head.chunked:
            if head.expect_continue:
                self.transport.write(_CONTINUE)
            self.chunked = ChunkedBody(server.max_body_bytes)
            return
        size = head.length or 0
        if size > server.max_body_bytes:
            # refused by the app (413 with its message and metrics) without reading it
            self.closing = True
            if match is not None:
                self._dispatch_infer(head, match, None)
            else:
                self._dispatch_app(head, None)
            return
        if match is not None and head.length is not None:
            self.body, self.release = server.body_buffer(size, head.header_length)
        else:
            self.body, self.release = bytearray(size), None
        have = min(size, self.end - self.start)
        view = memoryview(self.body)
        view[:have] = self.inview[self.start:self.start + have]
        self.start += have
        if have == size:
            view.release()
            self._body_complete()
            return
        if head.expect_continue:
            self.transport.write(_CONTINUE)
        self.body_view, self.body_got = view, have

    def _body_complete(self) -> None:
        if self.body_view is not None:
            self.body_view.release()
            self.body_view = None
        body, self.body = self.body, None
        if self.route is not None and self.head.length is not None:
            release, self.release = self.release, None
            self._dispatch_infer(self.head, self.route, body, release)
        else:
            self._dispatch_app(self.head, body)

    def _release_body(self) -> None:
        """A body that will never be answered (the client left while sending it)."""
        if self.body_view is not None:
            self.body_view.release()
            self.body_view = None
        self.body = None
        if self.release is not None:
            release, self.release = self.release, None
            release()

    def _refuse(self, e: BadRequest) -> None:
        self.closing = True
        body = _error_body(str(e))
        self._write(e.status, [(b"content-type", b"application/json"),
                               (b"content-length", b"%d" % len(body))], [body])

    def _write(self, status: int, headers: list[tuple[bytes, bytes]], body: list) -> None:
        if self.closed:
            return
        http10 = self.head is not None and self.head.minor == 0
        self.transport.writelines([response_head(status, headers, self.closing, http10), *body])
        if self.closing:
            self.transport.close()

    # --- answering ------------------------------------------------------------------------

    def _dispatch_infer(self, head: Head, match: re.Match, body: Any,
                        release: Callable[[], None] | None = None) -> None:
        self.busy = True
        self.server.spawn(self._answer_infer(head, match, body, release))

    def _dispatch_app(self, head: Head, body: bytearray | None) -> None:
        self.busy = True
        self.server.spawn(self._answer_app(head, body))

    def _done(self, head: Head) -> None:
        if not head.keep_alive:
            self.closing = True
            if not self.closed:
                self.transport.close()
        self.busy = False
        if self.closing and not self.closed and self.server.stopping:
            self.transport.close()
        if not self.closed:
            self._process()

    async def _answer_infer(self, head: Head, match: re.Match, body: Any,
                            release: Callable[[], None] | None) -> None:
        server = self.server
        app = server.app
        t0 = time.perf_counter()
        name, version = match["name"], match["version"]

        async def read() -> Any:
            if body is None:
                raise RequestError(f"request body of {head.length} bytes exceeds the limit "
                                   f"of {server.max_body_bytes} bytes", 413)
            return body

        try:
            status, content, headers, media = await answer_infer(
                app, name, version, head.path, head.header_length, read)
        except asyncio.CancelledError:
            # shutdown ran out of time: the engine may still be reading the body, so its
            # buffer is never handed out again (the process is ending)
            raise
        # the engine has answered: nothing reads the body any more
        body = None
        if release is not None:
            release()
        self.closing = self.closing or not head.keep_alive
        raw = [(b"content-type", media.encode("latin-1")),
               (b"content-length", b"%d" % len(content))]
        raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self._write(status, raw, [content])
        app.engine.record_request(infer_label(app, name), "infer", status,
                                  time.perf_counter() - t0)
        server.log_access(self, head, status)
        self._done(head)

    async def _answer_app(self, head: Head, body: bytearray | None) -> None:
        """The request through the ASGI app (every route but the fast inference path)."""
        path = head.path
        raw_path, _, _ = head.target.partition(b"?")
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": f"1.{head.minor}", "method": head.method, "scheme": "http",
            "path": path, "raw_path": raw_path, "query_string": head.query,
            "root_path": "", "headers": head.headers, "client": self.client,
            "server": self.local, "state": {},
        }
        delivered = False

        async def receive() -> dict:
            nonlocal delivered
            if not delivered:
                delivered = True
                if body is not None:
                    return {"type": "http.request", "body": bytes(body), "more_body": False}
                # a body over the limit, not read: the app refuses it by its length
                return {"type": "http.request", "body": b"", "more_body": True}
            await asyncio.shield(self.lost)
            return {"type": "http.disconnect"}

        status = 500
        started = False
        parts: list[bytes] = []
        headers: list[tuple[bytes, bytes]] = []

        async def send(message: dict) -> None:
            nonlocal status, started, headers
            kind = message["type"]
            if kind == "http.response.start":
                status, started = message["status"], True
                headers = [(bytes(k).lower(), bytes(v)) for k, v in message.get("headers", [])]
            elif kind == "http.response.body":
                parts.append(message.get("body", b""))
                if not message.get("more_body", False):
                    content = b"".join(parts)
                    if not any(k == b"content-length" for k, _ in headers):
                        headers.append((b"content-length", b"%d" % len(content)))
                    if head.method == "HEAD" or status in (204, 304) or status < 200:
                        content = b""
                    self.closing = self.closing or not head.keep_alive
                    self._write(status, headers, [content])

        try:
            await self.server.asgi(scope, receive, send)
            if not started:
                raise RuntimeError("the app sent no response")
        except Exception:
            log.exception("%s %s failed", head.method, path)
            if not started:
                status = 500
                self.closing = True
                body_ = _error_body("internal error")
                self._write(500, [(b"content-type", b"application/json"),
                                  (b"content-length", b"%d" % len(body_))], [body_])
            elif not self.closed:
                self.transport.close()
        body = None
        self.server.log_access(self, head, status)
        self._done(head)

    def shutdown(self) -> None:
        """Serve no further request: close now when idle, else after the answer."""
        self.closing = True
        if not self.busy and self.body_view is None and self.chunked is None:
            self.transport.close()


async def adopt_socket(sock: socket.socket, protocol: Callable[[], asyncio.BaseProtocol],
                       stopping: bool, on_closed: Callable[[], None] | None = None) -> None:
    """Serve ``sock``, accepted elsewhere, with a new ``protocol()`` on this loop (a
    built-in server's ``adopt``); closed at once while the server is stopping.
    ``on_closed()`` runs once when the connection is gone (at once when it never was
    served): the engine process that dealt it counts the connections each worker holds
    open (``workers.deal_connections``)."""
    if stopping:
        sock.close()
        if on_closed is not None:
            on_closed()
        return
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    factory = protocol if on_closed is None else _reporting_close(protocol, on_closed)
    try:
        await asyncio.get_running_loop().connect_accepted_socket(factory, sock)
    except OSError:            # the client went away before we got to it
        sock.close()
        if on_closed is not None:
            on_closed()


def _reporting_close(protocol: Callable[[], asyncio.BaseProtocol],
                     on_closed: Callable[[], None]) -> Callable[[], asyncio.BaseProtocol]:
    """``protocol`` whose instance calls ``on_closed()`` after its own ``connection_lost``."""
    def factory() -> asyncio.BaseProtocol:
        proto = protocol()
        lost = proto.connection_lost

        def connection_lost(exc: Exception | None) -> None:
            try:
                lost(exc)
            finally:
                on_closed()
        proto.connection_lost = connection_lost  # type: ignore[method-assign]
        return proto
    return factory


async def drain(servers: list, connections: set, tasks: set, timeout: float, *,
                busy: Callable[[], bool] = lambda: False,
                forced: Callable[[], bool] = lambda: False) -> None:
    """A built-in server's shutdown (HTTP here, gRPC in ``grpc_h2``): stop accepting, tell
    each connection (``shutdown()``: close when idle, GOAWAY), wait for the requests in
    flight (``tasks``, and ``busy``) up to ``timeout`` or until ``forced``, then abort
    what is left."""
    for s in servers:
        s.close()
    for conn in list(connections):
        conn.shutdown()
    deadline = time.monotonic() + timeout
    while (tasks or busy()) and not forced() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    for conn in list(connections):
        if conn.transport is not None:
            conn.transport.abort()
    for task in list(tasks):
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


class BuiltinHttpServer:
    """The HTTP/1.1 server over ``create_engine_app``'s app: the interface of uvicorn's
    ``Server`` that ``run.run_front_ends`` and ``run.ServerThread`` use (``serve``,
    ``run``, ``started``, ``should_exit``, ``force_exit``)."""

    def __init__(self, app: Any, *, max_body_bytes: int | None = None, host: str = "127.0.0.1",
                 port: int = 0, access_log: bool = False, shutdown_timeout: float = 30.0) -> None:
        self.asgi = app                        # the InferRoute (ASGI)
        self.app = app.app                     # its _App: engine, limits, error mapping
        self.max_body_bytes = max_body_bytes or self.app.max_body_bytes
        self.pool = app.pool
        self.host, self.port = host, port
        self.access_log = access_log
        self.shutdown_timeout = shutdown_timeout
        self.connections: set[HttpConnection] = set()
        self.tasks: set[asyncio.Task] = set()
        self.started = self.should_exit = self.force_exit = self.stopping = False
        self.servers: list[asyncio.AbstractServer] = []
        engine_buffer = getattr(self.app.engine, "body_buffer", None)
        self._engine_buffer = engine_buffer

    def body_buffer(self, size: int, header_length: str | None
                    ) -> tuple[Any, Callable[[], None] | None]:
        """The destination of an inference body of ``size`` bytes and what returns it: a
        block of the worker's arena when the engine offers one (the tensors are then read
        there by the engine process without another copy), else a pooled buffer."""
        if self._engine_buffer is not None:
            got = self._engine_buffer(size, header_length)
            if got is not None:
                return got
        buf = self.pool.get(size)
        return buf, lambda: self.pool.put(buf)

    async def adopt(self, sock: socket.socket, on_closed: Callable[[], None] | None = None
                    ) -> None:
        """Serve a connection accepted elsewhere (the engine process hands each front-end
        worker its share: ``workers.py``); closed at once while shutting down."""
        await adopt_socket(sock, lambda: HttpConnection(self), self.stopping, on_closed)

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def log_access(self, conn: HttpConnection, head: Head, status: int) -> None:
        if self.access_log:
            client = conn.client[0] if conn.client else "-"
            access_log.info('%s - "%s %s HTTP/1.%d" %d', client, head.method,
                            head.target.decode("latin-1"), head.minor, status)

    async def serve(self, sockets: list | None = None) -> None:
        loop = asyncio.get_running_loop()
        if sockets is None:
            from .run import bind_http
            sockets = [bind_http(self.host, self.port)]
        for sock in sockets:
            self.servers.append(await loop.create_server(lambda: HttpConnection(self),
                                                         sock=sock, backlog=2048))
        self.started = True
        try:
            while not self.should_exit:
                await asyncio.sleep(0.05)
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        """Stop accepting, close idle connections, let requests in flight finish (up to
        ``shutdown_timeout``, or a second signal: ``force_exit``), then close the rest."""
        self.stopping = True
        await drain(self.servers, self.connections, self.tasks, self.shutdown_timeout,
                    busy=lambda: any(c.busy for c in self.connections),
                    forced=lambda: self.force_exit)

    def run(self) -> None:
        from .run import run_async
        run_async(self.serve())

    @property
    def bound_port(self) -> int:
        return self.servers[0].sockets[0].getsockname()[1]
