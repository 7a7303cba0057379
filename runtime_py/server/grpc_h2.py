"""The built-in gRPC front-end (``bundle serve --grpc-server builtin``, the default): the
KServe v2 ``inference.GRPCInferenceService`` over HTTP/2 as an asyncio protocol, on the same
event loop as the built-in HTTP/1.1 server, with the same RPCs (``grpc_service.rpc_table``).

Why: grpcio's server cost ~190 us of CPU per call plus ~0.45 us per KB on the 2-core
machine, and more while the handler waits for its batch (262 -> 515 us at 0 -> 5 ms:
fewer completions per wake-up of its poller thread, then a hop to the asyncio loop). On
the H200 with 64 clients and 8 workers that put gRPC at 0.76-0.79 of the batcher where
HTTP, parsed by the project's own server, was at 0.97-0.99. Here a request costs what its
frames cost to walk in Python: no thread hop, no completion queue, and the message is
assembled straight into its final buffer (in a worker, a block of the arena the engine
reads, as ``http1`` does with HTTP bodies), so the tensors are never copied again. A DATA
frame is taken in parts as its bytes arrive; once its message has a block, the rest of the
frame is read straight into the block, and in a worker a client that sends big frames gets
short reads between messages (``READ_AHEAD``), so that only a message's head passes through the
connection's buffer (2-core machine, one worker, uint8 299x299: 0.18-0.24 ms of the
worker's CPU per request, against 0.22-0.28 with every byte copied from the buffer).

What it speaks: HTTP/2 over cleartext with prior knowledge (RFC 9113; what grpc's
insecure channels, ``tritonclient.grpc`` included, use), and the gRPC framing over it
(length-prefixed messages, ``grpc-status`` / ``grpc-message`` trailers, gzip and deflate
requests). Flow control both ways: windows of ``STREAM_WINDOW`` per stream and
``CONNECTION_WINDOW`` per connection are granted up front and topped up as messages are
consumed; responses wait for the client's window. Frames up to ``MAX_FRAME`` are taken.
Limits and refusals: a message over ``max_message_bytes`` is RESOURCE_EXHAUSTED (as
grpcio answers), an unknown method UNIMPLEMENTED, a request that is not gRPC (no
``application/grpc`` content type, not POST) is refused with HTTP 415 / 405; a broken
connection-level rule (bad preface, bad frame sizes, a header block that cannot be
decoded, stream ids going backwards) is a GOAWAY with the error code, then close. A client
that resets a stream gets nothing more on it; an inference already handed to the engine
runs to its end first (the engine may still be reading the request's block until then).
Server push, priorities and TLS are not spoken (gRPC does not use the first two; put a
proxy in front for TLS).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import zlib
from typing import Any, Callable
from urllib.parse import quote

import grpc

from . import hpack
from .grpc_service import SERVICE, InferenceService, Rpc, rpc_table
from .grpc_wire import raw_contents_offset
from .http1 import adopt_socket, drain

log = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, \
    CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 5, 6, 7, 8, 9

MAX_FRAME = 1 << 18                 # our SETTINGS_MAX_FRAME_SIZE (the default is 16 KiB)
STREAM_WINDOW = 4 << 20             # SETTINGS_INITIAL_WINDOW_SIZE
CONNECTION_WINDOW = 16 << 20
MAX_STREAMS = 256                   # SETTINGS_MAX_CONCURRENT_STREAMS per connection
MAX_HEADER_BLOCK = 64 * 1024        # a request's header block, CONTINUATIONs included
DATA_PART_MIN = 4096                # a DATA frame is taken in parts from this many bytes
BIG_DATA_FRAME = 64 * 1024          # a client that sends DATA frames this large ...
READ_AHEAD = 16 * 1024              # ... gets reads of this size outside its messages
DEFAULT_WINDOW = 65535              # RFC 9113's initial windows
_MAX_WINDOW = (1 << 31) - 1

# gRPC status codes: grpcio's own numbers (what the RPCs' ``context.abort`` is given)
OK, UNKNOWN, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL = (
    c.value[0] for c in (grpc.StatusCode.OK, grpc.StatusCode.UNKNOWN,
                         grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNIMPLEMENTED,
                         grpc.StatusCode.INTERNAL))

_FRAME = struct.Struct(">IBI")      # length (24 bits, shifted in) + type, flags, stream id
_U32 = struct.Struct(">I")
_RESPONSE_HEAD = hpack.encode_headers([(b":status", b"200"),
                                       (b"content-type", b"application/grpc")])
_TRAILERS_OK = hpack.encode_headers([(b"grpc-status", b"0")])
_SETTINGS = b"".join(struct.pack(">HI", k, v) for k, v in (
    (3, MAX_STREAMS), (4, STREAM_WINDOW), (5, MAX_FRAME), (6, MAX_HEADER_BLOCK)))


def frame(ftype: int, flags: int, stream: int, payload: bytes | memoryview = b"") -> bytes:
    return _FRAME.pack(len(payload) << 8 | ftype, flags, stream) + bytes(payload)


def _head(ftype: int, flags: int, stream: int, length: int) -> bytes:
    return _FRAME.pack(length << 8 | ftype, flags, stream)


def _grpc_message(text: str) -> bytes:
    """``grpc-message``'s percent-encoding (printable ASCII but '%' as is)."""
    return quote(text, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode("ascii")


def trailers(status: int, message: str = "", *, head: bool = False) -> bytes:
    fields = [(b":status", b"200"), (b"content-type", b"application/grpc")] if head else []
    fields.append((b"grpc-status", str(status).encode()))
    if message:
        fields.append((b"grpc-message", _grpc_message(message)))
    return hpack.encode_headers(fields)


class Abort(Exception):
    """What ``context.abort`` raises: the RPC ends with this status and message."""

    def __init__(self, code: int, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class _Context:
    """The part of grpcio's servicer context the RPCs use."""

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise Abort(code.value[0], details)


_CONTEXT = _Context()


class _ConnectionError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Stream:
    """One RPC on a connection: the message being received, and what waits to be sent."""

    __slots__ = ("id", "rpc", "name", "encoding", "send_window", "unacked", "remote_closed",
                 "local_closed", "reset", "prefix", "msg", "got", "need", "compressed", "release",
                 "started", "task", "inflight", "pending", "pending_end")

    def __init__(self, sid: int, rpc: Rpc | None, name: str, encoding: bytes | None,
                 send_window: int) -> None:
        self.id = sid
        self.rpc = rpc
        self.name = name
        self.encoding = encoding
        self.send_window = send_window
        self.unacked = 0                    # received bytes not yet given back as window
        self.remote_closed = self.local_closed = self.reset = False
        self.prefix = b""                   # a message prefix split across frames
        self.msg: Any = None                # the message being received (buffer)
        self.got = self.need = 0
        self.compressed = False
        self.release: Callable[[], None] | None = None
        self.started = False                # response headers sent
        self.task: asyncio.Task | None = None
        self.inflight = 0                   # messages of an ``each`` stream being answered
        self.pending: list[memoryview] = []  # DATA waiting for the client's window
        self.pending_end: bytes | None = None   # trailers to send after it


class GrpcConnection(asyncio.BufferedProtocol):
    """One client connection (see the module's docstring for its rules)."""

    def __init__(self, server: "BuiltinGrpcServer") -> None:
        self.server = server
        self.buf = bytearray(2 * MAX_FRAME + 64)
        self.view = memoryview(self.buf)
        self.start = self.end = 0
        self.preface = False
        self.decoder = hpack.Decoder()
        self.streams: dict[int, Stream] = {}
        self.last_stream = 0
        self.peer_max_frame = 16384
        self.peer_window = DEFAULT_WINDOW   # the client's initial window for new streams
        self.send_window = DEFAULT_WINDOW   # the connection's window towards the client
        self.unacked = 0                    # connection-level bytes not yet given back
        self.header_block: bytearray | None = None   # a block continued by CONTINUATION
        self.header_stream = 0
        self.header_flags = 0
        self.control: list[bytes] = []      # frames to send once this read is processed
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.goaway = False                 # no new streams (shutting down)
        self.blocked: set[Stream] = set()   # streams waiting for window
        self.data_sid = 0                   # a DATA frame taken in parts: its stream,
        self.data_left = 0                  # the payload bytes still to come,
        self.data_end_stream = False        # and whether it ends the stream
        self.direct: Stream | None = None   # the stream whose message the read goes into
        self.big_frames = False             # big frames, into arena blocks: short reads

    # --- asyncio callbacks ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.server.connections.add(self)
        transport.write(frame(SETTINGS, 0, 0, _SETTINGS)
                        + frame(WINDOW_UPDATE, 0, 0,
                                _U32.pack(CONNECTION_WINDOW - DEFAULT_WINDOW)))

    def get_buffer(self, sizehint: int) -> memoryview:
        self.direct = None
        if self.start == self.end:
            self.start = self.end = 0
            if self.data_left:
                into = self._direct_block()
                if into is not None:
                    return into
        elif len(self.buf) - self.end < MAX_FRAME // 2 + 9 and self.start:
            n = self.end - self.start
            self.buf[:n] = self.buf[self.start:self.end]
            self.start, self.end = 0, n
        if self.big_frames and not self.data_left:
            # a short read: the next message's head, then its bulk straight into its block
            # (inside a frame whose message has no block, reads stay long)
            return self.view[self.end:self.end + READ_AHEAD]
        return self.view[self.end:]

    def buffer_updated(self, nbytes: int) -> None:
        if self.direct is not None:
            self._direct_received(self.direct, nbytes)
            self._flush_control()
            return
        self.end += nbytes
        try:
            self._process()
        except _ConnectionError as e:
            self._fail(e.code, str(e))
            return
        except hpack.HpackError as e:
            self._fail(COMPRESSION_ERROR, f"header block: {e}")
            return
        self._flush_control()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        for s in list(self.streams.values()):
            self._drop(s)
        self.streams.clear()
        self.blocked.clear()

    # --- frames in ------------------------------------------------------------------------

    def _process(self) -> None:
        buf = self.buf
        if not self.preface:
            have = bytes(buf[self.start:min(self.end, self.start + len(PREFACE))])
            if not PREFACE.startswith(have):
                raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 client preface "
                                       "(gRPC here is HTTP/2 with prior knowledge, no TLS)")
            if len(have) < len(PREFACE):
                return
            self.start += len(PREFACE)
            self.preface = True
        pos, end = self.start, self.end
        while not self.closed:
            if self.data_left:
                pos = self.start = self._data_part(pos, end)
                if self.data_left:
                    break
                continue
            if end - pos < 9:
                break
            word, flags, sid = _FRAME.unpack_from(buf, pos)
            length, ftype = word >> 8, word & 0xFF
            if length > MAX_FRAME:
                raise _ConnectionError(FRAME_SIZE_ERROR, f"a frame of {length} bytes "
                                       f"(at most {MAX_FRAME})")
            sid &= 0x7FFFFFFF
            if self.header_block is not None and (ftype != CONTINUATION
                                                  or sid != self.header_stream):
                raise _ConnectionError(PROTOCOL_ERROR, "a header block was not continued")
            if ftype == DATA:
                if length >= BIG_DATA_FRAME:
                    # only where messages get blocks (a worker) can the bulk skip buf
                    self.big_frames = self.server.arena_block is not None
                elif not flags & END_STREAM:     # small frames inside a message
                    self.big_frames = False
            if end - pos - 9 < length:
                if (ftype == DATA and not flags & PADDED
                        and end - pos - 9 >= DATA_PART_MIN):
                    self._data_stream(sid)          # the frame's errors, before its bytes
                    self.data_sid, self.data_left = sid, length
                    self.data_end_stream = bool(flags & END_STREAM)
                    pos = self.start = pos + 9
                    continue
                break
            payload = self.view[pos + 9:pos + 9 + length]
            pos += 9 + length
            self.start = pos
            if ftype == DATA:
                self._on_data(flags, sid, payload)
            elif ftype == HEADERS:
                self._on_headers(flags, sid, payload)
            elif ftype == CONTINUATION:
                self._on_continuation(flags, sid, payload)
            elif ftype == SETTINGS:
                self._on_settings(flags, sid, payload)
            elif ftype == WINDOW_UPDATE:
                self._on_window_update(sid, payload)
            elif ftype == PING:
                if sid or length != 8:
                    raise _ConnectionError(PROTOCOL_ERROR if sid else FRAME_SIZE_ERROR,
                                           "a malformed PING")
                if not flags & ACK:
                    self.control.append(frame(PING, ACK, 0, payload))
            elif ftype == RST_STREAM:
                if not sid or length != 4:
                    raise _ConnectionError(PROTOCOL_ERROR, "a malformed RST_STREAM")
                s = self.streams.get(sid)
                if s is not None:
                    s.reset = True
                    self._drop(s)
                    self._forget(s)
            elif ftype == GOAWAY:
                self.goaway = True          # the client opens no more streams
            elif ftype == PUSH_PROMISE:
                raise _ConnectionError(PROTOCOL_ERROR, "a client cannot push")
            elif ftype == PRIORITY:
                if not sid:
                    raise _ConnectionError(PROTOCOL_ERROR, "PRIORITY on stream 0")
            # frames of unknown types are ignored (RFC 9113 5.5)

    def _strip(self, flags: int, payload: memoryview, priority: bool) -> memoryview:
        if flags & PADDED:
            if not payload:
                raise _ConnectionError(PROTOCOL_ERROR, "a padded frame without its length")
            pad = payload[0]
            payload = payload[1:]
            if pad > len(payload):
                raise _ConnectionError(PROTOCOL_ERROR, "padding longer than the frame")
            payload = payload[:len(payload) - pad]
        if priority and flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise _ConnectionError(FRAME_SIZE_ERROR, "a HEADERS frame too short for "
                                       "its priority")
            payload = payload[5:]
        return payload

    def _on_headers(self, flags: int, sid: int, payload: memoryview) -> None:
        if not sid:
            raise _ConnectionError(PROTOCOL_ERROR, "HEADERS on stream 0")
        block = self._strip(flags, payload, True)
        if flags & END_HEADERS:
            self._on_header_block(sid, flags, bytes(block))
        else:
            self.header_block = bytearray(block)
            self.header_stream, self.header_flags = sid, flags

    def _on_continuation(self, flags: int, sid: int, payload: memoryview) -> None:
        if self.header_block is None:
            raise _ConnectionError(PROTOCOL_ERROR, "CONTINUATION without a header block")
        self.header_block += payload
        if len(self.header_block) > MAX_HEADER_BLOCK:
            raise _ConnectionError(PROTOCOL_ERROR, f"a header block over "
                                   f"{MAX_HEADER_BLOCK} bytes")
        if flags & END_HEADERS:
            block, self.header_block = bytes(self.header_block), None
            self._on_header_block(self.header_stream, self.header_flags, block)

    def _on_header_block(self, sid: int, flags: int, block: bytes) -> None:
        fields = self.decoder.decode(block)   # always: the decoder's table must follow
        s = self.streams.get(sid)
        if s is not None:                      # trailers of a request stream: no content
            if not flags & END_STREAM:
                raise _ConnectionError(PROTOCOL_ERROR, "a second header block that does "
                                       "not end the stream")
            self._remote_end(s)
            return
        if sid <= self.last_stream or not sid & 1:
            raise _ConnectionError(PROTOCOL_ERROR, f"stream {sid} cannot be opened "
                                   f"(ids rise, odd for clients)")
        self.last_stream = sid
        if self.goaway or len(self.streams) >= MAX_STREAMS:
            self.control.append(frame(RST_STREAM, 0, sid, _U32.pack(REFUSED_STREAM)))
            return
        method = path = ctype = encoding = None
        for name, value in fields:
            if name == b":path":
                path = value
            elif name == b":method":
                method = value
            elif name == b"content-type":
                ctype = value
            elif name == b"grpc-encoding":
                encoding = value
        rpc = name_ = None
        if path is not None and path.startswith(_PREFIX):
            name_ = path[len(_PREFIX):].decode("latin-1")
            rpc = self.server.rpcs.get(name_)
        s = Stream(sid, rpc, name_ or "", encoding if encoding != b"identity" else None,
                   self.peer_window)
        self.streams[sid] = s
        s.remote_closed = bool(flags & END_STREAM)   # (set first: no RST after the answer)
        if method != b"POST":
            self._refuse_http(s, b"405")
        elif ctype is None or not ctype.startswith(b"application/grpc"):
            self._refuse_http(s, b"415")
        elif rpc is None:
            self._finish(s, UNIMPLEMENTED, f"unknown method {path.decode('latin-1')!r}"
                         if path else "no :path")
        elif s.encoding is not None and s.encoding not in (b"gzip", b"deflate"):
            self._finish(s, UNIMPLEMENTED, f"grpc-encoding {s.encoding.decode('latin-1')!r} "
                         f"is not supported (identity, gzip, deflate)")
        elif rpc.stream and rpc.each is None:
            self._finish(s, UNIMPLEMENTED, f"{s.name} is not served by this server "
                         f"(--grpc-server grpcio serves it)")
        elif rpc.stream:
            if s.remote_closed:              # a stream without messages
                self._finish(s, OK)
        elif s.remote_closed:
            self._finish(s, UNIMPLEMENTED, f"{s.name} needs a request message")

    def _on_data(self, flags: int, sid: int, payload: memoryview) -> None:
        s = self._data_stream(sid)
        self.unacked += len(payload)
        data = self._strip(flags, payload, False)
        if s is not None:
            self._take_data(s, data, len(payload), bool(flags & END_STREAM))

    def _data_part(self, pos: int, end: int) -> int:
        """The next bytes of a DATA frame taken in parts (they start at ``pos``), as far
        as they are here; returns where the buffer's unread bytes now start.

        Why in parts: a frame is otherwise walked once it is whole in ``buf``, and a
        request tensor's frames (up to ``MAX_FRAME``) arrive over several reads: the
        partial frame was moved to the buffer's start to make room, a copy (through a
        temporary: an allocation too) of up to 256 KB per request, 12% of the front-end's
        CPU per gRPC request on the 2-core machine. Taken as they come, the bytes are
        copied once, into the message's own buffer (``_feed``), or read straight into it
        (``_direct_block``). Padded frames (which gRPC clients do not send) are still
        taken whole."""
        k = min(self.data_left, end - pos)
        self.data_left -= k
        self.unacked += k
        s = self.streams.get(self.data_sid)
        if s is not None and not s.remote_closed:
            self._take_data(s, self.view[pos:pos + k], k,
                            self.data_end_stream and not self.data_left)
        return pos + k

    def _data_stream(self, sid: int) -> Stream | None:
        """The stream a DATA frame is for, or None for one we finished (the data it
        still had in flight is dropped); raises a DATA frame's connection errors."""
        if not sid:
            raise _ConnectionError(PROTOCOL_ERROR, "DATA on stream 0")
        s = self.streams.get(sid)
        if s is None:
            if sid > self.last_stream:
                raise _ConnectionError(PROTOCOL_ERROR, f"DATA on idle stream {sid}")
            return None
        if s.remote_closed:
            raise _ConnectionError(STREAM_CLOSED, f"DATA after the end of stream {sid}")
        return s

    def _direct_block(self) -> memoryview | None:
        """Where the next read goes when it can go straight into a message: the rest of
        the DATA frame taken in parts, or of its message if that ends first, when the
        message has its block of the engine's arena (``_begin_message``) and nothing
        else is unread. Why: HTTP bodies are read into their block (``http1``); a gRPC
        message was read into ``buf`` and copied, 8% of a worker's CPU per request."""
        s = self.streams.get(self.data_sid)
        if s is None or s.release is None or s.local_closed or s.remote_closed:
            return None
        n = min(self.data_left, s.need - s.got)
        if n <= 0:
            return None
        self.direct = s
        return s.msg[s.got:s.got + n]

    def _direct_received(self, s: Stream, nbytes: int) -> None:
        """``nbytes`` read into stream ``s``'s message (``_direct_block``)."""
        self.direct = None
        self.data_left -= nbytes
        self.unacked += nbytes
        s.unacked += nbytes
        s.got += nbytes
        if s.got == s.need:
            self._message(s)
        self._data_taken(s, self.data_end_stream and not self.data_left)

    def _take_data(self, s: Stream, data: memoryview, counted: int, end_stream: bool) -> None:
        """``data`` of stream ``s``, ``counted`` bytes against its window (padding
        included): its messages, then the stream's end or a window update."""
        s.unacked += counted
        if not s.local_closed:
            self._feed(s, data)
        self._data_taken(s, end_stream)

    def _data_taken(self, s: Stream, end_stream: bool) -> None:
        if end_stream and s.id in self.streams:
            self._remote_end(s)
        elif s.unacked >= STREAM_WINDOW // 2 and not s.remote_closed:
            self.control.append(frame(WINDOW_UPDATE, 0, s.id, _U32.pack(s.unacked)))
            s.unacked = 0

    def _feed(self, s: Stream, data: memoryview) -> None:
        """Messages out of a stream's DATA: the 5-byte prefix, then the message into its
        own buffer (a block of the engine's arena for an inference where one is free)."""
        i, n = 0, len(data)
        while i < n and not s.local_closed:
            if s.msg is None:
                if s.prefix or n - i < 5:
                    take = min(5 - len(s.prefix), n - i)
                    s.prefix += bytes(data[i:i + take])
                    i += take
                    if len(s.prefix) < 5:
                        return
                    head, s.prefix = s.prefix, b""
                else:
                    head = data[i:i + 5]
                    i += 5
                length = _U32.unpack_from(head, 1)[0]
                if not self._begin_message(s, head[0], length, data[i:]):
                    return
                if length == 0:
                    self._message(s)
                    continue
            take = min(s.need - s.got, n - i)
            if s.release is not None:
                s.msg[s.got:s.got + take] = data[i:i + take]
            else:
                s.msg += data[i:i + take]
            s.got += take
            i += take
            if s.got == s.need:
                self._message(s)

    def _begin_message(self, s: Stream, flag: int, length: int, first: memoryview) -> bool:
        limit = self.server.max_message_bytes
        if length > limit:
            self._finish(s, RESOURCE_EXHAUSTED, f"Received message larger than max "
                         f"({length} vs. {limit})")
            return False
        if flag & 1 and s.encoding is None:
            self._finish(s, INTERNAL, "a compressed message without grpc-encoding")
            return False
        if not s.rpc.stream and s.task is not None:
            self._finish(s, UNIMPLEMENTED, f"{s.name} takes one request message")
            return False
        s.compressed = bool(flag & 1)
        s.got, s.need = 0, length
        s.release = None
        block = None
        if s.rpc.tensors and not s.compressed and self.server.arena_block is not None:
            block = self.server.arena_block(length, raw_contents_offset(first) or 0)
        if block is not None:
            s.msg, s.release = block
        else:
            # grown as the bytes arrive: a declared length costs nothing until it is sent
            s.msg = bytearray()
        return True

    def _message(self, s: Stream) -> None:
        data, release = s.msg, s.release
        s.msg, s.release = None, None
        if s.compressed:
            try:
                data = zlib.decompress(data, 31 if s.encoding == b"gzip" else 15)
            except zlib.error as e:
                self._finish(s, INTERNAL, f"cannot decompress the request ({e})")
                return
            if len(data) > self.server.max_message_bytes:
                self._finish(s, RESOURCE_EXHAUSTED, "the decompressed message is over "
                             f"{self.server.max_message_bytes} bytes")
                return
        if s.rpc.stream:
            s.inflight += 1
            self.server.spawn(self._run_each(s, data, release))
        else:
            s.task = self.server.spawn(self._run_unary(s, data, release))

    def _remote_end(self, s: Stream) -> None:
        s.remote_closed = True
        if s.msg is not None or s.prefix:
            self._finish(s, INTERNAL, "the request ended inside a message")
        elif s.rpc is not None and not s.local_closed:
            if s.rpc.stream:
                if not s.inflight:
                    self._finish(s, OK)
            elif s.task is None:
                self._finish(s, UNIMPLEMENTED, f"{s.name} needs a request message")
        if s.local_closed:
            self._forget(s)

    def _on_settings(self, flags: int, sid: int, payload: memoryview) -> None:
        if sid:
            raise _ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            return
        if len(payload) % 6:
            raise _ConnectionError(FRAME_SIZE_ERROR, "a SETTINGS frame of odd length")
        for k in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, k)
            if key == 4:
                if value > _MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "an initial window over 2^31-1")
                delta, self.peer_window = value - self.peer_window, value
                for s in self.streams.values():
                    s.send_window += delta
            elif key == 5:
                if not 16384 <= value <= (1 << 24) - 1:
                    raise _ConnectionError(PROTOCOL_ERROR, f"a max frame size of {value}")
                self.peer_max_frame = value
        self.control.append(frame(SETTINGS, ACK, 0))
        if self.blocked:
            self._unblock()

    def _on_window_update(self, sid: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "a WINDOW_UPDATE of odd length")
        inc = _U32.unpack_from(payload)[0] & 0x7FFFFFFF
        if sid == 0:
            if not inc:
                raise _ConnectionError(PROTOCOL_ERROR, "a zero window increment")
            self.send_window += inc
            if self.send_window > _MAX_WINDOW:
                raise _ConnectionError(FLOW_CONTROL_ERROR, "the window went over 2^31-1")
        else:
            s = self.streams.get(sid)
            if s is None:
                return
            s.send_window += inc
        if self.blocked:
            self._unblock()

    # --- RPCs -----------------------------------------------------------------------------

    async def _run_unary(self, s: Stream, data: Any, release: Callable[[], None] | None
                         ) -> None:
        try:
            try:
                resp = await s.rpc.handler(data, _CONTEXT)
                body = s.rpc.serialize(resp)
            finally:
                if release is not None:
                    release()   # the engine has answered: it no longer reads the block
        except Abort as e:
            self._finish(s, e.code, e.details)
            return
        except Exception as e:   # what grpcio would answer UNKNOWN
            log.error("gRPC %s failed", s.name, exc_info=e)
            self._finish(s, UNKNOWN, f"{type(e).__name__}: {e}")
            return
        self._send_message(s, body, end=True)

    async def _run_each(self, s: Stream, data: Any, release: Callable[[], None] | None
                        ) -> None:
        """One message of a stream of independent messages (``ModelStreamInfer``): its
        answer is sent as soon as it is ready; the stream ends OK once the client has
        half-closed and every answer is out. No queue, no generator: a task a message."""
        try:
            try:
                resp = await s.rpc.each(data)
            finally:
                s.inflight -= 1
                if release is not None:
                    release()
            body = s.rpc.serialize(resp)
        except Exception as e:
            log.error("gRPC %s failed", s.name, exc_info=e)
            self._finish(s, UNKNOWN, f"{type(e).__name__}: {e}")
            return
        self._send_message(s, body)
        if s.remote_closed and not s.inflight:
            self._finish(s, OK)

    # --- frames out -----------------------------------------------------------------------

    def _send_message(self, s: Stream, body: bytes, end: bool = False) -> None:
        """One message on ``s``; with ``end``, the OK trailers too, in the same write when
        the windows allow (one wake-up of the client per answer, as ``http1`` does)."""
        if s.local_closed or s.reset or self.closed:
            return
        out = []
        if not s.started:
            s.started = True
            out.append(_head(HEADERS, END_HEADERS, s.id, len(_RESPONSE_HEAD)) + _RESPONSE_HEAD)
        n = len(body) + 5
        prefix = b"\x00" + _U32.pack(len(body))
        if not s.pending and n <= self.peer_max_frame and n <= s.send_window \
                and n <= self.send_window:
            s.send_window -= n
            self.send_window -= n
            out += (_head(DATA, 0, s.id, n), prefix, body)
            if end:
                out.append(_end_ok(s.id))
            self.transport.writelines(out)
            if end:
                self._closed_locally(s)
            return
        if out:
            self.transport.writelines(out)
        s.pending.append(memoryview(prefix + body))
        self._pump(s)
        if end:
            self._finish(s, OK)

    def _pump(self, s: Stream) -> None:
        """Send what the windows allow of ``s``'s pending DATA (then its trailers)."""
        out = []
        while s.pending:
            allowed = min(s.send_window, self.send_window, self.peer_max_frame)
            if allowed <= 0:
                break
            chunk = s.pending[0]
            piece = chunk[:allowed]
            out += (_head(DATA, 0, s.id, len(piece)), piece)
            s.send_window -= len(piece)
            self.send_window -= len(piece)
            if len(piece) == len(chunk):
                s.pending.pop(0)
            else:
                s.pending[0] = chunk[len(piece):]
        if not s.pending and s.pending_end is not None:
            out.append(s.pending_end)
            s.pending_end = None
            self._closed_locally(s)
        if out:
            self.transport.writelines(out)
        if s.pending or s.pending_end is not None:
            self.blocked.add(s)
        else:
            self.blocked.discard(s)

    def _unblock(self) -> None:
        for s in list(self.blocked):
            if self.send_window <= 0:
                break
            self._pump(s)

    def _finish(self, s: Stream, code: int, message: str = "") -> None:
        """End the RPC with ``code``: trailers after its messages (or alone: trailers-only)."""
        if s.local_closed or s.reset or self.closed or s.pending_end is not None:
            return
        if code == OK and s.started:
            end = _end_ok(s.id)
        else:
            block = trailers(code, message, head=not s.started)
            end = _head(HEADERS, END_STREAM | END_HEADERS, s.id, len(block)) + block
        if s.pending:
            s.pending_end = end
            return
        self.transport.write(end)
        self._closed_locally(s)

    def _refuse_http(self, s: Stream, status: bytes) -> None:
        block = hpack.encode_headers([(b":status", status)])
        self.transport.write(_head(HEADERS, END_STREAM | END_HEADERS, s.id, len(block)) + block)
        self._closed_locally(s)

    def _closed_locally(self, s: Stream) -> None:
        s.local_closed = True
        if s.release is not None:               # a message cut short: its block goes back
            s.release()
            s.release = None
        s.msg = None
        if not s.remote_closed:
            # the answer is complete: the client need not send the rest of its request
            self.transport.write(frame(RST_STREAM, 0, s.id, _U32.pack(NO_ERROR)))
        self._forget(s)

    def _forget(self, s: Stream) -> None:
        self.streams.pop(s.id, None)
        self.blocked.discard(s)
        if self.goaway and not self.streams and self.server.stopping:
            self.transport.close()

    def _drop(self, s: Stream) -> None:
        """The client reset the stream or went away: nothing more is sent on it; the
        inferences of it already with the engine run to their end (they may be reading
        their requests' blocks until then) and their answers are dropped."""
        s.reset = True
        s.pending.clear()
        s.pending_end = None
        if s.release is not None:
            s.release()
            s.release = None
        s.msg = None

    def _flush_control(self) -> None:
        if self.unacked >= CONNECTION_WINDOW // 4:
            self.control.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self.unacked)))
            self.unacked = 0
        if self.control and not self.closed:
            self.transport.writelines(self.control)
        self.control = []

    def _fail(self, code: int, message: str) -> None:
        log.info("closing a gRPC connection: %s", message)
        if not self.closed and self.transport is not None:
            self._flush_control()
            self.transport.write(frame(GOAWAY, 0, 0, _U32.pack(self.last_stream)
                                       + _U32.pack(code) + message.encode()[:256]))
            self.transport.close()
        self.closed = True

    def shutdown(self) -> None:
        """Take no new streams (GOAWAY with the last one taken); close once idle."""
        if self.closed or self.transport is None:
            return
        self.goaway = True
        self.transport.write(frame(GOAWAY, 0, 0, _U32.pack(self.last_stream)
                                   + _U32.pack(NO_ERROR)))
        if not self.streams:
            self.transport.close()


_PREFIX = f"/{SERVICE}/".encode()


def _end_ok(sid: int) -> bytes:
    return _head(HEADERS, END_STREAM | END_HEADERS, sid, len(_TRAILERS_OK)) + _TRAILERS_OK


class BuiltinGrpcServer:
    """The gRPC server over an engine (``Engine`` or a worker's ``RemoteEngine``): listens
    on a socket (``start``) and/or serves connections accepted elsewhere (``adopt``)."""

    def __init__(self, engine: Any, max_message_bytes: int,
                 shutdown_timeout: float = 30.0) -> None:
        self.engine = engine
        self.rpcs = rpc_table(InferenceService(engine))
        self.max_message_bytes = max_message_bytes
        self.arena_block = getattr(engine, "arena_block", None)
        self.shutdown_timeout = shutdown_timeout
        self.connections: set[GrpcConnection] = set()
        self.tasks: set[asyncio.Task] = set()
        self.servers: list[asyncio.AbstractServer] = []
        self.stopping = False

    async def start(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self.servers.append(await loop.create_server(lambda: GrpcConnection(self),
                                                     sock=sock, backlog=2048))

    async def adopt(self, sock: socket.socket, on_closed: Callable[[], None] | None = None
                    ) -> None:
        """Serve a connection the engine process dealt to this worker."""
        await adopt_socket(sock, lambda: GrpcConnection(self), self.stopping, on_closed)

    def spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def stop(self, grace: float | None = None) -> None:
        """GOAWAY to every client, let the RPCs in flight finish (up to ``grace``), then
        close what is left."""
        self.stopping = True
        await drain(self.servers, self.connections, self.tasks,
                    self.shutdown_timeout if grace is None else grace)
