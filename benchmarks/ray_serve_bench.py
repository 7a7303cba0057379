"""Ray Serve throughput of 1 vs 2 replicas, side by side in one run on this host.

    python benchmarks/ray_serve_bench.py                     # a synthetic conv bundle
    python benchmarks/ray_serve_bench.py --bundle X.bundle   # any ONNX Runtime bundle

A local Ray cluster serves `runtime_py.ray_serve.bundle_app`; client threads in this
process post one image per request (KServe v2 binary tensor extension, binary outputs) on
keep-alive loopback connections for --seconds, first to 1 replica, then (same app,
redeployed) to 2. Each replica runs ONNX Runtime with --threads intra-op threads. Figures:
images per second through the HTTP proxy, Ray Serve's batching and the replicas, and their
ratio. Measured boundary: request sent -> response read, everything (proxy, batching,
engine) included; the clients share this host's CPUs with Ray.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def synthetic_bundle(folder: Path, size: int = 64, width: int = 64) -> Path:
    """conv3x3(3->width) relu conv3x3(width->width) relu GAP -> [batch, width] logits: enough
    work per image (~2*9*size^2*width^2 FLOPs) that the engine, not HTTP, is the bulk."""
    from onnx import TensorProto, helper, numpy_helper

    from bundler.writer import write_bundle

    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((width, 3, 3, 3)).astype(np.float32) * 0.2
    w2 = rng.standard_normal((width, width, 3, 3)).astype(np.float32) * 0.05
    nodes = [helper.make_node("Conv", ["input", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
             helper.make_node("Flatten", ["g"], ["logits"])]
    graph = helper.make_graph(
        nodes, "bench", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                       ["batch", 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", width])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    body = {"name": "raybench-fp32-1-onnxruntime", "family": {"name": "raybench", "version": "1"},
            "precision": "fp32", "variant": None, "recipe": None,
            "source": {"kind": "random-weights", "seed": 0},
            "inputs": [{"name": "input", "dtype": "float32", "shape": ["batch", 3, size, size]}],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", width]}],
            "batch": {"min": 1, "opt": 8, "max": 32},
            "engine": {"backend": "onnxruntime", "member": "model.onnx", "details": {"opset": 19}},
            "build": {"tool": "trt-bundle", "tool_version": "0.1.0", "packages": {},
                      "source_date_epoch": None, "opset": 19},
            "quality": None, "calibration": None, "rebuilt_from": None}
    path, _ = write_bundle(folder / f"{body['name']}.bundle", body,
                           {"model.onnx": model.SerializeToString()})
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(port: int, model_name: str, image: np.ndarray, clients: int, seconds: float,
            warmup: float) -> tuple[float, dict[str, int]]:
    import http.client

    header = json.dumps({"inputs": [{"name": "input", "datatype": "FP32",
                                     "shape": [1, *image.shape],
                                     "parameters": {"binary_data_size": image.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    body = header + image.astype("<f4").tobytes()
    headers = {"Inference-Header-Content-Length": str(len(header)),
               "Content-Type": "application/octet-stream"}
    path = f"/v2/models/{model_name}/infer"
    counts: list[int] = [0] * clients
    replicas: dict[str, int] = {}
    lock = threading.Lock()
    start = time.perf_counter() + warmup
    end = start + seconds

    def run(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while True:
            conn.request("POST", path, body=body, headers=headers)
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                raise SystemExit(f"HTTP {r.status}")
            now = time.perf_counter()
            if now >= end:
                break
            if now >= start:
                counts[i] += 1
                with lock:
                    rid = r.getheader("trt-bundle-replica", "?")
                    replicas[rid] = replicas.get(rid, 0) + 1
        conn.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / seconds, replicas


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", default=None, help="An ONNX Runtime bundle (default: synthetic).")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads per replica.")
    ap.add_argument("--wait-ms", type=float, default=2.0, help="@serve.batch wait timeout.")
    args = ap.parse_args(argv)

    import ray
    from ray import serve

    import runtime_py
    from runtime_py.ray_serve import bundle_app

    tmp = tempfile.TemporaryDirectory(prefix="ray-bench-")
    bundle = Path(args.bundle) if args.bundle else synthetic_bundle(Path(tmp.name))
    with runtime_py.open_bundle(bundle) as b:
        from runtime_py.model import served_name

        name = served_name(b.manifest)
        shape = [int(d) for d in b.manifest["inputs"][0]["shape"][1:]]
    image = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    port = _free_port()
    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    results = {}
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for replicas in (1, 2):
            serve.run(bundle_app(str(bundle), num_replicas=replicas, num_cpus=0.5,
                                 intra_op_threads=args.threads,
                                 batch_wait_timeout_s=args.wait_ms / 1000),
                      name="bench", route_prefix="/")
            while serve.status().applications["bench"].deployments["bundle"].replica_states.get(
                    "RUNNING", 0) != replicas:
                time.sleep(0.2)
            ips, spread = measure(port, name, image, args.clients, args.seconds, args.warmup)
            results[replicas] = {"images_per_s": ips, "per_replica": spread}
            print(f"{replicas} replica(s): {ips:8.1f} img/s  requests per replica "
                  f"{sorted(spread.values())}", flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
        tmp.cleanup()
    ratio = results[2]["images_per_s"] / results[1]["images_per_s"]
    print(f"2 replicas / 1 replica: {ratio:.2f}x  ({os.cpu_count()} CPUs, {args.clients} "
          f"clients, {args.threads} ORT thread(s) per replica, bundle {bundle.name})")
    return {"results": results, "ratio": ratio}


if __name__ == "__main__":
    main()
