"""fp32 graph -> strongly typed fp16 graph.

TensorRT 11 builds strongly typed networks: the precision of every layer is the type of
its tensors in the ONNX graph, not a builder flag. So the fp16 graph must say fp16
everywhere: every float initializer, every internal tensor, and every attribute that
carries a float type or value (``Cast.to``, ``Constant``/``ConstantOfShape`` values,
``dtype`` attributes). The graph's inputs and outputs stay float32 so that callers feed
and read the same arrays for every precision: one ``Cast`` after each input and one before
each output.

Names: every node and internal tensor keeps its fp32 name, so calibration scales computed
on the fp32 graph apply to the fp16/fp8 graphs (see ``bundler.graphs.fp8``). The only new
tensors are the boundary casts: input ``<name>`` is read through ``<name>_fp16`` and output
``<name>`` is produced from ``<name>_fp16``.

Written with plain ``onnx`` protos (no onnxconverter-common): the pass is small and every
rule is explicit here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime_py.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    import onnx

__all__ = ["to_fp16", "FP16_SUFFIX"]

FP16_SUFFIX = "_fp16"
_FP16_MAX = 65504.0
# (op_type, input index) whose tensor must stay float32 whatever the data type
# (ONNX types them tensor(float) only).
_FP32_ONLY_INPUTS = {("Resize", 2), ("Upsample", 1)}
# Ops whose nested graphs this pass does not rewrite.
_SUBGRAPH_OPS = {"If", "Loop", "Scan"}


def to_fp16(model_fp32: onnx.ModelProto) -> onnx.ModelProto:
    """A new model: ``model_fp32`` with every internal tensor fp16, IO kept fp32 by casts.

    Raises ``UsageError`` for graphs this pass cannot type (control flow subgraphs) or
    weights that do not fit in fp16 (a finite value beyond 65504).
    """
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.ModelProto()
    model.CopyFrom(model_fp32)
    graph = model.graph
    FLOAT, HALF = TensorProto.FLOAT, TensorProto.FLOAT16

    keep_fp32 = {
        node.input[i]
        for node in graph.node
        for (op, i) in _FP32_ONLY_INPUTS
        if node.op_type == op and len(node.input) > i
    }
    for init in graph.initializer:
        if init.data_type == FLOAT and init.name not in keep_fp32:
            init.CopyFrom(_half_tensor(init, np, numpy_helper))

    for node in graph.node:
        if node.op_type in _SUBGRAPH_OPS:
            raise UsageError(f"fp16: node {node.name!r} ({node.op_type}) has subgraphs, which this pass does not type")
        if any(out in keep_fp32 for out in node.output):
            continue  # a Constant feeding a float32-only input
        for attr in node.attribute:
            if attr.name == "to" and node.op_type == "Cast" and attr.i == FLOAT:
                attr.i = HALF
            elif attr.name == "dtype" and attr.i == FLOAT:
                attr.i = HALF
            elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == FLOAT:
                attr.t.CopyFrom(_half_tensor(attr.t, np, numpy_helper))
            elif attr.type == onnx.AttributeProto.GRAPH or attr.type == onnx.AttributeProto.GRAPHS:
                raise UsageError(f"fp16: node {node.name!r} has a subgraph attribute, which this pass does not type")

    for vi in graph.value_info:
        if vi.type.tensor_type.elem_type == FLOAT and vi.name not in keep_fp32:
            vi.type.tensor_type.elem_type = HALF

    head, tail = [], []
    for vi in graph.input:
        if vi.type.tensor_type.elem_type != FLOAT:
            continue
        cast_out = vi.name + FP16_SUFFIX
        for node in graph.node:
            for i, name in enumerate(node.input):
                if name == vi.name:
                    node.input[i] = cast_out
        head.append(helper.make_node("Cast", [vi.name], [cast_out], name=vi.name + "_cast_to_fp16", to=HALF))
    for vi in graph.output:
        if vi.type.tensor_type.elem_type != FLOAT:
            continue
        inner = vi.name + FP16_SUFFIX
        for node in graph.node:
            for i, name in enumerate(node.output):
                if name == vi.name:
                    node.output[i] = inner
            for i, name in enumerate(node.input):
                if name == vi.name:
                    node.input[i] = inner
        tail.append(helper.make_node("Cast", [inner], [vi.name], name=vi.name + "_cast_to_fp32", to=FLOAT))
    nodes = head + list(graph.node) + tail
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def _half_tensor(tensor, np, numpy_helper):  # type: ignore[no-untyped-def]
    """The same tensor (name, shape) in fp16; refuses values that would become inf."""
    array = numpy_helper.to_array(tensor)
    finite = array[np.isfinite(array)]
    if finite.size and float(np.abs(finite).max()) > _FP16_MAX:
        raise UsageError(
            f"fp16: tensor {tensor.name!r} holds values up to {float(np.abs(finite).max()):.4g}, "
            f"beyond fp16's {_FP16_MAX:g}; this model cannot be built in fp16 (use fp32)"
        )
    return numpy_helper.from_array(array.astype(np.float16), tensor.name)
