"""$TRT_BUNDLE_ORT_THREADS: the intra-op threads of every ONNX Runtime session trt-bundle
opens where the caller gives none (ONNX Runtime reads no variable of its own)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from runtime_py.engines.onnxruntime import THREADS_ENV, cpu_session, session_options
from runtime_py.errors import UsageError


def _relu_graph() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]).SerializeToString()


@pytest.mark.parametrize("value, want", [("3", 3), ("1", 1), ("0", 0), ("", 0), (" 2 ", 2)])
def test_the_variable_sets_the_threads_of_sessions_that_give_none(monkeypatch, value, want):
    monkeypatch.setenv(THREADS_ENV, value)
    assert session_options(ort).intra_op_num_threads == want      # 0: ORT's default
    assert session_options(ort, intra_op_threads=5).intra_op_num_threads == 5  # caller wins


def test_unset_leaves_onnxruntimes_default(monkeypatch):
    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert session_options(ort, "fp32").intra_op_num_threads == 0


@pytest.mark.parametrize("value", ["two", "-1", "1.5"])
def test_a_bad_value_is_a_usage_error_that_names_the_variable(monkeypatch, value):
    monkeypatch.setenv(THREADS_ENV, value)
    with pytest.raises(UsageError, match=rf"\${THREADS_ENV} is '{value}': give a whole number"):
        cpu_session(_relu_graph())


def test_the_runners_and_the_bundlers_sessions_run_with_it(monkeypatch):
    """The optimization level still follows the precision; the session computes."""
    monkeypatch.setenv(THREADS_ENV, "1")
    opts = session_options(ort, "fp8")
    assert opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert opts.intra_op_num_threads == 1
    x = np.array([[-1.0, 2.0, -3.0, 4.0]], dtype=np.float32)
    np.testing.assert_array_equal(cpu_session(_relu_graph()).run(None, {"x": x})[0],
                                  np.maximum(x, 0))
