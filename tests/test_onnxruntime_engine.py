"""ONNX Runtime as the bundler's reference engine: a graph it cannot load is a
compatibility problem with the upgrade that fixes it, not a traceback."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

from runtime_py.engines.onnxruntime import UPGRADE_HINT, cpu_session
from runtime_py.errors import CompatibilityError


def _unloadable_graph() -> bytes:
    # a Relu fed a string tensor: valid protobuf, no CPU kernel for the type
    x = helper.make_tensor_value_info("x", TensorProto.STRING, [1])
    y = helper.make_tensor_value_info("y", TensorProto.STRING, [1])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]).SerializeToString()


def test_a_graph_onnxruntime_cannot_load_is_a_compatibility_error_with_the_upgrade():
    with pytest.raises(CompatibilityError) as info:
        cpu_session(_unloadable_graph(), "fp8")
    message = str(info.value)
    assert "cannot load the fp8 graph" in message and UPGRADE_HINT in message


def test_a_graph_it_can_load_gives_a_session():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    session = cpu_session(model.SerializeToString())
    assert [o.name for o in session.get_outputs()] == ["y"]
