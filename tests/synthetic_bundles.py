"""Tiny synthetic bundles for the engine/rebuild/numerics tests (data, not fakes).

`tiny_onnx()` is a real ONNX graph (Conv 3->4, GlobalAveragePool, Flatten) with input
"input" [batch, 3, 8, 8] and output "logits" [batch, 4]; `write_source_bundle()` writes a
real bundle around it with the writer, its reference outputs computed by ONNX Runtime CPU.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np

INPUT_SHAPE = (3, 8, 8)
CLASSES = 4


def tiny_onnx(precision: str = "fp32", opset: int = 19, seed: int = 0) -> bytes:
    """fp32; fp16 (IO fp32, Cast to fp16 inside); fp8 (fp32 with FP8 E4M3 Q/DQ on the conv)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((CLASSES, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(CLASSES).astype(np.float32)
    nodes, inits = [], []
    x = "input"
    if precision == "fp16":
        w, b = w.astype(np.float16), b.astype(np.float16)
        nodes.append(helper.make_node("Cast", ["input"], ["x16"], to=TensorProto.FLOAT16))
        x = "x16"
    inits += [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")]
    wname = "W"
    if precision == "fp8":
        zp = helper.make_tensor("zp8", TensorProto.FLOAT8E4M3FN, [], [0.0])
        inits += [numpy_helper.from_array(np.array(0.05, np.float32), "xs"),
                  numpy_helper.from_array(np.array(0.02, np.float32), "ws"), zp]
        nodes += [helper.make_node("QuantizeLinear", ["input", "xs", "zp8"], ["xq"]),
                  helper.make_node("DequantizeLinear", ["xq", "xs"], ["xdq"]),
                  helper.make_node("QuantizeLinear", ["W", "ws", "zp8"], ["wq"]),
                  helper.make_node("DequantizeLinear", ["wq", "ws"], ["wdq"])]
        x, wname = "xdq", "wdq"
    nodes += [helper.make_node("Conv", [x, wname, "B"], ["c"], pads=[1, 1, 1, 1]),
              helper.make_node("GlobalAveragePool", ["c"], ["g"]),
              helper.make_node("Flatten", ["g"], ["f"])]
    if precision == "fp16":
        nodes.append(helper.make_node("Cast", ["f"], ["logits"], to=TensorProto.FLOAT))
    else:
        nodes[-1].output[0] = "logits"
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", *INPUT_SHAPE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model.SerializeToString()


def ort_outputs(onnx_bytes: bytes, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    return sess.run(["logits"], {"input": x})[0]


def reference_member(onnx_bytes: bytes, n: int = 6, seed: int = 1) -> bytes:
    from safetensors.numpy import save

    x = np.random.default_rng(seed).standard_normal((n, *INPUT_SHAPE)).astype(np.float32)
    out = ort_outputs(onnx_bytes, x)
    return save({"input.input": x, "fp32.logits": out, "bundle.logits": out})


FP8_CALIBRATION = {"method": "max", "images": 1, "data_digest": "sha256:" + "0" * 64,
                   "data_source": "synthetic", "member": "calibration.safetensors"}


def calibration_member() -> bytes:
    """A small safetensors file standing for an fp8 bundle's calibration.safetensors (an fp8
    bundle without one is refused by both readers, docs/format.md)."""
    from safetensors.numpy import save

    return save({"act.input.amax": np.array(1.0, np.float32)})


def manifest_body(*, precision: str = "fp32", engine: dict | None = None,
                  name: str | None = None, batch=(1, 2, 4)) -> dict:
    engine = engine or {"backend": "onnxruntime", "member": "model.onnx",
                        "details": {"opset": 19}}
    return {
        "name": name or f"tiny-{precision}-1-{engine['backend']}",
        "family": {"name": "tiny", "version": "1"},
        "precision": precision,
        "variant": None,
        "recipe": None,
        "source": {"kind": "random-weights", "seed": 0},
        "inputs": [{"name": "input", "dtype": "float32", "shape": ["batch", *INPUT_SHAPE]}],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", CLASSES]}],
        "batch": {"min": batch[0], "opt": batch[1], "max": batch[2]},
        "engine": engine,
        "build": {"tool": "trt-bundle", "tool_version": "0.1.0", "packages": {},
                  "source_date_epoch": None, "opset": 19},
        "quality": None,
        "calibration": FP8_CALIBRATION if precision == "fp8" else None,
        "rebuilt_from": None,
    }


def tensorrt_engine() -> dict:
    """A schema-valid `engine` entry of a TensorRT bundle (its plan member is opaque bytes:
    a host without TensorRT refuses it at activation)."""
    details = {"tensorrt_version": "11.4.0", "compute_capability": "9.0", "device_name": "H200",
               "optimization_level": 3, "profile": {"min": 1, "opt": 2, "max": 4},
               "hardware_compatibility": "none", "version_compatible": False,
               "strongly_typed": True, "layer_count": 3}
    return {"backend": "tensorrt", "member": "engine.plan", "details": details}


def write_source_bundle(folder: Path, *, precision: str = "fp32", engine: dict | None = None,
                        engine_member: bytes | None = None, onnx_bytes: bytes | None = None,
                        reference: bytes | None = None, name: str | None = None) -> Path:
    from bundler.writer import write_bundle

    onnx_bytes = onnx_bytes or tiny_onnx(precision)
    body = manifest_body(precision=precision, engine=engine, name=name)
    members = {"model.onnx": onnx_bytes,
               "reference.safetensors": reference or reference_member(onnx_bytes),
               "labels.msgpack": b"\x94\xa1a\xa1b\xa1c\xa1d"}
    if engine_member is not None:
        members[body["engine"]["member"]] = engine_member
    if precision == "fp8":
        members["calibration.safetensors"] = calibration_member()
    path, _ = write_bundle(Path(folder) / f"{body['name']}.bundle", body, members)
    return path


@contextlib.contextmanager
def served_ports(folder: Path, **serve_kwargs):
    """``run.serve`` (the code of `bundle serve`) on a thread over ``write_source_bundle``'s
    bundle, with ephemeral HTTP and gRPC ports: yields (HTTP port, gRPC port, model); stops
    the server and closes the model on exit."""
    import threading
    import time

    import runtime_py
    from runtime_py.server.run import serve

    model = runtime_py.load(write_source_bundle(folder))
    addresses: dict = {}
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=([model],), daemon=True, kwargs=dict(
        port=0, grpc_port=0, on_ready=addresses.update, stop=stop, log_level="warning",
        **serve_kwargs))
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while "grpc" not in addresses:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        yield (int(addresses["http"].rsplit(":", 1)[1]), int(addresses["grpc"].rsplit(":", 1)[1]),
               model)
    finally:
        stop.set()
        thread.join(30)
        model.close()


@contextlib.contextmanager
def served_source_bundle(folder: Path, **serve_kwargs):
    """``served_ports`` yielding (gRPC port, model)."""
    with served_ports(folder, **serve_kwargs) as (_, grpc_port, model):
        yield grpc_port, model
