"""runtime_py/server/frames.py: the IPC socket's frames read in as few system calls as the
data allows, with multiprocessing's framing (the writer is ``Connection.send_bytes``)."""

from __future__ import annotations

import socket
import struct
import threading
from multiprocessing.connection import Connection

import pytest

from runtime_py.server.frames import FrameReader


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    ours, theirs = Connection(a.detach()), Connection(b.detach())
    reader = FrameReader(ours.fileno(), chunk=64)
    yield reader, theirs, ours
    reader.close()
    ours.close()
    if not theirs.closed:
        theirs.close()


def test_a_quiet_socket_gives_nothing_and_does_not_block(pair):
    reader, _, ours = pair
    view = socket.socket(fileno=ours.fileno())
    try:
        assert view.getblocking()        # the writer's side stays blocking
        assert reader.read() == [] and not reader.eof
        assert view.getblocking()
    finally:
        view.detach()


def test_every_frame_waiting_comes_in_order_from_one_read(pair):
    reader, theirs, _ = pair
    frames = [b"a", b"", b"x" * 40, b"tail"]
    for f in frames:
        theirs.send_bytes(f)
    got = []
    while len(got) < len(frames):
        got += reader.read()
    assert got == frames


def test_a_frame_larger_than_the_buffer_grows_it_and_then_gives_the_room_back(pair):
    reader, theirs, _ = pair
    big = bytes(range(256)) * 4096          # 1 MiB against a 64-byte buffer
    writer = threading.Thread(target=theirs.send_bytes, args=(big,))
    writer.start()
    got = []
    while not got:                          # arrives in pieces; none is a frame alone
        got += reader.read()
    writer.join()
    assert got == [big]
    theirs.send_bytes(b"after")
    assert reader.read() == [b"after"]
    assert len(reader._buf) == 64           # the big frame's room is freed


def test_a_frame_split_inside_its_header_is_kept_for_the_next_read(pair):
    reader, theirs, _ = pair
    raw = socket.socket(fileno=theirs.fileno())
    try:
        frame = struct.pack("!i", 5) + b"hello"
        raw.sendall(frame[:2])
        assert reader.read() == []
        raw.sendall(frame[2:7])
        assert reader.read() == []
        raw.sendall(frame[7:] + struct.pack("!i", -1) + struct.pack("!Q", 3) + b"abc")
        assert reader.read() == [b"hello", b"abc"]   # the long header form too
    finally:
        raw.detach()


def test_end_of_file_after_the_last_frames(pair):
    reader, theirs, _ = pair
    theirs.send_bytes(b"last")
    theirs.close()
    got = reader.read()
    while not reader.eof:
        got += reader.read()
    assert got == [b"last"] and reader.eof


def test_one_read_drains_more_than_its_buffer_holds(pair):
    """Many frames waiting, more bytes than the buffer: one call returns every one of
    them (the engine's loop relies on that order: a worker's reports before another's
    /metrics request), and the buffer is back to its size."""
    reader, theirs, _ = pair
    frames = [bytes([i]) * 50 for i in range(40)]      # 2,160 bytes against 64
    for f in frames:
        theirs.send_bytes(f)
    assert reader.read() == frames
    assert len(reader._buf) == 64


def test_close_releases_the_duplicate_descriptor(pair):
    import os

    reader, _, _ = pair
    fd = reader._sock.fileno()
    reader.close()
    reader.close()                                     # again: nothing
    with pytest.raises(OSError):
        os.fstat(fd)
