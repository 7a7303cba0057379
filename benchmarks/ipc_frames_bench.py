"""The engine/worker IPC socket read two ways, side by side: ``Connection.recv_bytes`` with a
``poll`` before each further frame (how the engine's loop and the workers read until the
sixteenth session) against ``runtime_py.server.frames.FrameReader`` (one non-blocking
``recv_into`` per wake-up, frames cut from the buffer).

Why: every request crosses the engine's event loop twice (its infer message in, its reply
out), on one thread; that loop's time per batch is part of the round trip that sets a
64-client service's pace (docs/measurements/h200-2026-12-03-g).

    PYTHONPATH=. python3 benchmarks/ipc_frames_bench.py [--messages 20000] [--burst 4]

Prints microseconds per message read for each, alternating, and the ratio. Measured on the
2-core host: 5.2 against 2.0 us per message (bursts of 4 messages of 300 bytes).
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import sys
import time
from multiprocessing.connection import Connection

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from runtime_py.server.frames import FrameReader  # noqa: E402


def per_message_us(kind: str, messages: int, burst: int, size: int) -> float:
    a, b = socket.socketpair()
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    ours, theirs = Connection(a.detach()), Connection(b.detach())
    payload = b"x" * size
    reader = FrameReader(ours.fileno()) if kind == "frames" else None
    poller = select.poll()
    poller.register(ours.fileno(), select.POLLIN)
    spent, got = 0.0, 0
    try:
        for _ in range(messages // burst):
            for _ in range(burst):
                theirs.send_bytes(payload)
            t0 = time.perf_counter()
            n = 0
            if reader is not None:
                while n < burst:
                    n += len(reader.read())
            else:
                while n < burst:
                    ours.recv_bytes()
                    n += 1
                    poller.poll(0)     # the old reader's "another frame waiting?" after each
            spent += time.perf_counter() - t0
            got += n
    finally:
        if reader is not None:
            reader.close()
        ours.close()
        theirs.close()
    return spent / got * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--burst", type=int, default=4, help="messages written before each read")
    ap.add_argument("--size", type=int, default=300, help="bytes per message")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    for r in range(args.rounds):
        old = per_message_us("recv_bytes", args.messages, args.burst, args.size)
        new = per_message_us("frames", args.messages, args.burst, args.size)
        print(f"round {r + 1}: recv_bytes + poll {old:.2f} us/message, FrameReader "
              f"{new:.2f} us/message: {old / new:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
