"""The in-process data path of GPU bundles, measured side by side in one process (issue 14).

    python benchmarks/data_path_bench.py --bundle FP16.bundle --bundle FP8.bundle [...]

For each bundle (loaded with runtime_py.load; all bundles stay loaded, figures are taken
bundle after bundle in one process), at batch 1 and --batch:
  engine        the runner's device_timings "graph_replay": the engine alone on its device
                input (CUDA graph replay), no host copies                      [median]
  with_copies   device_timings "with_copies": pinned H2D + replay + D2H         [median]
  infer         Model.infer on a plain numpy batch (the runner's default staging: on
                torch-aoti "auto", pinned staging below 4 MB, else the CUDA
                driver's pageable copy)                                        [median]
  infer_pinned  Model.infer on a batch written into Model.input_buffers() (pinned:
                read in place, no host copy)                                   [median]
  staged        infer on the plain batch with the runner's staging = "pinned": a
                threaded copy into pinned staging, each chunk's async H2D as soon
                as it is copied                                                [median]
  pageable      the same with staging = "pageable" (the driver's copy)         [median]
                (engine, with_copies and the infer variants are timed in 5 interleaved
                rounds, so clock drift during the run hits all of them alike)
  raw img/s     Model.infer of plain batches of --batch, back to back, one thread
  batcher img/s --clients threads, each submitting one image (Batcher.infer) and waiting
  async img/s   --clients asyncio tasks on one event loop, each awaiting submit_async of
                one image (what the HTTP/gRPC front-ends do)
Ratios printed: infer / with_copies, infer_pinned / with_copies, batcher / raw,
batcher / engine and async / engine img/s; and between the first two bundles (e.g. fp8
over fp16) the engine, batcher and async img/s ratios. One JSON line per bundle at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from runtime_py.batcher import Batcher  # noqa: E402
from runtime_py.bench import random_feeds  # noqa: E402


#: Rounds the per-call timings are interleaved in (each round: device timings, then every
#: infer variant), so that a change of GPU clocks during the run hits every figure alike.
ROUNDS = 5


def samples_s(fn, iterations: int, warmup: int = 10) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def staging(runner, mode: str):
    """The runner with ``staging = mode`` for plain batches, restored on exit; a no-op for
    runners without the choice."""
    import contextlib

    @contextlib.contextmanager
    def switched():
        old = getattr(runner, "staging", None)
        if old is not None:
            runner.staging = mode
        try:
            yield
        finally:
            if old is not None:
                runner.staging = old
    return switched()


def raw_rate(model, batch: int, seconds: float) -> float:
    feeds = random_feeds(model.inputs, batch, seed=1)
    for _ in range(5):
        model.infer(feeds)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        model.infer(feeds)
        n += batch
    return n / (time.perf_counter() - t0)


def batcher_rate(model, clients: int, seconds: float, delay_ms: float) -> tuple[float, dict]:
    one = random_feeds(model.inputs, 1, seed=2)
    stop = threading.Event()
    counts = [0] * clients
    with Batcher(model, max_delay_ms=delay_ms) as batcher:
        for _ in range(20):
            batcher.infer(one)

        def client(i: int) -> None:
            while not stop.is_set():
                batcher.infer(one)
                counts[i] += 1

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
        for t in threads:
            t.start()
        time.sleep(min(2.0, seconds / 3))           # warm up under load
        base, t0 = sum(counts), time.perf_counter()
        time.sleep(seconds)
        done, elapsed = sum(counts) - base, time.perf_counter() - t0
        stop.set()
        for t in threads:
            t.join(10)
        sizes = dict(sorted(batcher.batch_size_counts.items()))
    return done / elapsed, sizes


def async_rate(model, clients: int, seconds: float, delay_ms: float) -> float:
    one = random_feeds(model.inputs, 1, seed=2)

    async def run(batcher: Batcher) -> float:
        counts = [0] * clients
        stop = asyncio.Event()

        async def client(i: int) -> None:
            while not stop.is_set():
                await batcher.submit_async(one)
                counts[i] += 1

        tasks = [asyncio.create_task(client(i)) for i in range(clients)]
        await asyncio.sleep(min(2.0, seconds / 3))   # warm up under load
        base, t0 = sum(counts), time.perf_counter()
        await asyncio.sleep(seconds)
        done, elapsed = sum(counts) - base, time.perf_counter() - t0
        stop.set()
        await asyncio.gather(*tasks)
        return done / elapsed

    with Batcher(model, max_delay_ms=delay_ms) as batcher:
        return asyncio.run(run(batcher))


def measure(model, batch: int, clients: int, seconds: float, delay_ms: float, iters: int) -> dict:
    from runtime_py.bench import device_timings

    out: dict = {"bundle": model.bundle.path.name, "backend": model.backend,
                 "input": f"{model.inputs[0].dtype} {list(model.inputs[0].shape)}"}
    name = model.inputs[0].name
    buffers = model.input_buffers()
    choice = getattr(model.runner, "staging", None)
    for n in (1, batch):
        plain = random_feeds(model.inputs, n, seed=3)
        buffers[name][:n] = plain[name]
        pinned = {name: buffers[name][:n]}
        t: dict[str, list[float]] = {k: [] for k in ("engine", "copies", "infer", "infer_staged",
                                                     "infer_pageable", "infer_pinned")}
        # --iterations at the full batch, as many more at batch 1 as the time allows (the
        # same seconds per size): 12 samples per round left b1 ratios 5% apart from
        # infer_overhead.py's 1,500-call figure in one run (h200-2026-12-01-s4/bench.log)
        per = max(1, iters * max(1, batch // n) // ROUNDS)
        for _ in range(ROUNDS):     # interleaved rounds: drift of the GPU clocks hits all alike
            dev = device_timings(model.runner, n, iterations=per, warmup=5) or {}
            t["engine"] += dev.get("graph_replay", [])
            t["copies"] += dev.get("with_copies", [])
            t["infer"] += samples_s(lambda: model.infer(plain), per, warmup=3)
            if choice:
                for mode, key in (("pinned", "infer_staged"), ("pageable", "infer_pageable")):
                    with staging(model.runner, mode):
                        t[key] += samples_s(lambda: model.infer(plain), per, warmup=3)
            t["infer_pinned"] += samples_s(lambda: model.infer(pinned), per, warmup=3)
        med = {k: statistics.median(v) * 1e3 if v else None for k, v in t.items()}
        engine, copies, infer, infer_pinned = (med["engine"], med["copies"], med["infer"],
                                               med["infer_pinned"])
        out[f"b{n}"] = {"engine_ms": engine, "with_copies_ms": copies, "infer_ms": infer,
                        "infer_staged_ms": med["infer_staged"],
                        "infer_pageable_ms": med["infer_pageable"], "infer_pinned_ms": infer_pinned}
        line = f"  b{n:<3} infer {infer:.3f} ms, infer_pinned {infer_pinned:.3f} ms"
        if med["infer_staged"]:
            line += (f", infer (pinned staging) {med['infer_staged']:.3f} ms, infer (pageable) "
                     f"{med['infer_pageable']:.3f} ms")
        if copies:
            line += (f", engine {engine:.3f} ms, with_copies {copies:.3f} ms: infer/with_copies "
                     f"{infer / copies:.3f}, infer_pinned/with_copies {infer_pinned / copies:.3f}")
            if med["infer_staged"]:
                line += (f", staged/with_copies {med['infer_staged'] / copies:.3f}, "
                         f"pageable/with_copies {med['infer_pageable'] / copies:.3f}")
        print(line, flush=True)
    raw = raw_rate(model, batch, seconds)
    served, sizes = batcher_rate(model, clients, seconds, delay_ms)
    served_async = async_rate(model, clients, seconds, delay_ms)
    engine_rate = batch / out[f"b{batch}"]["engine_ms"] * 1e3 if out[f"b{batch}"]["engine_ms"] else None
    out.update(raw_img_s=raw, batcher_img_s=served, async_img_s=served_async,
               engine_img_s=engine_rate, batch_sizes=sizes)
    line = (f"  raw b{batch} {raw:,.0f} img/s, batcher ({clients} clients) {served:,.0f} img/s: "
            f"batcher/raw {served / raw:.3f}")
    if engine_rate:
        line += f", engine {engine_rate:,.0f} img/s: batcher/engine {served / engine_rate:.3f}"
    line += f"; async ({clients} tasks) {served_async:,.0f} img/s: async/raw {served_async / raw:.3f}"
    if engine_rate:
        line += f", async/engine {served_async / engine_rate:.3f}"
    print(line, flush=True)
    top = sorted(sizes.items(), key=lambda kv: -kv[1])[:4]
    print(f"  batch sizes (size: count, most common): {top}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", action="append", required=True)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--delay-ms", type=float, default=2.0)
    ap.add_argument("--iterations", type=int, default=100,
                    help="calls per variant at the full batch (batch 1: times batch / 1)")
    args = ap.parse_args()
    import runtime_py

    models = [runtime_py.load(b, backend=args.backend) for b in args.bundle]
    results = []
    for model in models:
        print(f"{model.bundle.path.name} ({model.backend}, input {model.inputs[0].dtype})", flush=True)
        results.append(measure(model, args.batch, args.clients, args.seconds, args.delay_ms,
                               args.iterations))
    if len(results) >= 2:
        a, b = results[1], results[0]
        print(f"{a['bundle']} / {b['bundle']}:", flush=True)
        if a["engine_img_s"] and b["engine_img_s"]:
            print(f"  engine img/s ratio {a['engine_img_s'] / b['engine_img_s']:.3f}", flush=True)
        print(f"  batcher img/s ratio {a['batcher_img_s'] / b['batcher_img_s']:.3f}", flush=True)
        print(f"  async img/s ratio {a['async_img_s'] / b['async_img_s']:.3f}", flush=True)
    for r in results:
        print(json.dumps(r), flush=True)
    for m in models:
        m.close()


if __name__ == "__main__":
    main()
