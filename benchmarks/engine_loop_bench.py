"""CPU per request on the engine process's event loop, the one point every request of the
front-end workers crosses twice (``runtime_py/server/workers.py``: ``EngineHost``).

    python benchmarks/engine_loop_bench.py [--rounds 100] [--repeats 7] [--image-size 32]

Drives ``EngineHost.start_infer`` (what the engine's loop does with an infer message) on one
asyncio loop with batches of 32 infer messages as a
worker sends them (one uint8 image each in the worker's arena, or in a registered
shared-memory region with ``--shm``), over a real ``Batcher`` and the synthetic GPU-like
model of ``serve_bench.py --synthetic --light`` (no per-batch cost), and prints the loop
thread's CPU time per request (``time.thread_time``: the batcher's and the model's threads
are not counted), each repeat, sorted. (The reply is written from the batcher future's
done-callback; the former task per request measured 1.25x this in one interleaved run,
``docs/measurements/serve_2core.md``.) A small image keeps the batcher's copy out of the
way; what is left is the per-request Python on the loop. Each batch arrives as one
frame with a request report in each message, read as the engine's loop reads a worker's
(``--no-frames``: dicts handed over, the figures of earlier sessions). Each repeat runs
under the process's collector settings and under ``serving_gc`` (what the server's loops
run under), interleaved; the ratio is printed.

Not a GPU figure: on the H200 this cost repeats for each of a batch's 32 requests between
one batch's end and the next one's start, which is why it is worth a benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import mmap
import os
import statistics
import sys
import time
from multiprocessing import shared_memory

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import serve_bench  # noqa: E402
from runtime_py.batcher import Batcher  # noqa: E402
from runtime_py.server.engine import Engine  # noqa: E402
from runtime_py.server.gc_tuning import serving_gc  # noqa: E402
from runtime_py.server.workers import EngineHost, _messages, _pack, _Worker  # noqa: E402

BATCH = 32


class _Sink:
    """The worker's end of the connection: replies are counted, not read."""

    frames = 0

    def send_bytes(self, data: bytes) -> None:
        _Sink.frames += 1


def main(argv: list[str] | None = None) -> list[float]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=100, help="batches of 32 per repeat")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--shm", action="store_true",
                    help="inputs and outputs in a registered shared-memory region")
    ap.add_argument("--no-frames", action="store_true",
                    help="messages handed over as dicts, without the request reports "
                         "(the figures before 2026-12-02's ninth session)")
    args = ap.parse_args(argv)

    model = serve_bench.make_model(argparse.Namespace(
        synthetic=True, light=True, image_size=args.image_size, batch=BATCH, cost_ms=0.0,
        per_row_ms=0.0, dtype="uint8"))
    batcher = Batcher(model, max_batch_size=BATCH, max_delay_ms=2.0)
    engine = Engine({"synthetic": model}, {"synthetic": batcher})
    host = EngineHost(engine)
    shape = [1, 3, args.image_size, args.image_size]
    nbytes = 3 * args.image_size * args.image_size
    slot = -(-nbytes // 4096) * 4096
    arena = mmap.mmap(-1, BATCH * slot)
    worker = _Worker(0, None, _Sink(), arena)
    seg = None
    if args.shm:
        seg = shared_memory.SharedMemory(create=True, size=BATCH * (slot + 4096))
        engine.shm.register("bench", "/" + seg.name, 0, seg.size)

    def message(i: int) -> dict:
        k = i % BATCH
        msg = {"op": "infer", "id": i, "model": "synthetic", "version": None, "feeds": [],
               "shm_in": [], "outputs": [["logits", True]], "shm_out": []}
        if seg is None:
            msg["feeds"] = [["input", "uint8", shape, ["arena", k * slot]]]
        else:
            msg["shm_in"] = [["input", "bench", k * slot, nbytes, "uint8", shape]]
            msg["shm_out"] = [["logits", "bench", BATCH * slot + k * 128, 128]]
        return msg

    def frame(r: int) -> bytes:
        # one turn of a worker: the batch's messages in one frame, each carrying the report
        # of an earlier answered request (``RemoteEngine.record_request``)
        msgs = [message(r * BATCH + i) for i in range(BATCH)]
        for m in msgs:
            m["records"] = [["synthetic", "infer", 200, 0.002]]
        return _pack(msgs)

    async def repeat(rounds: int) -> float:
        worker.outbox.bind(asyncio.get_running_loop())
        frames = _Sink.frames
        packed = None if args.no_frames else [frame(r) for r in range(rounds)]
        t = time.thread_time()
        for r in range(rounds):
            if packed is None:
                futures = [host.start_infer(worker, message(r * BATCH + i))
                           for i in range(BATCH)]
            else:   # what the engine loop's ``on_message`` does with a worker's frame
                futures = []
                for msg in _messages(packed[r]):
                    host.record(msg)
                    futures.append(host.start_infer(worker, msg))
            await asyncio.gather(*futures)
            await asyncio.sleep(0)     # the replies' callbacks and the frame
        if _Sink.frames == frames:
            raise SystemExit("no reply was written")
        return (time.thread_time() - t) / (rounds * BATCH) * 1e6

    try:
        asyncio.run(repeat(10))   # warm-up
        # the process's own collector settings and serving's (``serving_gc``, what `bundle
        # serve` runs its loops under), interleaved so that both see the same host
        plain, serving = [], []
        for _ in range(args.repeats):
            plain.append(asyncio.run(repeat(args.rounds)))
            with serving_gc():
                serving.append(asyncio.run(repeat(args.rounds)))
        figures = sorted(serving)
    finally:
        batcher.close()
        engine.close()
        if seg is not None:
            seg.close()
            seg.unlink()
    where = "shared memory" if seg is not None else "arena"
    where += ", dict messages" if args.no_frames else ", frames with reports"
    print(f"engine loop CPU per request ({where}, {args.image_size}x{args.image_size} uint8, "
          f"batches of {BATCH}), sorted:")
    for label, values in (("serving gc", serving), ("default gc", plain)):
        values = sorted(values)
        print(f"  {label}: " + ", ".join(f"{f:.1f}" for f in values)
              + f" us (median {statistics.median(values):.1f})")
    print(f"  serving / default (medians): "
          f"{statistics.median(serving) / statistics.median(plain):.2f}")
    return figures


if __name__ == "__main__":
    main()
