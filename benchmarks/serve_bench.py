"""Serving throughput, three ways in one run, with the measurement boundary of each.

    python benchmarks/serve_bench.py --synthetic            # numpy model, fixed cost per batch
    python benchmarks/serve_bench.py --bundle X.bundle      # a real bundle (runtime_py.load)

Figures (images per second, preprocessed tensors in, logits out; no image decoding):
  raw     model.infer on a ready batch of --batch images, back to back, one thread
          (engine call + whatever the model does around it; no batcher, no copies).
  batcher --clients threads, each submitting one image and waiting for its result
          (adds: validation, queueing, the np.concatenate into the batch, the split, the
          thread wake-ups). Target: >= 0.90 x raw.
  http    --http-clients clients in separate processes, each on a keep-alive loopback
          connection sending one image per request with the binary tensor extension and
          asking for binary outputs (adds: HTTP parsing in uvicorn/h11, the app, the
          event loop hop), over the batcher alone with the same number of clients.
          Target: >= 0.85. The client processes share this host's CPUs with the server.

A script, not a test: numbers depend on the host. The synthetic model sleeps --cost-ms
per batch (a GPU-like engine whose time barely grows with the batch and releases the GIL).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from runtime_py.batcher import Batcher  # noqa: E402


def make_model(args):
    if args.synthetic:
        from runtime_py.testing import ToyModel
        return ToyModel("synthetic", size=args.image_size, max_batch_size=args.batch,
                        cost_ms=args.cost_ms, per_row_ms=args.per_row_ms)
    import runtime_py
    return runtime_py.load(args.bundle, backend=args.backend)


def one_image(model, n: int = 1) -> dict[str, np.ndarray]:
    feeds = {}
    for spec in model.inputs:
        dims = spec.shape[1:]
        if any(not isinstance(d, int) or d < 0 for d in dims):
            raise SystemExit(f"input {spec.name} has dynamic dims {spec.shape}: not benchmarkable")
        rng = np.random.default_rng(0)
        feeds[spec.name] = rng.random((n, *dims)).astype(spec.dtype)
    return feeds


def bench_raw(model, batch: int, seconds: float) -> float:
    feeds = one_image(model, batch)
    model.infer(feeds)                                   # warm-up
    done, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        model.infer(feeds)
        done += batch
    return done / elapsed


def bench_batcher(batcher: Batcher, feeds, clients: int, seconds: float, warmup: float) -> float:
    """``clients`` threads, one image per request; images completed per second."""
    start = threading.Barrier(clients + 1)
    t_begin = t_end = 0.0
    counts = [0] * clients

    def client(i: int) -> None:
        start.wait()
        n = 0
        while True:
            batcher.submit(feeds).result()
            now = time.perf_counter()
            if now >= t_end:
                break
            if now >= t_begin:
                n += 1
        counts[i] = n

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    t_begin = time.perf_counter() + warmup
    t_end = t_begin + seconds
    start.wait()
    for t in threads:
        t.join()
    return sum(counts) / seconds


def _http_client_proc(port: int, path: str, body: bytes, headers: dict, threads: int,
                      t_begin: float, t_end: float, out) -> None:
    """One client process: ``threads`` keep-alive connections; completions in the window."""
    counts = [0] * threads

    def run(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port)
        n = 0
        while True:
            conn.request("POST", path, body=body, headers=headers)
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                raise SystemExit(f"HTTP {r.status}")
            now = time.time()
            if now >= t_end:
                break
            if now >= t_begin:
                n += 1
        conn.close()
        counts[i] = n

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.put(sum(counts))


def bench_http(model, batcher: Batcher, feeds, clients: int, procs: int, seconds: float,
               warmup: float) -> float:
    from runtime_py.server import ServerThread, create_app

    app = create_app({model.name: model}, {model.name: batcher}, max_body_bytes=1 << 30)
    header = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": _kserve(v.dtype),
                          "parameters": {"binary_data_size": v.nbytes}} for k, v in feeds.items()],
              "parameters": {"binary_data_output": True}}
    h = json.dumps(header).encode()
    body = h + b"".join(v.astype(v.dtype.newbyteorder("<")).tobytes() for v in feeds.values())
    headers = {"Inference-Header-Content-Length": str(len(h)),
               "Content-Type": "application/octet-stream"}
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = max(1, min(procs, clients))
    per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    with ServerThread(app, host="127.0.0.1", port=0) as srv:
        t_begin = time.time() + warmup + 2.0             # + process start-up
        t_end = t_begin + seconds
        ps = [ctx.Process(target=_http_client_proc, args=(srv.port, f"/v2/models/{model.name}/infer",
                                                  body, headers, n, t_begin, t_end, out))
              for n in per]
        for p in ps:
            p.start()
        total = sum(out.get(timeout=seconds + warmup + 60) for _ in ps)
        for p in ps:
            p.join()
    return total / seconds


def _kserve(dtype) -> str:
    from runtime_py.server.protocol import kserve_datatype
    return kserve_datatype(dtype)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--bundle", help="path of a .bundle (loaded with runtime_py.load)")
    src.add_argument("--synthetic", action="store_true", help="numpy model with a fixed per-batch cost")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--batch", type=int, default=32, help="raw batch size and the batcher's max batch")
    ap.add_argument("--clients", type=int, default=32, help="batcher clients (single images)")
    ap.add_argument("--http-clients", type=int, default=16)
    ap.add_argument("--http-procs", type=int, default=4, help="client processes for the HTTP run")
    ap.add_argument("--max-delay-ms", type=float, default=2.0)
    ap.add_argument("--seconds", type=float, default=5.0, help="measured time per figure")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--cost-ms", type=float, default=20.0, help="synthetic: sleep per batch")
    ap.add_argument("--per-row-ms", type=float, default=0.0, help="synthetic: extra sleep per image")
    ap.add_argument("--image-size", type=int, default=299, help="synthetic: input is 3 x N x N fp32")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args(argv)

    model = make_model(args)
    feeds = one_image(model, 1)
    raw = bench_raw(model, args.batch, args.seconds)
    with Batcher(model, max_batch_size=args.batch, max_delay_ms=args.max_delay_ms) as b:
        batched = bench_batcher(b, feeds, args.clients, args.seconds, args.warmup)
        batched_h = bench_batcher(b, feeds, args.http_clients, args.seconds, args.warmup)
        served = bench_http(model, b, feeds, args.http_clients, args.http_procs, args.seconds,
                            args.warmup)
        sizes = dict(sorted(b.batch_size_counts.items()))
    result = {
        "model": model.name,
        "input": {k: [*v.shape[1:]] for k, v in feeds.items()},
        "synthetic_cost_ms": args.cost_ms if args.synthetic else None,
        "raw_batch": args.batch,
        "raw_img_s": round(raw, 1),
        "batcher_clients": args.clients,
        "batcher_img_s": round(batched, 1),
        "batcher_over_raw": round(batched / raw, 3),
        "http_clients": args.http_clients,
        "batcher_same_clients_img_s": round(batched_h, 1),
        "http_img_s": round(served, 1),
        "http_over_batcher": round(served / batched_h, 3),
        "batch_size_counts": sizes,
        "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"model {result['model']}  input {result['input']}  cpus {result['cpus']}"
              + (f"  synthetic cost {args.cost_ms} ms/batch" if args.synthetic else ""))
        print(f"raw model.infer, batch {args.batch:<3}                 {raw:10.1f} img/s")
        print(f"batcher, {args.clients} clients x 1 image            {batched:10.1f} img/s"
              f"   {batched / raw:.3f} x raw      (target >= 0.90)")
        print(f"batcher, {args.http_clients} clients x 1 image            {batched_h:10.1f} img/s")
        print(f"HTTP binary tensors, {args.http_clients} clients, loopback {served:10.1f} img/s"
              f"   {served / batched_h:.3f} x batcher  (target >= 0.85)")
        print(f"batch sizes seen by the batcher: {sizes}")
    return result


if __name__ == "__main__":
    main()
