"""What a plain (not pinned) batch costs on its way to the GPU, piece by piece.

    python benchmarks/host_copy_bench.py [--mb 8.6,34.3] [--iterations 30]

Why: on the H200, `Model.infer` on a plain numpy batch (timm_xception uint8, batch 32,
8.6 MB) takes ~1 ms more than the same batch from pinned memory, whether it goes through
the CUDA driver's pageable copy or through `copy_rows` into pinned staging plus an async
H2D (h200-2026-12-01-s4/bench.log). A multi-threaded memcpy of 8.6 MB should take a few
hundred microseconds; this says which piece is slow. Per size, medians in ms and GB/s:

  memcpy pageable   np.copyto into an ordinary (touched) numpy array, one thread
  memcpy pinned     np.copyto into pinned memory, one thread
  copy_rows pinned  runtime_py.hostcopy.copy_rows into pinned memory, threads 2/4/8
  H2D pinned        tensor.copy_ from pinned memory, synchronized
  H2D pageable      tensor.copy_ from the numpy array (the driver's staged copy)
  staged total      copy_rows (default threads) + async H2D from pinned, synchronized
  pipelined total   copy_rows with each chunk's async H2D enqueued once it is copied
                    (what the torch-aoti runner's staging = "pinned" does), synchronized

Needs torch with CUDA; without a GPU it prints the host rows only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from data_path_bench import samples_s  # noqa: E402
from runtime_py.hostcopy import copy_rows, copy_threads  # noqa: E402


def median_ms(fn, iterations: int, warmup: int = 3) -> float:
    return statistics.median(samples_s(fn, iterations, warmup)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", default="0.27,8.6,34.3", help="sizes in MB (uint8 b1, b32; float32 b32)")
    ap.add_argument("--iterations", type=int, default=30)
    args = ap.parse_args()
    import torch

    cuda = torch.cuda.is_available()
    print(f"torch {torch.__version__}, cuda {cuda}, cores {os.cpu_count()}, "
          f"copy_rows default threads {copy_threads()}")
    for mb in (float(x) for x in args.mb.split(",")):
        rows = 32 if mb > 1 else 1
        n = int(mb * 1e6) // rows * rows
        src = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8).reshape(rows, -1)
        plain = np.empty_like(src)
        plain[...] = 0
        rows_out: list[tuple[str, float]] = []
        rows_out.append(("memcpy pageable", median_ms(lambda: np.copyto(plain, src), args.iterations)))
        if cuda:
            pinned_t = torch.empty(src.shape, dtype=torch.uint8, pin_memory=True)
            pinned = pinned_t.numpy()
            pinned[...] = 0
            dev = torch.empty(src.shape, dtype=torch.uint8, device="cuda")
            stream = torch.cuda.current_stream()
            rows_out.append(("memcpy pinned", median_ms(lambda: np.copyto(pinned, src), args.iterations)))
            for threads in (2, 4, 8):
                rows_out.append((f"copy_rows pinned x{threads}",
                                 median_ms(lambda t=threads: copy_rows(pinned, src, t), args.iterations)))

            def h2d_pinned() -> None:
                dev.copy_(pinned_t, non_blocking=True)
                stream.synchronize()

            def h2d_pageable() -> None:
                dev.copy_(torch.from_numpy(src))
                stream.synchronize()

            def staged() -> None:
                copy_rows(pinned, src)
                dev.copy_(pinned_t, non_blocking=True)
                stream.synchronize()

            def pipelined() -> None:
                def send(first: int, count: int) -> None:
                    dev[first:first + count].copy_(pinned_t[first:first + count],
                                                   non_blocking=True)
                copy_rows(pinned, src, on_chunk=send)
                stream.synchronize()

            rows_out += [("H2D pinned", median_ms(h2d_pinned, args.iterations)),
                         ("H2D pageable", median_ms(h2d_pageable, args.iterations)),
                         ("staged total", median_ms(staged, args.iterations)),
                         ("pipelined total", median_ms(pipelined, args.iterations))]
        print(f"{src.nbytes / 1e6:.2f} MB ({rows} rows)")
        for name, ms in rows_out:
            print(f"  {name:<22} {ms:8.3f} ms  {src.nbytes / ms / 1e6:7.2f} GB/s")


if __name__ == "__main__":
    main()
