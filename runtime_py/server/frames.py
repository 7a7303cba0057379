"""Reading the engine/worker IPC socket: whole frames, as few system calls as the data allows.

The engine process and each front-end worker talk over a socket pair in
``multiprocessing.connection``'s framing (a 4-byte big-endian length, or -1 and an 8-byte
length for a frame over 2 GiB, then the bytes); the writer is ``Connection.send_bytes``.
Reading it with ``Connection.recv_bytes`` costs two system calls per frame (header, body),
and a reader that drains what is there must ask ``poll`` before each frame whether another
follows: three system calls per frame. On the engine's event loop, the one thread every
request crosses, those were 35% of its CPU per request (py-spy, 2-core host, HTTP with 2
workers), and that loop's time per batch is part of the round trip that sets a 64-client
service's pace (docs/measurements/h200-2026-12-03-g). ``FrameReader.read`` takes what the
socket holds in one ``recv_into`` (without blocking, whatever the descriptor's mode: the
writer side keeps it blocking) and cuts it into frames, keeping a partial one for the next
call. The event loop's readers are level-triggered, so bytes left unread wake it again.
"""

from __future__ import annotations

import os
import socket
import struct

__all__ = ["FrameReader"]

_HEADER = struct.Struct("!i")
_LONG_HEADER = struct.Struct("!Q")


class FrameReader:
    """Frames from the socket ``fd`` (not closed here: it reads a duplicate)."""

    def __init__(self, fd: int, chunk: int = 1 << 18) -> None:
        self._sock = socket.socket(fileno=os.dup(fd))
        self._chunk = chunk
        self._buf = bytearray(chunk)
        self._start = 0          # first byte not yet returned as a frame
        self._end = 0            # end of the bytes read
        self.eof = False

    def close(self) -> None:
        """Close this reader's descriptor (a duplicate: the connection's own stays open);
        calling it again does nothing."""
        self._sock.close()

    def read(self) -> list[bytes]:
        """The frames completed by what the socket holds now (maybe none), in order: all of
        it, as the reader it replaces drained the socket before it returned (a read that
        fills the buffer is followed by another). At end of file (or a reset connection)
        ``eof`` is set; frames completed before it are still returned first."""
        frames: list[bytes] = []
        while not self.eof:
            need = self._needed()
            if self._end + max(need, 1) > len(self._buf):
                self._make_room(need)
            room = len(self._buf) - self._end
            try:
                with memoryview(self._buf) as view:
                    n = self._sock.recv_into(view[self._end:], 0, socket.MSG_DONTWAIT)
            except InterruptedError:
                continue
            except BlockingIOError:
                break
            except OSError:
                n = 0
            if n == 0:
                self.eof = True
                break
            self._end += n
            frames += self._frames()
            if n < room:          # the socket had less than the room: it is drained
                break
        return frames

    def _frames(self) -> list[bytes]:
        frames = []
        buf, start, end = self._buf, self._start, self._end
        while True:
            length = _frame_length(buf, start, end)
            if length is None or length[0] > end - start:
                break
            total, head = length
            frames.append(bytes(buf[start + head:start + total]))
            start += total
        if start == end:
            start = end = 0           # all consumed: the next read starts at the front
            if len(buf) > 4 * self._chunk:     # a big frame is gone: so is its room
                self._buf = bytearray(self._chunk)
        self._start, self._end = start, end
        return frames

    def _needed(self) -> int:
        """Bytes the partial frame at the front still needs to be whole (0 if unknown)."""
        length = _frame_length(self._buf, self._start, self._end)
        return 0 if length is None else max(0, length[0] - (self._end - self._start))

    def _make_room(self, need: int) -> None:
        """Move the partial frame to the front, and grow the buffer if it still cannot take
        ``need`` more bytes (a frame larger than the buffer: a big inline body)."""
        have = self._end - self._start
        if self._start:
            self._buf[:have] = self._buf[self._start:self._end]
            self._start, self._end = 0, have
        if have + max(need, 1) > len(self._buf):
            self._buf.extend(bytes(have + need - len(self._buf)))


def _frame_length(buf: bytearray, start: int, end: int) -> tuple[int, int] | None:
    """(whole frame's bytes, header's bytes) of the frame at ``start``, or None while its
    header is not all in ``buf[start:end]``."""
    if end - start < 4:
        return None
    size = _HEADER.unpack_from(buf, start)[0]
    if size != -1:
        return 4 + size, 4
    if end - start < 12:
        return None
    return 12 + _LONG_HEADER.unpack_from(buf, start + 4)[0], 12
