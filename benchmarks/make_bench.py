"""FP8 calibration cost and `bundle make` peak memory, measured in one run.

1. Calibration over plain inference: the fp32 graph of timm_xception (seeded random
   weights), N preprocessed images held in memory, batch 8. `calibrate` (one ONNX Runtime
   pass that also returns the quantized tensors, histogram + max per tensor) against
   `InferenceSession.run` of the same graph over the same batches. Passes are interleaved
   (infer, calibrate, infer, calibrate, ...) and the medians compared. Target: <= 1.5.
2. Peak resident memory of `bundle make timm_xception --precision fp8 --random-weights`
   run as a child process with an empty export cache (so the torch export is included:
   the worst case), ru_maxrss of the child. Target: < 6 GiB.

    python benchmarks/make_bench.py [--images 64] [--rounds 3] [--skip-make]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def calibration_ratio(images: int, rounds: int, batch: int) -> None:
    import onnxruntime as ort

    from bundler.calibration.collect import calibrate
    from bundler.calibration.data import synthetic_calibration_set
    from bundler.export import export_fp32_onnx, serialize
    from bundler.families import load_family
    from bundler.graphs import fp8
    from bundler.torch_model import build_torch_model

    family = load_family("timm_xception")
    fp32 = export_fp32_onnx(build_torch_model(family, seed=0), family)
    selected = fp8.select_fp8_layers(fp32, family)
    tensors = fp8.quantized_activation_tensors(fp32, selected)
    data = synthetic_calibration_set(family.input.shape, images, seed=0)
    batches = [b for b, _l, _k in data.iter_batches(batch)]
    session = ort.InferenceSession(serialize(fp32), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name

    def infer_pass() -> None:
        for b in batches:
            session.run(None, {name: b})

    def calib_pass() -> None:
        calibrate(fp32, tensors, batches, method="max")

    infer_pass()  # warm-up (first run allocates)
    t_infer, t_calib = [], []
    for _ in range(rounds):
        t0 = time.perf_counter(); infer_pass(); t_infer.append(time.perf_counter() - t0)
        t0 = time.perf_counter(); calib_pass(); t_calib.append(time.perf_counter() - t0)
    a, b = statistics.median(t_calib), statistics.median(t_infer)
    print(f"calibration: {len(tensors)} quantized tensors, {images} images, batch {batch}, "
          f"{rounds} interleaved rounds (preprocessed images in memory; session creation "
          "included on the calibration side)")
    print(f"  plain fp32 inference pass  median {b:8.2f} s")
    print(f"  max calibration pass       median {a:8.2f} s")
    print(f"  ratio calibration/inference = {a / b:.3f}  (target <= 1.5)")


def make_peak_memory() -> None:
    import os

    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, TRT_BUNDLE_CACHE=str(Path(out) / "cache"))
        cmd = [sys.executable, "-m", "bundler.cli", "make", "timm_xception", "--precision", "fp8",
               "--random-weights", "--backend", "onnxruntime", "--out", out]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            print(proc.stderr[-2000:])
            raise SystemExit(f"bundle make failed ({proc.returncode})")
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(f"bundle make fp8 --random-weights: {wall:.0f} s wall, peak RSS "
          f"{peak_kib / 2**20:.2f} GiB  (target < 6 GiB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--skip-make", action="store_true")
    args = parser.parse_args()
    if not args.skip_make:
        make_peak_memory()  # first, so that ru_maxrss of children is this child's alone
    calibration_ratio(args.images, args.rounds, args.batch)


if __name__ == "__main__":
    main()
