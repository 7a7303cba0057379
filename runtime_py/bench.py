"""Latency/throughput of a loaded bundle, each figure with its measurement boundary.

Boundaries (what the clock includes):
  engine      the runner's infer call on an input already in host memory, in the engine's
              layout; for GPU runners that call includes host<->device copies unless the
              runner measures device-resident inputs itself (`engine_device_only`)
  copies      engine plus host<->device copies (GPU engines); on CPU engines there is no
              device, so this equals `engine` and is reported as not applicable
  end_to_end  decode + preprocess of encoded JPEG bytes + infer
  served      N concurrent single-image clients through the dynamic batcher
Timings: a few warm-up calls, then repeated calls until both a minimum count and a
minimum time are reached; median and p90 of per-call wall time (perf_counter).
"""

from __future__ import annotations

import io
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np


@dataclass
class Figure:
    boundary: str
    batch_size: int
    calls: int
    median_ms: float
    p90_ms: float
    items_per_s: float
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def time_calls(fn: Callable[[], object], *, warmup: int = 3, min_calls: int = 10,
               min_seconds: float = 1.0, max_seconds: float = 30.0) -> list[float]:
    """Per-call wall times in seconds (after warm-up)."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - start
        if (len(times) >= min_calls and elapsed >= min_seconds) or elapsed >= max_seconds:
            return times


def figure(boundary: str, batch: int, times: list[float], note: str = "") -> Figure:
    med = statistics.median(times)
    p90 = sorted(times)[min(len(times) - 1, int(0.9 * len(times)))]
    return Figure(boundary, batch, len(times), med * 1e3, p90 * 1e3, batch / med, note)


def random_batch(model, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    return random_feeds(model.inputs, batch, seed)


def random_feeds(specs, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs uniform in [-1, 1] of ``batch`` rows for ``specs`` (TensorSpecs); uint8
    inputs (pixels) uniform in 0..255."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        shape = [batch] + [int(d) for d in spec.shape[1:]]
        if np.dtype(spec.dtype) == np.uint8:
            feeds[spec.name] = rng.integers(0, 256, shape, dtype=np.uint8)
        else:
            feeds[spec.name] = rng.uniform(-1, 1, shape).astype(spec.dtype)
    return feeds


def synthetic_jpegs(count: int = 8, size: tuple[int, int] = (500, 375), seed: int = 0
                    ) -> list[bytes]:
    """Photo-sized JPEGs (smooth gradients + noise) for end-to-end timing without data."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    out = []
    for i in range(count):
        base = np.stack([(xx * (i + 1)) % 256, (yy * 2 + i * 30) % 256, (xx + yy) % 256], -1)
        img = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


Progress = Callable[[str], None]


def _silent(message: str) -> None:
    pass


def bench_engine(model, batch_sizes: list[int], progress: Progress = _silent,
                 **timing) -> list[Figure]:
    figures = []
    for b in batch_sizes:
        progress(f"engine, batch {b}: measuring")
        feeds = random_batch(model, b)
        times = time_calls(lambda: model.runner.infer(feeds), **timing)
        note = "host arrays in, host arrays out"
        figures.append(figure("engine", b, times, note))
        progress(f"engine, batch {b}: median {figures[-1].median_ms:.2f} ms")
    return figures


def bench_end_to_end(model, batch_sizes: list[int], images: list[bytes] | None = None,
                     progress: Progress = _silent, **timing) -> list[Figure]:
    images = images or synthetic_jpegs()
    figures = []
    for b in batch_sizes:
        progress(f"end_to_end, batch {b}: measuring")
        batch = [images[i % len(images)] for i in range(b)]
        times = time_calls(lambda: model.infer(model.preprocess(batch)), **timing)
        figures.append(figure("end_to_end", b, times, "JPEG decode + preprocess + infer"))
        progress(f"end_to_end, batch {b}: median {figures[-1].median_ms:.2f} ms")
    return figures


def bench_served(model, concurrency: int, requests_per_client: int = 20,
                 max_batch: int | None = None, max_delay_ms: float = 2.0) -> Figure:
    """Throughput of `concurrency` threads each sending single images through a Batcher."""
    from runtime_py.batcher import Batcher

    one = random_batch(model, 1)
    latencies: list[float] = []
    lock = threading.Lock()
    with Batcher(model, max_batch_size=max_batch or model.max_batch_size,
                 max_delay_ms=max_delay_ms, max_queue=max(1024, concurrency * 4)) as batcher:
        for _ in range(2):  # warm up the engine at the batch sizes it will see
            batcher.submit(one).result()

        def client() -> None:
            mine = []
            for _ in range(requests_per_client):
                t0 = time.perf_counter()
                batcher.submit(one).result()
                mine.append(time.perf_counter() - t0)
            with lock:
                latencies.extend(mine)

        threads = [threading.Thread(target=client) for _ in range(concurrency)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
    total = concurrency * requests_per_client
    med = statistics.median(latencies)
    p90 = sorted(latencies)[int(0.9 * (len(latencies) - 1))]
    return Figure("served", 1, total, med * 1e3, p90 * 1e3, total / wall,
                  f"{concurrency} concurrent single-image clients via the batcher "
                  f"(max batch {max_batch or model.max_batch_size}, {max_delay_ms} ms delay)")


def run_bench(model, batch_sizes: list[int], concurrency: int | None = None,
              end_to_end: bool = True, progress: Progress | None = None, **timing) -> dict:
    """All boundaries for one model, as data. `progress` gets a line before and after
    each figure (minutes on a CPU at large batches): the CLI prints them on stderr."""
    progress = progress or _silent
    figures = bench_engine(model, batch_sizes, progress=progress, **timing)
    if model.runner.on_gpu:
        notes = ["copies: included in the engine figures (host arrays in/out)"]
    else:
        notes = ["copies: not applicable (CPU engine, no device)"]
    if end_to_end and model.bundle.has_member("preprocess.msgpack"):
        figures += bench_end_to_end(model, batch_sizes, progress=progress, **timing)
    if concurrency:
        progress(f"served, {concurrency} concurrent clients: measuring")
        figures.append(bench_served(model, concurrency))
    return {"bundle": model.bundle.manifest["name"], "id": model.id, "backend": model.backend,
            "figures": [f.as_dict() for f in figures], "notes": notes}


# --- device-side timings of GPU runners (optional runner protocol) -------------------------

#: What each key of `device_timings` measures; a runner returns per-iteration seconds.
DEVICE_TIMING_BOUNDARIES = {
    "graph_replay": "CUDA graph replay (or enqueue where no graph), inputs already on the "
                    "device, synchronize per iteration: host<->device copies excluded",
    "with_copies": "H2D copy of the batch + run + D2H copy of the outputs, synchronize per "
                   "iteration (pinned host buffers)",
}


def time_boundaries(steps: dict[str, Callable[[], object]], iterations: int, warmup: int
                    ) -> dict[str, list[float]]:
    """Exactly ``iterations`` per-call seconds of each step, after ``warmup`` untimed calls:
    what a runner's ``device_timings`` returns, one step per boundary."""
    return {key: time_calls(step, warmup=warmup, min_calls=iterations, min_seconds=0.0,
                            max_seconds=float("inf"))
            for key, step in steps.items()}


def device_timings(runner, batch_size: int, iterations: int = 200, warmup: int = 20
                   ) -> dict[str, list[float]] | None:
    """Per-iteration device timings from a GPU runner, or None when it does not offer them.

    Why a runner method: only the runner owns its device buffers, stream and CUDA graphs,
    so only it can time the engine without the host copies (and then with them). A runner
    that supports it defines

        runner.device_timings(batch_size, iterations, warmup) -> dict[str, list[float]]

    returning per-iteration wall seconds (after `warmup` untimed iterations) under the
    keys of `DEVICE_TIMING_BOUNDARIES` ("graph_replay", "with_copies"); either key may be
    left out when the runner cannot measure it. CPU runners do not define it: callers then
    time `runner.infer` on host arrays (boundary "engine").
    """
    method = getattr(runner, "device_timings", None)
    if method is None:
        return None
    raw = method(int(batch_size), int(iterations), int(warmup))
    unknown = sorted(set(raw) - set(DEVICE_TIMING_BOUNDARIES))
    if unknown:
        raise ValueError(f"{type(runner).__name__}.device_timings returned unknown boundaries "
                         f"{unknown}; expected {sorted(DEVICE_TIMING_BOUNDARIES)}")
    out = {}
    for key, times in raw.items():
        values = [float(t) for t in times]
        if not values or min(values) <= 0:
            raise ValueError(f"{type(runner).__name__}.device_timings[{key!r}] must be a "
                             "non-empty list of positive seconds")
        out[key] = values
    return out
