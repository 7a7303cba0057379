"""Front-end worker processes over one engine process: HTTP and gRPC parsing on several
cores, one model and one batcher per model on the engine.

Why processes: parsing KServe requests (HTTP framing, JSON headers, protobuf) is Python
work that holds the GIL; in the engine's process it competes with the batcher's thread
and caps the service at one core of parsing. Each worker runs the same front-ends as the
in-process server (``run.run_front_ends``: the HTTP and gRPC servers on one event loop) over a
``RemoteEngine`` that forwards to the engine process.

The data path, and why it is shaped so:
- Each worker shares an anonymous memory arena (``memfd_create``, inherited by fd, never a
  name in ``/dev/shm``, so nothing can leak there even on a crash) with the engine. A
  worker copies a request's tensors into slots of its arena (one copy: the bytes arrived
  in the worker's socket buffer) and sends their place; the engine hands the batcher numpy
  views of them. The arena holds the largest request the front-ends accept; when it is
  full the request waits for slots (back-pressure), and only a request larger than the
  whole arena (a huge JSON body, once parsed) travels inline in the message.
- Client shared-memory regions are passed by reference: the engine owns the one registry,
  so a region registered through one worker is usable through every other.
- Messages are msgpack over a socketpair (``multiprocessing.connection.Connection``'s
  framing, never its pickling). Workers are started with ``subprocess`` (no pickled
  arguments): the listening HTTP socket, the IPC socket and the arena go by fd.
- Messages go in frames: what one side has to say within one turn of its event loop is
  one frame (a msgpack list of messages), written at the end of that turn. The 32 replies
  of a batch finish in one turn of the engine's loop, so a worker gets one frame per batch
  instead of 32 writes and wake-ups; the requests a worker parses in one turn reach the
  engine together. The engine's loop is the one point every request crosses twice, and
  the time it spends on each of a batch's requests delays the last of them: on the H200,
  closed-loop clients lost 25-45% of the batcher's rate there (docs/measurements).
  Both sides read frames with ``frames.FrameReader``: what the socket holds, in one
  non-blocking read per wake-up (``recv_bytes`` took two reads and a ``poll`` a frame).
- Metrics and statistics stay in the engine process: workers report the requests they
  answered, and ``/metrics`` asks the engine, so one scrape sees every worker. Reports ride
  with the frame of the turn they were made in (a request of that turn carries them, so
  the engine applies them before it), or as a "records" message of their own: one message
  per report was a write and a wake-up of the engine per request, ~5% of a gRPC worker's
  loop on 2 cores.
- The engine ends on SIGINT/SIGTERM: workers get SIGTERM, finish their requests in flight
  (the engine still answers them), exit; then the batchers drain. A worker exits when the
  engine goes away (EOF on its socket); a worker that dies stops the server (exit 7).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import math
import mmap
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, Callable

import msgpack
import numpy as np

from ..errors import AddressInUseError, ServingError
from ..pinned_host import buffer_address
from ..tensors import TensorSpec
from .engine import (Engine, InferCall, ModelInfo, ShmInput, ShmOutput, lookup_info,
                     status_of)
from .frames import FrameReader
from .gc_tuning import serving_gc
from .protocol import OutputRequest, RequestError, dtype_name
from .shm import ShmRef

log = logging.getLogger(__name__)

SLOTS = 64
#: Slots of each arena page-locked for a GPU engine: the lowest, handed out first.
PINNED_SLOTS = 64
MIN_SLOT_BYTES = 64 * 1024
_PAGE = 4096
#: The metrics' protocol label of each connection tag (``deal_connections``).
_PROTOCOL_OF_TAG = {b"c": "http", b"g": "grpc"}


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


@functools.lru_cache(maxsize=64)
def _dtype(name: str) -> np.dtype:
    """``np.dtype(name)`` for the names on the wire, cached (every tensor of every request)."""
    return np.dtype(name)


def _messages(data: bytes) -> list[dict]:
    """The messages of one frame (a list; a lone message, as ``hello`` is, counts as one)."""
    obj = _unpack(data)
    return obj if isinstance(obj, list) else [obj]


#: What msgpack raises for a value it cannot carry: an integer beyond 64 bits (a client's
#: JSON may hold one), a string that is not UTF-8 (a lone surrogate from JSON's \\ud800).
UNPACKABLE = (OverflowError, ValueError, TypeError)
_ARRAY_HEADER = msgpack.Packer(use_bin_type=True).pack_array_header


class _Outbox:
    """Messages to one peer, written as one frame at the end of this turn of the event loop
    (module docstring). ``write`` sends a frame; ``on_error`` gets the messages of a frame
    that could not be written.

    Each message is packed when it is put, so a message msgpack cannot carry raises
    (``UNPACKABLE``) in its sender's code, which answers that one request; packed at the
    flush, it failed the whole frame in a loop callback, and every request of that turn
    went unanswered (found by fuzzing a shared-memory register with a 2**64 offset)."""

    def __init__(self, write: Callable[[bytes], None],
                 on_error: Callable[[list[dict]], None]) -> None:
        self._write = write
        self._on_error = on_error
        self._items: list[dict] = []
        self._packed: list[bytes] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def put(self, msg: dict) -> None:
        packed = _pack(msg)             # UNPACKABLE raises here, before anything is queued
        if self._loop is None:          # no loop to wait for: written at once
            self._send([msg], [packed])
            return
        if not self._items:
            self._loop.call_soon(self.flush)
        self._items.append(msg)
        self._packed.append(packed)

    def flush(self) -> None:
        items, packed = self._items, self._packed
        self._items, self._packed = [], []
        if items:
            self._send(items, packed)

    def _send(self, items: list[dict], packed: list[bytes]) -> None:
        try:        # a msgpack array of the messages, as ``_pack(items)`` would write it
            self._write(_ARRAY_HEADER(len(packed)) + b"".join(packed))
        except OSError:
            self._on_error(items)


def slot_bytes(infos: list[ModelInfo]) -> int:
    """One slot holds one row of every input of the largest model (fixed dims), so a
    single-image request takes one slot."""
    row = 0
    for info in infos:
        n = 0
        for s in info.inputs:
            dims = [d for d in s.shape[1:]]
            if all(isinstance(d, int) and d >= 0 for d in dims):
                n += int(np.prod(dims, dtype=np.int64)) * np.dtype(s.dtype).itemsize
        row = max(row, n)
    return max(MIN_SLOT_BYTES, -(-row // _PAGE) * _PAGE)


class SlotArena:
    """First-fit allocation of consecutive fixed-size slots; used by one event loop."""

    def __init__(self, buf: mmap.mmap, slot: int, slots: int) -> None:
        self.buf = buf
        self.slot = slot
        self.size = slot * slots
        self.free = [True] * slots
        self.low = 0   # no free slot below this index

    def alloc(self, nbytes: int) -> int | None:
        """Offset of ``nbytes`` of free consecutive slots, or None: the lowest such run.

        Lowest first, so the slots in use stay few and their pages stay resident. The arena
        spans the largest body accepted (1 GB in the benchmark), and rotating through it
        made each request's copy fault in fresh shared pages: 22% of a worker's time."""
        k = max(1, -(-nbytes // self.slot))
        free = self.free
        first_free = None
        run = 0
        for i in range(self.low, len(free)):
            if not free[i]:
                run = 0
                continue
            if first_free is None:
                first_free = i
            run += 1
            if run == k:
                first = i - k + 1
                for j in range(first, i + 1):
                    free[j] = False
                self.low = i + 1 if first_free == first else first_free
                return first * self.slot
        self.low = len(free) if first_free is None else first_free
        return None

    def release(self, offset: int, nbytes: int) -> None:
        start = offset // self.slot
        for j in range(start, start + max(1, -(-nbytes // self.slot))):
            self.free[j] = True
        self.low = min(self.low, start)


def _info_to_wire(info: ModelInfo) -> dict:
    d = info._asdict()
    d["inputs"] = [list(s) for s in info.inputs]
    d["outputs"] = [list(s) for s in info.outputs]
    return d


def _info_from_wire(d: dict) -> ModelInfo:
    d = dict(d)
    d["inputs"] = [TensorSpec(n, t, tuple(s)) for n, t, s in d["inputs"]]
    d["outputs"] = [TensorSpec(n, t, tuple(s)) for n, t, s in d["outputs"]]
    return ModelInfo(**d)


# --- the worker side ----------------------------------------------------------------------

class RemoteEngine:
    """The ``Engine`` interface of a worker process, answered by the engine process."""

    def __init__(self, conn: Connection, arena: SlotArena, infos: dict[str, ModelInfo]) -> None:
        self.conn = conn
        self.arena = arena
        self.infos = infos
        self._next = 0
        # id -> (future, what to do when the reply arrives, even if nobody awaits it)
        self._pending: dict[int, tuple[asyncio.Future, Callable[[], None] | None]] = {}
        self._send_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.lost = threading.Event()
        self._space = asyncio.Event()   # set when arena slots are released
        self._records: list[list] = []   # request reports not sent yet (``record_request``)
        self._outbox = _Outbox(self._write, self._unsent)
        view = np.frombuffer(arena.buf, np.uint8)
        self._arena_addr = view.ctypes.data   # where the arena is mapped in this process
        del view                              # (no export left: the mmap stays closable)

    def start(self, loop: asyncio.AbstractEventLoop, on_lost: Callable[[], None]) -> None:
        """Read replies on the event loop itself (no reader thread: one hop less per
        request), whole frames at a time without blocking (``FrameReader``)."""
        self._loop = loop
        self._on_lost = on_lost
        self._outbox.bind(loop)
        self._reader = FrameReader(self.conn.fileno())
        loop.add_reader(self.conn.fileno(), self._on_readable)
        os.set_blocking(self.conn.fileno(), True)   # uvloop's add_reader made it non-blocking

    def _on_readable(self) -> None:
        for data in self._reader.read():
            for msg in _messages(data):
                self._resolve(msg)
        if self._reader.eof:
            self._loop.remove_reader(self.conn.fileno())
            self._reader.close()
            self.lost.set()
            self._fail_all()
            self._on_lost()

    def _resolve(self, msg: dict) -> None:
        fut, on_reply = self._pending.pop(msg["id"], (None, None))
        if on_reply is not None:
            on_reply()
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def _fail_all(self) -> None:
        for fut, on_reply in self._pending.values():
            if on_reply is not None:
                on_reply()
            if not fut.done():
                fut.set_exception(RequestError("the engine process is gone", 503))
        self._pending.clear()

    def _send(self, msg: dict) -> None:
        """Write one message now, outside any frame (``hello``, before the loop runs)."""
        self._write(_pack(msg))

    def _write(self, data: bytes) -> None:
        with self._send_lock:
            self.conn.send_bytes(data)

    def _unsent(self, msgs: list[dict]) -> None:
        """A frame that could not be written: its requests fail as if the engine were gone."""
        for msg in msgs:
            fut, on_reply = self._pending.pop(msg.get("id"), (None, None))
            if on_reply is not None:
                on_reply()
            if fut is not None and not fut.done():
                fut.set_exception(RequestError("the engine process is gone", 503))

    async def _call(self, msg: dict, on_reply: Callable[[], None] | None = None) -> dict:
        """Send ``msg`` and await the reply. ``on_reply`` runs when the reply arrives (or
        the engine is gone), also when the awaiting request was cancelled meanwhile: the
        engine may still be reading the arena slots it releases until then."""
        if self.lost.is_set():
            if on_reply is not None:
                on_reply()
            raise RequestError("the engine process is gone", 503)
        self._next += 1
        msg["id"] = self._next
        if self._records:   # earlier reports first: the engine applies them before ``msg``
            msg["records"], self._records = self._records, []
        fut = asyncio.get_running_loop().create_future()
        self._pending[self._next] = (fut, on_reply)
        try:
            self._outbox.put(msg)     # an unwritable frame fails ``fut`` (``_unsent``)
        except UNPACKABLE as exc:     # nothing was sent: this request alone is refused
            del self._pending[self._next]
            self._records[:0] = msg.pop("records", [])
            if on_reply is not None:
                on_reply()
            raise RequestError(f"the request holds a value this server cannot pass on to "
                               f"its engine ({type(exc).__name__}: {exc}); integers must fit "
                               "in 64 bits and strings must be valid UTF-8") from None
        reply = await fut
        if not reply["ok"]:
            raise RequestError(reply["message"], reply["status"])
        return reply

    def body_buffer(self, size: int, header_length: str | None
                    ) -> tuple[memoryview, Callable[[], None]] | None:
        """A block of the arena to receive an HTTP body of ``size`` bytes into (``http1``),
        and what releases it; None for a body without binary tensors, or when the arena
        has no room now (the body then goes to a pooled buffer and ``infer`` copies it).

        The block is placed so that the binary part, after a JSON header of
        ``header_length`` bytes, starts 64-byte aligned. Tensors parsed from it are views
        of the arena, which ``infer`` sends by place without copying them."""
        try:
            h = int(header_length) if header_length is not None else -1
        except ValueError:
            h = -1
        if not 0 < h <= size:
            return None
        return self.arena_block(size, h)

    def arena_block(self, size: int, aligned_at: int = 0
                    ) -> tuple[memoryview, Callable[[], None]] | None:
        """A block of ``size`` bytes of the arena placed so that its byte ``aligned_at``
        is 64-byte aligned, and what releases it; None when the arena has no room now.
        What is received into it (an HTTP body, a gRPC message: ``grpc_h2``) is read by
        the engine in place: tensors parsed from it are sent by their place."""
        total = size + 64
        base = self.arena.alloc(total)
        if base is None:
            return None
        start = base + (-(base + aligned_at)) % 64
        view = memoryview(self.arena.buf)[start:start + size]

        def release() -> None:
            try:
                view.release()
            except BufferError:
                pass    # a view of it still lives (dropped soon); the slots are free anyway
            self.arena.release(base, total)
            self._space.set()
        return view, release

    def _arena_offset(self, arr: np.ndarray) -> int | None:
        """Where ``arr`` (C-contiguous) lies in the arena, or None when it is elsewhere."""
        offset = arr.__array_interface__["data"][0] - self._arena_addr
        return offset if 0 <= offset and offset + arr.nbytes <= self.arena.size else None

    # --- the Engine interface -----------------------------------------------------------

    def lookup(self, name: str, version: str | None = None) -> ModelInfo:
        return lookup_info(self.infos, name, version)

    async def infer(self, call: InferCall) -> dict[str, np.ndarray | ShmOutput]:
        self.lookup(call.model, call.version)
        arrays = {name: np.ascontiguousarray(arr) for name, arr in call.feeds.items()}
        # Tensors the HTTP front-end already received into the arena (``body_buffer``) go
        # by place; the request's owner keeps their block until the reply.
        in_arena = {name: off for name, arr in arrays.items()
                    if arr.nbytes and (off := self._arena_offset(arr)) is not None}
        places, total = {}, 0
        for name, arr in arrays.items():
            if name in in_arena:
                continue
            places[name] = total
            total += -(-arr.nbytes // 64) * 64
        held: list[tuple[int, int]] = []

        def release() -> None:
            for offset, n in held:
                self.arena.release(offset, n)
            if held:
                self._space.set()
            held.clear()

        base = None
        if total and total <= self.arena.size:
            # One block per request (no partial holds); wait while the arena is full:
            # back-pressure on the worker, never a second path for the same bytes.
            while (base := self.arena.alloc(total)) is None:
                self._space.clear()
                await self._space.wait()
            held.append((base, total))
        feeds = []
        try:
            for name, arr in arrays.items():
                if name in in_arena:
                    where = ["arena", in_arena[name]]
                elif base is None:   # larger than the whole arena (a huge JSON request)
                    where = ["inline", arr.tobytes()]
                else:
                    offset = base + places[name]
                    dst = np.frombuffer(self.arena.buf, np.uint8, arr.nbytes, offset)
                    dst[:] = arr.reshape(-1).view(np.uint8)
                    where = ["arena", offset]
                feeds.append([name, dtype_name(arr.dtype), list(arr.shape), where])
        except BaseException:
            release()
            raise
        reply = await self._call({
            "op": "infer", "model": call.model, "version": call.version,
            "feeds": feeds,
            "shm_in": [[n, *s.ref, dtype_name(s.dtype), s.shape] for n, s in call.shm_inputs.items()],
            "outputs": [[o.name, o.binary] for o in call.outputs],
            "shm_out": [[n, *r] for n, r in call.shm_outputs.items()],
        }, on_reply=release)
        out: dict[str, np.ndarray | ShmOutput] = {}
        for name, dtype, shape, data, ref in reply["outputs"]:
            dt = np.dtype(dtype)
            if ref is None:
                out[name] = np.frombuffer(data, dt).reshape(shape)
            else:
                out[name] = ShmOutput(tuple(shape), dt, ShmRef(*ref))
        return out

    async def ready(self, name: str | None = None) -> bool:
        return (await self._call({"op": "ready", "name": name}))["value"]

    async def classify(self, name: str, image: bytes, k: int) -> list:
        top = (await self._call({"op": "classify", "name": name, "image": image, "k": k}))["value"]
        return [tuple(t) for t in top]

    async def stats(self, name: str | None = None, version: str | None = None) -> dict:
        return (await self._call({"op": "stats", "name": name, "version": version}))["value"]

    async def metrics_text(self) -> bytes:
        return (await self._call({"op": "metrics"}))["value"]

    async def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        await self._call({"op": "shm_register", "args": [name, key, offset, byte_size]})

    async def shm_unregister(self, name: str | None = None) -> None:
        await self._call({"op": "shm_unregister", "name": name})

    async def shm_status(self, name: str | None = None) -> list[dict]:
        return (await self._call({"op": "shm_status", "name": name}))["value"]

    def connection_closed(self, tag: int) -> None:
        """Tell the engine that a connection it dealt here (``tag``: b"c"[0] HTTP, b"g"[0]
        gRPC) is gone, so that it deals by the connections each worker holds open."""
        if not self.lost.is_set():
            self._outbox.put({"op": "closed", "tag": tag})

    def record_request(self, model: str, endpoint: str, status: int, seconds: float) -> None:
        """Queue the report of an answered request; it goes at the end of this turn of the
        event loop (with the others of the turn), or with the next request to the engine."""
        if self.lost.is_set():
            return
        if not self._records and self._loop is not None:
            self._loop.call_soon(self._flush_records)
        self._records.append([model, endpoint, status, seconds])
        if self._loop is None:   # not serving yet (no loop to wait for): send it now
            self._flush_records()

    def _flush_records(self) -> None:
        """Reports no request of this turn took along: a message of their own, in this
        turn's frame (scheduled after the frame's flush, so the frame is out already)."""
        if not self._records or self.lost.is_set():
            self._records.clear()
            return
        records, self._records = self._records, []
        self._outbox.put({"op": "records", "records": records})
        self._outbox.flush()


def worker_main(argv: list[str] | None = None) -> int:
    """Entry point of one front-end process (``python -m runtime_py.server.workers``)."""
    from .run import run_async, run_front_ends

    ap = argparse.ArgumentParser()
    for flag in ("--ipc-fd", "--http-fd", "--arena-fd", "--arena-bytes", "--slot-bytes",
                 "--max-body-bytes"):
        ap.add_argument(flag, type=int, required=True)
    ap.add_argument("--host", required=True)
    ap.add_argument("--grpc-port", type=int, default=None)
    ap.add_argument("--handoff-fd", type=int, default=None)
    ap.add_argument("--log-level", default="warning")
    ap.add_argument("--access-log", action="store_true")
    ap.add_argument("--http-server", default="builtin")
    ap.add_argument("--grpc-server", default="builtin")
    ap.add_argument("--grpc-dealt", action="store_true",
                    help="gRPC connections come over the handoff socket")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    conn = Connection(args.ipc_fd)
    buf = mmap.mmap(args.arena_fd, args.arena_bytes)
    os.close(args.arena_fd)
    hello = _unpack(conn.recv_bytes())
    infos = {d["name"]: _info_from_wire(d) for d in hello["models"]}
    engine = RemoteEngine(conn, SlotArena(buf, args.slot_bytes, args.arena_bytes // args.slot_bytes),
                          infos)
    http_sock = socket.socket(fileno=args.http_fd)
    handoff = (socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=args.handoff_fd)
               if args.handoff_fd is not None else None)

    def bound(addresses: dict) -> None:
        engine._send({"op": "hello", "ok": True, "addresses": addresses})

    async def main() -> None:
        engine.start(asyncio.get_running_loop(), lambda: os.kill(os.getpid(), signal.SIGTERM))
        await run_front_ends(engine, http_sock, args.host, args.grpc_port,
                             max_body_bytes=args.max_body_bytes, log_level=args.log_level,
                             access_log=args.access_log, on_bound=bound, grpc_reuse_port=True,
                             http_server=args.http_server, grpc_server=args.grpc_server,
                             grpc_dealt=args.grpc_dealt, handoff=handoff)

    try:
        with serving_gc():       # the worker's per-request Python, as the engine's loop
            run_async(main())
    except AddressInUseError as e:
        engine._send({"op": "hello", "ok": False, "message": str(e)})
        return 7
    except KeyboardInterrupt:
        pass
    return 0


# --- the engine side ----------------------------------------------------------------------

class _Worker:
    def __init__(self, index: int, proc: subprocess.Popen, conn: Connection,
                 arena: mmap.mmap, handoff: socket.socket | None = None) -> None:
        self.index, self.proc, self.conn, self.arena = index, proc, conn, arena
        self.handoff = handoff      # where its connections are sent (built-in servers)
        # connections dealt to it and not yet reported closed, by tag (b"c", b"g")
        self.connections: dict[bytes, int] = {}
        self.lock = threading.Lock()
        self.hello: dict | None = None
        # replies of one turn of the engine's loop, one frame; a worker that cannot be
        # written to is gone, and its requests with it
        self.outbox = _Outbox(self._write, lambda msgs: None)
        # its messages, read whole on the engine's loop (set when the loop watches it)
        self.reader: FrameReader | None = None

    def _write(self, data: bytes) -> None:
        with self.lock:
            self.conn.send_bytes(data)

    def send(self, msg: dict) -> None:
        """Write one message now, outside any frame (``hello``)."""
        self._write(_pack(msg))

    def reply(self, msg: dict) -> None:
        """Queue a reply for this turn's frame; one msgpack cannot carry (an error message
        quoting a client's lone surrogate) becomes an error reply of its own."""
        try:
            self.outbox.put(msg)
        except UNPACKABLE as exc:
            self.outbox.put({"id": msg["id"], "ok": False, "status": 500,
                             "message": f"the engine's reply could not be encoded "
                                        f"({type(exc).__name__})"})

    def open_connections(self, tag: bytes) -> int:
        """Connections of kind ``tag`` dealt to this worker and open (the metrics' gauge)."""
        return self.connections.get(tag, 0)

    def connection_closed(self, tag: int) -> None:
        """A connection dealt to this worker is gone (its ``closed`` report)."""
        key = bytes([tag])
        self.connections[key] = max(0, self.connections.get(key, 0) - 1)


class EngineHost:
    """Answers the workers' messages on the engine process's event loop."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def record(self, msg: dict) -> None:
        """Apply the request reports a message carries (``RemoteEngine.record_request``)."""
        for args in msg.pop("records", ()):
            self.engine.record_request(*args)

    async def handle(self, w: _Worker, msg: dict) -> None:
        op = msg["op"]
        try:
            reply = {"id": msg["id"], "ok": True}
            reply.update(await self._answer(w, op, msg))
        except Exception as e:
            reply = self._error_reply(msg["id"], op, e)
        w.reply(reply)

    def start_infer(self, w: _Worker, msg: dict) -> asyncio.Future | None:
        """Answer an infer message without a task: the request goes to the batcher now and
        its reply is written from the batcher future's done-callback. A task per request
        (creation, two steps, its coroutine frames) was most of the Python the engine's
        loop spent on a request, and every request crosses that loop. Returns the future
        (for shutdown to wait on), or None when the request was refused at once."""
        try:
            fut, finish = self.engine.start_infer(self._call_of(w, msg))
        except Exception as e:
            w.reply(self._error_reply(msg["id"], "infer", e))
            return None
        msg_id = msg["id"]

        def done(f: asyncio.Future) -> None:
            try:
                reply = {"id": msg_id, "ok": True, "outputs": self._outputs(finish(f))}
            except BaseException as e:   # CancelledError too: the worker still gets a reply
                reply = self._error_reply(msg_id, "infer", e)
            w.reply(reply)
        fut.add_done_callback(done)
        return fut

    @staticmethod
    def _error_reply(msg_id: int, op: str, e: BaseException) -> dict:
        status = status_of(e)
        if status >= 500 and not isinstance(e, RequestError):
            log.error("engine: %s failed", op, exc_info=e)
        from .app import error_message
        return {"id": msg_id, "ok": False, "status": status,
                "message": error_message(e, status)}

    async def _answer(self, w: _Worker, op: str, msg: dict) -> dict:
        e = self.engine   # "infer" never comes here: ``start_infer`` answers it
        if op == "ready":
            name = msg["name"]
            return {"value": await e.ready(e.lookup(name).name if name else None)}
        if op == "classify":
            top = await e.classify(msg["name"], msg["image"], msg["k"])
            return {"value": [list(t) for t in top]}
        if op == "stats":
            return {"value": await e.stats(msg["name"], msg["version"])}
        if op == "metrics":
            return {"value": await e.metrics_text()}
        if op == "shm_register":
            await e.shm_register(*msg["args"])
            return {}
        if op == "shm_unregister":
            await e.shm_unregister(msg["name"])
            return {}
        if op == "shm_status":
            return {"value": await e.shm_status(msg["name"])}
        raise RequestError(f"unknown engine operation {op!r}", 500)

    @staticmethod
    def _call_of(w: _Worker, msg: dict) -> InferCall:
        # This runs for every request on the engine's one event loop (module docstring):
        # math.prod and the dtype cache instead of np.prod and np.dtype (a few us each).
        feeds = {}
        for name, dtype, shape, (kind, where) in msg["feeds"]:
            dt = _dtype(dtype)
            count = math.prod(shape)
            if kind == "arena":
                feeds[name] = np.frombuffer(w.arena, dt, count, where).reshape(shape)
            else:
                feeds[name] = np.frombuffer(where, dt, count).reshape(shape)
        shm_in = {n: ShmInput(ShmRef(r, o, s), _dtype(dt), shape)
                  for n, r, o, s, dt, shape in msg["shm_in"]}
        return InferCall(msg["model"], msg["version"], None, feeds, shm_in,
                         [OutputRequest(n, b) for n, b in msg["outputs"]],
                         {n: ShmRef(r, o, s) for n, r, o, s in msg["shm_out"]})

    @staticmethod
    def _outputs(results: dict[str, np.ndarray | ShmOutput]) -> list:
        out = []
        for name, r in results.items():
            if isinstance(r, ShmOutput):
                out.append([name, dtype_name(r.dtype), list(r.shape), None, list(r.ref)])
            else:
                le = np.ascontiguousarray(r, dtype=r.dtype.newbyteorder("<"))
                out.append([name, dtype_name(r.dtype), list(r.shape), le.tobytes(), None])
        return out


def deal_connections(listening: socket.socket, workers: list[_Worker], tag: bytes = b"c"
                     ) -> None:
    """Accept every pending connection and send each to the worker that holds the fewest
    of its kind open (SCM_RIGHTS over its handoff socket, with ``tag``: b"c" HTTP, b"g"
    gRPC, ``run.receive_connections``).

    Why: with the listening socket shared, whichever worker woke first took a connection;
    on the H200 (64 clients, 8 workers) the busiest worker did 3x the work of the idlest,
    and the clients it held came back last in every batch's round trip. Dealt out here,
    each worker holds its share. Connections count while open (workers report each one
    closed): counted as handed out, the short ones a client opens besides its own (a
    shared-memory registration, a health probe, a metadata call) made the shares uneven.
    Clients that registered a region over a connection of its own and then opened their
    inference connection could all land on half of the workers."""
    while True:
        try:
            conn, _ = listening.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:          # out of descriptors, a connection reset in the queue
            log.warning("accepting a connection failed: %s", e)
            return
        try:
            for w in sorted((w for w in workers if w.handoff is not None),
                            key=lambda w: w.connections.get(tag, 0)):
                try:
                    socket.send_fds(w.handoff, [tag], [conn.fileno()])
                except (BlockingIOError, InterruptedError, OSError):
                    continue          # a worker not reading (busy, exiting): the next one
                w.connections[tag] = w.connections.get(tag, 0) + 1
                break
        finally:
            conn.close()              # the worker holds its own descriptor now


def _reserve_grpc_port(host: str, port: int) -> socket.socket:
    """A bound, non-listening SO_REUSEPORT socket holding the gRPC port while the workers'
    servers (SO_REUSEPORT too) bind it. A plain bind first proves the port free: with
    SO_REUSEPORT alone, another server of the same user would silently share it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_STREAM)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.bind((host, port))
        port = probe.getsockname()[1]
        probe.close()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as e:
        probe.close()
        sock.close()
        raise AddressInUseError(
            f"cannot listen for gRPC on {host}:{port}: {e.strerror or e}; stop what uses the "
            f"port or pick another with --grpc-port (0 picks a free one)") from None
    return sock


def serve_with_workers(engine: Engine, http_sock: socket.socket, host: str,
                       grpc_port: int | None, workers: int, *, max_body_bytes: int,
                       log_level: str, access_log: bool,
                       on_ready: Callable[[dict[str, str]], None] | None = None,
                       stop: threading.Event | None = None,
                       http_server: str = "builtin", grpc_server: str = "builtin") -> None:
    """Run ``workers`` front-end processes over ``engine`` until SIGINT/SIGTERM (or
    ``stop`` is set, for callers on another thread); every child is reaped on return."""
    from .run import run_async

    with serving_gc():
        run_async(_serve_with_workers(engine, http_sock, host, grpc_port, workers,
                                        max_body_bytes=max_body_bytes, log_level=log_level,
                                        access_log=access_log, on_ready=on_ready, stop=stop,
                                        http_server=http_server, grpc_server=grpc_server))


async def _serve_with_workers(engine, http_sock, host, grpc_port, workers, *, max_body_bytes,
                              log_level, access_log, on_ready, stop, http_server,
                              grpc_server="builtin") -> None:
    from .run import bound_port, http_url

    loop = asyncio.get_running_loop()
    # gRPC: the built-in server's connections are accepted here and dealt out like HTTP's;
    # grpcio's workers share the port (SO_REUSEPORT), held here until they have bound it.
    deal_grpc = grpc_port is not None and grpc_server == "builtin"
    grpc_sock = reserved = None
    if deal_grpc:
        from .run import bind_grpc

        grpc_sock = bind_grpc(host, grpc_port)
        gport = grpc_sock.getsockname()[1]
    elif grpc_port is not None:
        reserved = _reserve_grpc_port(host, grpc_port)
        gport = reserved.getsockname()[1]
    else:
        gport = None
    infos = list(engine.infos.values())
    slot = slot_bytes(infos)
    # Room for the largest request the front-ends accept (pages are only backed once used).
    slots = max(SLOTS, -(-max_body_bytes // slot))
    hello = {"op": "hello", "models": [_info_to_wire(i) for i in infos]}
    host_ = EngineHost(engine)
    # The workers import runtime_py from wherever this process did (an uninstalled
    # checkout, a script's sys.path), not only from site-packages.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    procs: list[_Worker] = []
    stopping = asyncio.Event()
    failure: list[str] = []
    tasks: set[asyncio.Future] = set()   # requests in flight (tasks, or infer futures)
    pinned: list = []                    # page-locked arena ranges (unlocked last)
    # The built-in HTTP server's connections are accepted here and dealt out to the workers,
    # each to the one that holds the fewest open (``deal_connections``); uvicorn's workers
    # accept from the shared socket.
    deal = http_server == "builtin"
    dealing = False
    handoffs = deal or deal_grpc

    def on_message(w: _Worker) -> None:
        # Every message already here, in order: a worker's one-way metric reports must not
        # lag behind another worker's /metrics request.
        for data in w.reader.read():
            for msg in _messages(data):
                if msg.get("op") == "hello":
                    w.hello = msg
                    continue
                host_.record(msg)   # reports first, in order, without a task
                op = msg["op"]
                if op == "closed":
                    w.connection_closed(msg["tag"])
                    continue
                if op == "infer":
                    fut = host_.start_infer(w, msg)
                    if fut is not None:
                        tasks.add(fut)
                        fut.add_done_callback(tasks.discard)
                elif op != "records":
                    task = loop.create_task(host_.handle(w, msg))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
        if w.reader.eof:
            loop.remove_reader(w.conn.fileno())
            w.reader.close()
            if not stopping.is_set():
                failure.append(f"front-end worker {w.index} exited (code {w.proc.poll()})")
                stopping.set()

    try:
        for i in range(workers):
            ours, theirs = socket.socketpair()
            for sock in (ours, theirs):   # deep buffers: neither side waits on a busy peer
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            handoff = theirs_handoff = None
            if handoffs:
                handoff, theirs_handoff = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                handoff.setblocking(False)
            fd = os.memfd_create(f"trt-bundle-arena-{i}", os.MFD_CLOEXEC)
            os.ftruncate(fd, slot * slots)
            arena = mmap.mmap(fd, slot * slots)
            # The arena's first slots (those handed out first) page-locked for a GPU
            # engine, which then copies rows from there (no host gather of a batch).
            region = engine.pin_host(buffer_address(arena), min(len(arena), PINNED_SLOTS * slot))
            if region is not None:
                pinned.append(region)
            child_fd = os.dup(fd)    # inheritable (memfd's own fd is close-on-exec)
            os.close(fd)
            cmd = [sys.executable, "-m", "runtime_py.server.workers",
                   "--ipc-fd", str(theirs.fileno()), "--http-fd", str(http_sock.fileno()),
                   "--arena-fd", str(child_fd), "--arena-bytes", str(slot * slots),
                   "--slot-bytes", str(slot), "--max-body-bytes", str(max_body_bytes),
                   "--host", host, "--log-level", log_level, "--http-server", http_server,
                   "--grpc-server", grpc_server]
            if deal_grpc:
                cmd.append("--grpc-dealt")
            elif gport is not None:
                cmd += ["--grpc-port", str(gport)]
            if access_log:
                cmd.append("--access-log")
            pass_fds = [theirs.fileno(), http_sock.fileno(), child_fd]
            if theirs_handoff is not None:
                cmd += ["--handoff-fd", str(theirs_handoff.fileno())]
                pass_fds.append(theirs_handoff.fileno())
            proc = subprocess.Popen(cmd, pass_fds=pass_fds,
                                    start_new_session=True,   # Ctrl-C reaches the engine only
                                    env=env)
            os.close(child_fd)
            theirs.close()
            if theirs_handoff is not None:
                theirs_handoff.close()
            conn = Connection(os.dup(ours.fileno()))
            ours.close()
            w = _Worker(i, proc, conn, arena, handoff)
            w.outbox.bind(loop)
            procs.append(w)
            for tag, dealt in ((b"c", deal), (b"g", deal_grpc)):
                if dealt:
                    engine.metrics.watch_connections(str(i), _PROTOCOL_OF_TAG[tag],
                                                     functools.partial(w.open_connections, tag))
            w.send(hello)
            w.reader = FrameReader(conn.fileno())
            loop.add_reader(conn.fileno(), on_message, w)
            # uvloop (libuv) makes a watched fd non-blocking; messages are read and written
            # whole, which needs blocking calls (the reader only reads when data is there).
            os.set_blocking(conn.fileno(), True)
        deadline = time.monotonic() + 60
        while any(w.hello is None for w in procs) and not stopping.is_set():
            if time.monotonic() > deadline:
                raise ServingError("front-end workers did not start within 60 s")
            await asyncio.sleep(0.02)
        bad = [w.hello["message"] for w in procs if w.hello and not w.hello["ok"]]
        if bad:
            raise AddressInUseError(bad[0])
        if failure:
            raise ServingError(failure[0])
        if reserved is not None:
            reserved.close()
            reserved = None
        signals = (signal.SIGINT, signal.SIGTERM)
        if threading.current_thread() is not threading.main_thread():
            signals = ()   # a caller on another thread stops us through ``stop``
        for sig in signals:
            loop.add_signal_handler(sig, stopping.set)
        if deal:
            http_sock.setblocking(False)
            loop.add_reader(http_sock.fileno(), deal_connections, http_sock, procs)
            dealing = True
        if grpc_sock is not None:
            grpc_sock.setblocking(False)
            loop.add_reader(grpc_sock.fileno(), deal_connections, grpc_sock, procs, b"g")
        if on_ready is not None:
            addresses = {"http": http_url(host, bound_port(http_sock))}
            if gport is not None:
                addresses["grpc"] = f"{host}:{gport}"
            on_ready(addresses)
        while not stopping.is_set():
            if stop is not None and stop.is_set():
                break
            try:
                await asyncio.wait_for(stopping.wait(), 0.2)
            except asyncio.TimeoutError:
                pass
    finally:
        stopping.set()   # from here on a worker's exit is expected
        if dealing:
            loop.remove_reader(http_sock.fileno())
            http_sock.setblocking(True)
        if grpc_sock is not None:
            try:
                loop.remove_reader(grpc_sock.fileno())
            except (ValueError, OSError):
                pass
            grpc_sock.close()
        for w in procs:
            if w.handoff is not None:
                w.handoff.close()      # the worker's receiver sees the end
        if reserved is not None:
            reserved.close()
        for w in procs:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        # Keep answering the workers while they finish their requests in flight.
        deadline = time.monotonic() + 15
        while any(w.proc.poll() is None for w in procs) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for w in procs:
            if w.proc.poll() is None:
                w.proc.kill()
            w.proc.wait()
            try:
                loop.remove_reader(w.conn.fileno())
            except (ValueError, OSError):
                pass
            if w.reader is not None:
                w.reader.close()      # its duplicate descriptor too, or the pair stays open
            w.conn.close()
        if tasks:
            await asyncio.gather(*list(tasks), return_exceptions=True)
        for region in pinned:     # every request answered: no copy reads them any more
            region.unpin()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
    if failure:
        raise ServingError(failure[0])


if __name__ == "__main__":
    sys.exit(worker_main())
