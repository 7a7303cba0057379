"""The bundler's numbers are the same on every CPU: portable graphs and levels
(bundler/graphs/portable.py, runtime_py.engines.onnxruntime.reproducible_level)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from bundler.graphs.portable import portable_bytes, portable_softmax
from runtime_py.engines.onnxruntime import import_onnxruntime, reproducible_level, session_options

HERE = Path(__file__).resolve().parent
#: qemu's CPU model for the other side: AVX2 and FMA, no AVX-512.
OTHER_CPU = "Haswell-v4"


def softmax_graph(axis: int, opset: int = 19) -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 7])
    nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=axis),
             helper.make_node("Relu", ["p"], ["y"])]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 5, 7]) for n in ("p", "y")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outputs),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model.SerializeToString()


def run(model_bytes: bytes, x: np.ndarray) -> list[np.ndarray]:
    ort = import_onnxruntime()
    return ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"]).run(None, {"x": x})


@pytest.mark.parametrize("axis,opset", [(-1, 19), (1, 19), (0, 17), (-1, 13)])
def test_the_portable_softmax_computes_softmax_and_keeps_the_output_names(axis, opset):
    import onnx

    original = softmax_graph(axis, opset)
    portable = portable_bytes(original)
    model = onnx.load_from_string(portable)
    onnx.checker.check_model(model)
    assert "Softmax" not in {n.op_type for n in model.graph.node}
    assert [o.name for o in model.graph.output] == ["p", "y"]
    x = (np.random.default_rng(0).standard_normal((2, 5, 7)) * 20).astype(np.float32)
    want, got = run(original, x), run(portable, x)
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(got[0].sum(axis=axis), 1.0, rtol=1e-5)


def test_graphs_without_softmax_are_left_alone():
    import onnx

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]))
    data = model.SerializeToString()
    assert portable_bytes(data) is data
    parsed = onnx.load_from_string(data)
    assert portable_softmax(parsed) is parsed


def test_the_build_levels_leave_out_the_cpu_specific_layout_and_fp8_rewrites():
    ort = import_onnxruntime()
    levels = ort.GraphOptimizationLevel
    assert reproducible_level(ort, "fp32") == levels.ORT_ENABLE_EXTENDED
    assert reproducible_level(ort, "fp16") == levels.ORT_ENABLE_EXTENDED
    assert reproducible_level(ort, "fp8") == levels.ORT_DISABLE_ALL
    assert session_options(ort, "fp16", reproducible=True).graph_optimization_level == \
        levels.ORT_ENABLE_EXTENDED
    assert session_options(ort, "fp16").graph_optimization_level == levels.ORT_ENABLE_ALL


def _has_avx512() -> bool:
    try:
        return " avx512f " in f" {Path('/proc/cpuinfo').read_text()} "
    except OSError:
        return False


def test_the_build_computes_the_same_bits_on_an_avx2_cpu():
    """tests/portable_ops.py natively (AVX-512) and under qemu as an AVX2 CPU: the fp32,
    fp16 and fp8 references and the calibration ranges of every op kind the families use
    come out the same, and the runner's own level does not (so the comparison can tell).
    Before the build used these levels and graphs, timm_xception's fp8 smoke bundle had
    another id on an AVX-512 machine than on the AVX2 ones."""
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        pytest.skip("qemu-user is not installed (apt-get install qemu-user): the other CPU "
                    "this test compares with is qemu's AVX2 model")
    if not _has_avx512():
        pytest.skip("this CPU has no AVX-512: under qemu's AVX2 model ONNX Runtime would "
                    "pick the same kernels, and the comparison would show nothing")
    script = str(HERE / "portable_ops.py")
    env = dict(os.environ, TRT_BUNDLE_ORT_THREADS="2")
    native = json.loads(subprocess.run([sys.executable, script], env=env, check=True,
                                       capture_output=True, text=True, timeout=300).stdout)
    python = os.path.realpath(sys.executable)
    emulated = json.loads(subprocess.run([qemu, "-cpu", OTHER_CPU, python, script], env=env,
                                         check=True, capture_output=True, text=True,
                                         timeout=600).stdout)
    build = [k for k in native if k.startswith(("build", "calibration"))]
    assert {k: native[k] for k in build} == {k: emulated[k] for k in build}
    assert native["runner fp32 convolutions"] != emulated["runner fp32 convolutions"]
    assert native["runner fp32 softmax"] != emulated["runner fp32 softmax"]
