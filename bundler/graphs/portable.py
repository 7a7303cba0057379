"""A graph as the bundler evaluates it where the results become bytes of the bundle:
ONNX Runtime kernels whose results depend on the CPU replaced by ops whose results do not.

A bundle's calibration ranges, reference outputs and quality figures are computed by ONNX
Runtime on the CPU of the machine that makes it, and they are part of the bundle, so of
its id. Measured with ONNX Runtime 1.32 on an AVX-512 CPU against the same programs run
under qemu as an AVX2 CPU (Haswell), each op kind the families use, float32, fp16 and FP8
Q/DQ (`tests/test_portable_graphs.py` repeats it where qemu is installed):

- at ENABLE_ALL, the NCHWc layout's convolutions (channels in blocks of 8 with AVX2, 16
  with AVX-512, so another summation order) and everything after them differ: the build's
  sessions run at ENABLE_EXTENDED (``runtime_py.engines.onnxruntime.reproducible_level``);
- at every level, float32 Softmax (MLAS's vectorized kernel) differs: rewritten here as
  ReduceMax, Sub, Exp, ReduceSum, Div over its axis, which gave the same bits on both;
- the same on both at ENABLE_EXTENDED: Conv (dense, 1x1, depthwise, strided), MatMul,
  Gemm, LayerNormalization, Erf, Exp, Tanh, Sigmoid, the pools, ReduceMean, fp16 Softmax
  (which ONNX Runtime already computes in the decomposed order: same bits as the rewrite)
  and FP8 Quantize/DequantizeLinear.
"""

from __future__ import annotations

#: The first opset whose Softmax normalizes along one axis (earlier: coerced to 2-D).
_SOFTMAX_ONE_AXIS = 13
#: The first opset whose ReduceMax takes its axes as an input, not an attribute.
_REDUCE_MAX_AXES_INPUT = 18


def portable_softmax(model, *, copy: bool = True):
    """``model`` with every Softmax of its main graph as exp(x - max) / sum(exp(x - max))
    along the same axis, the output keeping its name (so calibrated tensors and outputs are
    found as before); ``model`` itself where there is none to rewrite. ``copy=False``
    rewrites ``model`` in place (for a caller's own copy: a ViT graph is 330 MB)."""
    import onnx
    from onnx import TensorProto, helper

    graph = model.graph
    if not any(n.op_type == "Softmax" and n.domain in ("", "ai.onnx") for n in graph.node):
        return model
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < _SOFTMAX_ONE_AXIS:
        return model                        # (the families export opset 19)
    if copy:
        model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    nodes = []
    for i, node in enumerate(graph.node):
        if node.op_type != "Softmax" or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
        x, y = node.input[0], node.output[0]
        tag = f"{y}::portable_softmax{i}"
        axes = f"{tag}/axes"
        graph.initializer.append(helper.make_tensor(axes, TensorProto.INT64, [1], [axis]))
        if opset >= _REDUCE_MAX_AXES_INPUT:
            nodes.append(helper.make_node("ReduceMax", [x, axes], [f"{tag}/max"], keepdims=1))
        else:
            nodes.append(helper.make_node("ReduceMax", [x], [f"{tag}/max"], axes=[axis], keepdims=1))
        nodes += [helper.make_node("Sub", [x, f"{tag}/max"], [f"{tag}/shifted"]),
                  helper.make_node("Exp", [f"{tag}/shifted"], [f"{tag}/exp"]),
                  helper.make_node("ReduceSum", [f"{tag}/exp", axes], [f"{tag}/sum"], keepdims=1),
                  helper.make_node("Div", [f"{tag}/exp", f"{tag}/sum"], [y])]
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def portable_bytes(model_bytes: bytes) -> bytes:
    """``portable_softmax`` of a serialized graph, unparsed work avoided where it has no
    Softmax (the convolution families' 90-100 MB graphs are returned as they are)."""
    if b"Softmax" not in model_bytes:
        return model_bytes
    import onnx

    model = onnx.load_from_string(model_bytes)
    return portable_softmax(model, copy=False).SerializeToString()
