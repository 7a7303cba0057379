"""runtime_py's `Model.infer` at batch 1 over a raw `onnxruntime.InferenceSession.run`.

Both run the same `model.onnx` (read from the bundle) with the same session options, in
one process, calls interleaved (runtime, raw, runtime, raw, ...) so that machine noise hits
both alike; the ratio of the medians is printed. Boundary: host arrays in, host arrays
out; what the runtime adds is input checking, dict plumbing and batch splitting.
Target: ratio <= 1.05.

    python benchmarks/runtime_bench.py [--bundle PATH] [--rounds 30]
Without --bundle, a random-weights fp32 timm_xception bundle is built in a temp folder.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def build_default_bundle(out: Path) -> Path:
    from bundler.make import MakeRequest, make_bundle

    return make_bundle(MakeRequest(family="timm_xception", precision="fp32", backend="onnxruntime",
                                   random_weights=True, out_dir=out, reference_count=2)).path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()

    import onnxruntime as ort

    import runtime_py

    with tempfile.TemporaryDirectory() as tmp:
        path = args.bundle or build_default_bundle(Path(tmp))
        model = runtime_py.load(path, backend="onnxruntime", intra_op_threads=args.threads)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if args.threads:
            opts.intra_op_num_threads = args.threads
        raw = ort.InferenceSession(model.bundle.read_member("model.onnx"), opts,
                                   providers=["CPUExecutionProvider"])
        spec = model.inputs[0]
        x = np.random.default_rng(0).uniform(-1, 1, [args.batch, *spec.shape[1:]]).astype(np.float32)
        feeds = {spec.name: x}
        for _ in range(3):
            model.infer(x)
            raw.run(None, feeds)
        t_runtime, t_raw = [], []
        for _ in range(args.rounds):
            t0 = time.perf_counter(); model.infer(x); t_runtime.append(time.perf_counter() - t0)
            t0 = time.perf_counter(); raw.run(None, feeds); t_raw.append(time.perf_counter() - t0)
        a, b = statistics.median(t_runtime), statistics.median(t_raw)
        print(f"bundle: {model.bundle.manifest['name']} ({model.id[:16]})")
        print(f"boundary: host arrays in/out, batch {args.batch}, {args.rounds} interleaved rounds")
        print(f"runtime_py Model.infer       median {a * 1e3:9.2f} ms")
        print(f"onnxruntime session.run      median {b * 1e3:9.2f} ms")
        print(f"ratio runtime/raw = {a / b:.3f}  (target <= 1.05)")
        model.close()


if __name__ == "__main__":
    main()
