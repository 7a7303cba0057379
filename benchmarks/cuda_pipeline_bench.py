"""Does the TensorRT runner's pipeline (runtime_py/engines/cuda_pipeline.py) overlap the
copies with the engine on a GPU? Side by side in one process:

  sequential  enqueue a batch, wait for its result, then the next (what ``infer`` does)
  pipelined   results read two batches behind (the batcher's pattern): the H2D copy of
              batch k+1 and the D2H of k-1 may run while the engine runs batch k

The "engine" stands in for a TensorRT plan (TensorRT is not installable here): a torch
workload of about --engine-ms on the pipeline's compute stream (torch.cuda.ExternalStream),
then the first 1000 values of each input row copied to the static output (logits-sized). Feeds: xception's float32
input, batch --batch (34 MB at 32), plain numpy arrays (one staging copy each) or pinned
buffers from ``allocate_host`` (read in place). Prints images/s and pipelined / sequential.

    PYTHONPATH=. python benchmarks/cuda_pipeline_bench.py [--batch 32] [--engine-ms 4.5]
        [--seconds 3]

Needs cuda-python (cuda.bindings), torch with CUDA and a GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--engine-ms", type=float, default=4.5)
    p.add_argument("--seconds", type=float, default=3.0)
    args = p.parse_args(argv)

    import torch

    from runtime_py.engines.cuda_pipeline import CudaPipeline, IOSpec
    from runtime_py.engines.tensorrt import _Cuda

    cuda = _Cuda()
    rt = cuda.rt
    cuda.check(rt.cudaSetDevice(0), "cudaSetDevice")
    stream = cuda.check(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking), "stream")
    torch_stream = torch.cuda.ExternalStream(int(stream))
    row, n = (3, 299, 299), args.batch
    x_static = torch.empty((n, *row), device="cuda")
    y_static = torch.empty((n, 1000), device="cuda")       # logits, as a classifier's
    pipe = CudaPipeline(cuda, stream, [
        IOSpec("x", True, np.float32, row, x_static.data_ptr(), n),
        IOSpec("y", False, np.float32, (1000,), y_static.data_ptr(), n)])
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)

    def gemm_ms(reps: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(torch_stream):
            start.record()
            for _ in range(reps):
                a @ a
            end.record()
        end.synchronize()
        return start.elapsed_time(end)

    gemm_ms(5)
    reps = max(1, round(args.engine_ms / (gemm_ms(20) / 20)))

    def engine(k: int):
        with torch.cuda.stream(torch_stream):
            for _ in range(reps):
                a @ a
            y_static[:k].copy_(x_static[:k].reshape(k, -1)[:, :1000])
        return {"y": (k, 1000)}

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; batch {n} float32 "
          f"{n * int(np.prod(row)) * 4 / 1e6:.1f} MB in, [{n}, 1000] out; engine stand-in "
          f"{gemm_ms(reps):.2f} ms ({reps} fp16 GEMMs 4096^3)", flush=True)
    rng = np.random.default_rng(0)
    plain = [rng.standard_normal((n, *row)).astype(np.float32) for _ in range(3)]
    pinned = []
    for src in plain:
        buf = pipe.allocate_host((n, *row), np.float32)
        buf[...] = src
        pinned.append(buf)

    def run(feeds: list[np.ndarray], behind: int) -> float:
        pending, done, i = [], 0, 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < args.seconds:
            pending.append(pipe.enqueue({"x": feeds[i % len(feeds)]}, n, engine))
            i += 1
            while len(pending) > behind:
                out = pending.pop(0).result()["y"]
                done += 1
        for p in pending:
            out = p.result()["y"]
            done += 1
        elapsed = time.perf_counter() - t0
        assert out.shape == (n, 1000)
        return done * n / elapsed

    for name, feeds in (("plain numpy", plain), ("pinned (allocate_host)", pinned)):
        run(feeds, 0)                       # warm-up
        seq, pipelined = [], []
        for _ in range(3):                  # interleaved rounds: clock drift hits both
            seq.append(run(feeds, 0))
            pipelined.append(run(feeds, 2))
        s, q = float(np.median(seq)), float(np.median(pipelined))
        print(f"{name:24s} sequential {s:8.0f} img/s   pipelined {q:8.0f} img/s   "
              f"pipelined / sequential {q / s:.3f}x", flush=True)
    # correctness under the pipelined pattern
    pend = [pipe.enqueue({"x": plain[k % 3]}, n, engine) for k in range(2)]
    for k, pnd in enumerate(pend):
        np.testing.assert_array_equal(pnd.result()["y"], plain[k % 3].reshape(n, -1)[:, :1000])
    pipe.close()
    print("outputs are their inputs' first 1000 values (the stand-in engine): ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
