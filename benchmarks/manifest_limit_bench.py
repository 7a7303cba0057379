"""Opening + verifying a bundle whose manifest is at the format's limits (issue 16).

docs/format.md, "Limits": 1 MiB of manifest, 65,536 values, depth 64. Three valid
manifests at those limits, each next to an ordinary (~1 KB) manifest of the same members:
    values   torch-aoti `compile_options` holding a list of ~65,400 integers (65,536 values)
    bytes    1,024 `build.packages` whose versions fill the manifest to ~1 MiB
    depth    `compile_options` nested to depth 64 plus the values above
Reported: the median of `--repeats` runs of open_bundle(path) + verify() + close() (the
file in the page cache), and the ratio to the ordinary bundle. Target: <= 0.5 s.

    python benchmarks/manifest_limit_bench.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bundler.writer import write_bundle
from runtime_py.format import open_bundle
from runtime_py.format.layout import MAX_MANIFEST_BYTES
from runtime_py.format.manifest import MAX_DEPTH, MAX_VALUES


def body(compile_options: dict, packages: dict) -> dict:
    return {
        "name": "bench-fp32-1-torch-aoti", "family": {"name": "bench", "version": "1"},
        "precision": "fp32", "variant": None, "recipe": None,
        "source": {"kind": "random-weights", "seed": 0},
        "inputs": [{"name": "input", "dtype": "float32", "shape": ["batch", 3, 299, 299]}],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 1000]}],
        "batch": {"min": 1, "opt": 8, "max": 32},
        "engine": {"backend": "torch-aoti", "member": "engine.pt2", "details": {
            "torch_version": "2.14.1", "cuda_version": "12.8", "compute_capability": "9.0",
            "device_name": "bench", "compile_options": compile_options}},
        "build": {"tool": "trt-bundle", "tool_version": "bench", "packages": packages,
                  "source_date_epoch": 0},
        "quality": None, "calibration": None, "rebuilt_from": None,
    }


def nested(depth: int, leaf: object) -> object:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def manifests() -> dict[str, dict]:
    base_values = 60   # the fields of body() with empty maps, generously
    n = MAX_VALUES - base_values - 100
    per = (MAX_MANIFEST_BYTES - 60_000) // 1024
    depth_left = MAX_DEPTH - 5   # top map, engine, details, compile_options; the inner list
    return {
        "ordinary": body({"mode": "max-autotune"}, {"torch": "2.14.1"}),
        "values": body({"list": list(range(n))}, {}),
        "bytes": body({}, {f"package-{i:04d}": "v" * per for i in range(1024)}),
        "depth": body({"deep": nested(depth_left, list(range(n)))}, {}),
    }


def time_open_verify(path: Path, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        with open_bundle(path) as b:
            b.verify()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    members = {"engine.pt2": bytes(200_000), "model.onnx": bytes(range(256)) * 400}
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for name, manifest_body in manifests().items():
            path, _ = write_bundle(Path(tmp) / f"{name}.bundle", manifest_body, members)
            with open_bundle(path) as b:
                size = len(b.manifest_bytes)
            time_open_verify(path, 1)   # warm-up: page cache, schema validators
            results[name] = (size, time_open_verify(path, args.repeats))
        ordinary = results["ordinary"][1]
        print(f"limits: {MAX_MANIFEST_BYTES} manifest bytes, {MAX_VALUES} values, depth {MAX_DEPTH}")
        for name, (size, seconds) in results.items():
            print(f"{name:9s} manifest {size:9d} bytes  open+verify {seconds * 1000:8.1f} ms  "
                  f"ratio to ordinary {seconds / ordinary:6.1f}x  "
                  f"{'<= 0.5 s: ok' if seconds <= 0.5 else '> 0.5 s: TOO SLOW'}")


if __name__ == "__main__":
    main()
