"""fp16 graph -> fp8 graph: FP8 E4M3 Q/DQ on the layers the family's recipe selects.

What the fp8 graph is (what TensorRT's strongly typed network and ONNX Runtime both run):
for each selected Conv, MatMul or Gemm with an initializer kernel,
- the weight is an FLOAT8E4M3FN initializer ``<node>.weight_fp8`` (per output channel:
  ``q = fp8(w / s)``, round to nearest even, saturated to +-448) feeding a
  ``DequantizeLinear`` along the kernel's output-channel axis (``output_axis``: 0 for
  Conv and ``Gemm(transB=1)``, 1 for MatMul's [in, out] kernel) with an fp16 scale
  ``s[c] = amax_c / 448`` of the BatchNorm-folded kernel, giving the fp16 weight the
  layer reads;
- the layer's data input X goes through ``QuantizeLinear`` (per-tensor fp16 scale, zero
  point of type FLOAT8E4M3FN, which makes the output FP8) and ``DequantizeLinear`` back to
  fp16. There is ONE Q/DQ pair per activation tensor: selected layers reading the same
  tensor share it (TensorRT fuses a Q into every consumer; duplicates would only add work).
Everything else stays fp16 (``bundler.graphs.fp16``). Opset 19 (the first with FP8 Q/DQ
and per-axis fp16 scales) is enough, and ONNX Runtime's CPU provider runs these graphs.
Scales follow the one rule of ``bundler.fp8.stored_scale``.

Selection rules (family data, ``family.json`` ``fp8.select`` and its variants): a node is
selected when it matches at least one ``include`` rule and no ``exclude`` rule; only
nodes whose kernel is an initializer are candidates; a rule matches when every key it has
matches:
- ``op_type``: the node's op type (``QUANTIZABLE_OPS``: Conv, MatMul, Gemm);
- ``kernel_shape``: ``[kh, kw]``, from the attribute or the weight's shape (Conv);
- ``group``: the ``group`` attribute (default 1);
- ``depthwise``: true for convolutions with ``group > 1`` and one input channel per group;
- ``module_prefix``: the torch module path (the weight initializer's name without
  ``.weight``, see ``bundler.export``) starts with it;
- ``name_regex``: ``re.search`` on the node name.
A recipe may state ``expected_count``; a graph that gives another count is refused, so that
an exporter or architecture change cannot silently quantize something else.

Tensor-name contract with calibration: the fp32, fp16 and fp8 graphs share node and tensor
names (``bundler.graphs.fp16`` keeps them), so activation scales calibrated on the fp32
graph apply to the fp16 and fp8 ones. ``activation_tensors`` names, per selected node, the
tensor calibration measures (the one naming rule), and ``to_fp8`` looks its
``act_scales`` up by those names. The one place where the graphs differ is a graph input
read through the fp16 boundary cast (``<input>_fp16``): such a tensor is always named by
the graph input's name. Scales are scales (``amax / 448``), not amax values.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from bundler.fp8 import E4M3_MAX, quantize as quantize_fp8, scale_of, stored_scale
from runtime_py.errors import FamilyError, UsageError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import onnx

    from bundler.families import Family

__all__ = [
    "E4M3_MAX",
    "MIN_OPSET",
    "select_fp8_layers",
    "activation_tensors",
    "output_axis",
    "QUANTIZABLE_OPS",
    "quantized_activation_tensors",
    "compute_weight_scales",
    "to_fp8",
    "module_path",
    "selected_by",
]

MIN_OPSET = 19
#: The ops whose kernel (an initializer) and data input this pass can quantize.
QUANTIZABLE_OPS = ("Conv", "MatMul", "Gemm")


def output_axis(node: onnx.NodeProto) -> int:
    """The axis of ``node``'s kernel that indexes output channels (the per-channel scales')."""
    if node.op_type == "MatMul":
        return 1
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    return 0


# --- selection ---------------------------------------------------------------------


def select_fp8_layers(
    model: onnx.ModelProto, recipe: Family | Mapping[str, Any], variant: str | None = None
) -> list[str]:
    """Names of the nodes the recipe quantizes, in graph order.

    ``recipe`` is a ``Family`` (then ``variant``'s rules are merged in) or a recipe mapping
    as returned by ``Family.recipe(variant)``. Works on the fp32 or fp16 graph (in the fp8
    graph the selected kernels are DequantizeLinear outputs and are not matched again).
    Raises ``FamilyError`` when the count differs from the recipe's ``expected_count`` and
    ``UsageError`` when a rule selects a node this pass cannot quantize.
    """
    if hasattr(recipe, "recipe"):
        recipe = recipe.recipe(variant)  # type: ignore[union-attr]
    elif variant is not None and recipe.get("variant") != variant:
        raise UsageError(
            f"variant {variant!r} given with a recipe that is not resolved for it; "
            "pass the Family, or family.recipe(variant)"
        )
    select = recipe.get("select", {})
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    chosen = []
    for node in graph.node:
        facts = _node_facts(node, inits)
        if facts is None:
            continue
        if selected_by(select, facts):
            if node.op_type not in QUANTIZABLE_OPS:
                raise UsageError(f"fp8 recipe selects {node.name!r} ({node.op_type}); only "
                                 f"{', '.join(QUANTIZABLE_OPS)} nodes can be quantized")
            chosen.append(node.name)
    expected = recipe.get("expected_count")
    if expected is not None and len(chosen) != expected:
        which = f" (variant {recipe.get('variant')})" if recipe.get("variant") else ""
        raise FamilyError(
            f"the fp8 recipe{which} selects {len(chosen)} layers in this graph, "
            f"the family expects {expected}: the exported graph or the rules changed; "
            "check the family's fp8.select rules against the graph"
        )
    return chosen


def module_path(node: onnx.NodeProto) -> str:
    """The torch module a parameter node comes from: its weight name without ``.weight``."""
    if len(node.input) > 1 and node.input[1].endswith(".weight"):
        return node.input[1].removesuffix(".weight")
    return node.name


def _node_facts(node: onnx.NodeProto, inits: Mapping[str, Any]) -> dict[str, Any] | None:
    """What rules can test about a node; None for nodes without an initializer weight
    (activation x activation MatMuls, elementwise ops: never candidates)."""
    facts: dict[str, Any] = {"op_type": node.op_type, "name": node.name, "module": module_path(node)}
    if len(node.input) < 2 or node.input[1] not in inits:
        return None
    dims = list(inits[node.input[1]].dims)
    attrs = {a.name: a for a in node.attribute}
    group = attrs["group"].i if "group" in attrs else 1
    facts["group"] = group
    if node.op_type == "Conv":
        facts["kernel_shape"] = list(attrs["kernel_shape"].ints) if "kernel_shape" in attrs else dims[2:]
        facts["depthwise"] = group > 1 and len(dims) > 1 and dims[1] == 1
    return facts


def selected_by(select: Mapping[str, Any], facts: Mapping[str, Any]) -> bool:
    """Whether a layer with ``facts`` (op_type, name, module, group, kernel_shape,
    depthwise; ``_node_facts``) is selected by a recipe's ``select`` rules: at least one
    ``include`` rule matches and no ``exclude`` rule does (module docstring)."""
    return (any(_matches(r, facts) for r in select.get("include", []))
            and not any(_matches(r, facts) for r in select.get("exclude", [])))


def _matches(rule: Mapping[str, Any], facts: Mapping[str, Any]) -> bool:
    for key, want in rule.items():
        if key == "module_prefix":
            ok = str(facts["module"]).startswith(want)
        elif key == "name_regex":
            ok = re.search(want, facts["name"]) is not None
        elif key == "kernel_shape":
            ok = facts.get("kernel_shape") == list(want)
        elif key in ("op_type", "group", "depthwise"):
            ok = facts.get(key) == want
        else:
            raise FamilyError(f"fp8 rule key {key!r} is not known; see bundler.graphs.fp8 for the rule keys")
        if not ok:
            return False
    return True


# --- what calibration measures ------------------------------------------------------


def quantized_activation_tensors(model: onnx.ModelProto, selected: Iterable[str]) -> list[str]:
    """The unique activation tensors read by the selected nodes, in graph order.

    The same names for the fp32 and the fp16 graph (module docstring): these are the keys
    of ``to_fp8``'s ``act_scales`` and of ``act.<tensor>.*`` in calibration files.
    """
    return list(dict.fromkeys(activation_tensors(model, selected).values()))


def activation_tensors(model: onnx.ModelProto, selected: Iterable[str]) -> dict[str, str]:
    """Selected node -> the name calibration gives its data input, in graph order.

    The one naming rule (module docstring), for the fp32, fp16 and fp8 graphs: in the fp8
    graph a node reads ``<t>_dequantized`` (QuantizeLinear -> DequantizeLinear over ``t``),
    in the fp16 graph a graph input ``<input>`` through its boundary cast; both are named
    by what calibration measured on the fp32 graph.
    """
    graph = model.graph
    wanted = set(selected)
    by_name = {n.name: n for n in graph.node}
    missing = sorted(wanted - set(by_name))
    if missing:
        raise UsageError(f"selected node(s) not in the graph: {missing[:5]}")
    aliases = _input_cast_aliases(graph)
    producers = {out: n for n in graph.node for out in n.output}
    found: dict[str, str] = {}
    for node in graph.node:
        if node.name not in wanted:
            continue
        name = node.input[0]
        dq = producers.get(name)
        if dq is not None and dq.op_type == "DequantizeLinear":
            q = producers.get(dq.input[0])
            if q is not None and q.op_type == "QuantizeLinear":
                name = q.input[0]
        found[node.name] = aliases.get(name, name)
    return found


def _input_cast_aliases(graph: onnx.GraphProto) -> dict[str, str]:
    """``<input>_fp16`` -> ``<input>`` for the fp16 graph's boundary casts."""
    inputs = {i.name for i in graph.input}
    return {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Cast" and n.input[0] in inputs}


# --- weights ------------------------------------------------------------------------


def compute_weight_scales(model: onnx.ModelProto, selected: Iterable[str]) -> dict[str, np.ndarray]:
    """Per-output-channel ``amax / 448`` of each selected node's kernel (float32 [Cout]).

    Give it the fp32 graph: its kernels are the BatchNorm-folded ones at full precision.
    A channel whose kernel is all zero gets scale 1 (any positive scale quantizes it to 0).
    """
    import numpy as np
    from onnx import numpy_helper

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    by_name = {n.name: n for n in graph.node}
    scales: dict[str, np.ndarray] = {}
    for name in selected:
        node = by_name.get(name)
        if node is None or len(node.input) < 2 or node.input[1] not in inits:
            raise UsageError(f"node {name!r} is not in the graph or has no initializer weight")
        w = np.moveaxis(numpy_helper.to_array(inits[node.input[1]]).astype(np.float32),
                        output_axis(node), 0)
        scales[name] = scale_of(np.abs(w.reshape(w.shape[0], -1)).max(axis=1))
    return scales


# --- the graph ----------------------------------------------------------------------


def to_fp8(
    model_fp16: onnx.ModelProto,
    selected: Iterable[str],
    act_scales: Mapping[str, float],
    weight_scales: Mapping[str, np.ndarray],
) -> onnx.ModelProto:
    """A new model: ``model_fp16`` with FP8 Q/DQ on the ``selected`` nodes.

    ``act_scales``: per-tensor scale (``amax / 448``) for every name of
    ``quantized_activation_tensors``; ``weight_scales``: per-output-channel scales
    (``compute_weight_scales``, on the fp32 graph). Scales are stored as fp16 by the one rule
    ``bundler.fp8.stored_scale`` (``bundle make`` has applied it already, so this is exact)
    and the weights are quantized with exactly those stored scales, from the fp16 graph's
    weights.
    """
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.ModelProto()
    model.CopyFrom(model_fp16)
    graph = model.graph
    selected = list(selected)
    inits = {i.name: i for i in graph.initializer}
    by_name = {n.name: n for n in graph.node}
    aliases = _input_cast_aliases(graph)

    problems = []
    for name in selected:
        node = by_name.get(name)
        if node is None:
            problems.append(f"node {name!r} is not in the graph")
        elif node.op_type not in QUANTIZABLE_OPS or len(node.input) < 2 or node.input[1] not in inits:
            problems.append(f"node {name!r} is not a {'/'.join(QUANTIZABLE_OPS)} with an "
                            "initializer weight")
        elif name not in weight_scales:
            problems.append(f"no weight scales for {name!r}")
    needed = quantized_activation_tensors(model, [n for n in selected if n in by_name])
    problems += [f"no activation scale for tensor {t!r}" for t in needed if t not in act_scales]
    if problems:
        raise UsageError("cannot build the fp8 graph: " + "; ".join(problems[:5]), problems=problems)

    before: dict[str, list[onnx.NodeProto]] = {}  # node name -> nodes to emit just before it
    after: dict[str, list[onnx.NodeProto]] = {}  # tensor name -> nodes to emit after its producer
    shared: dict[str, str] = {}  # activation tensor -> its dequantized fp16 tensor
    new_inits: list[onnx.TensorProto] = []
    unused_weights: set[str] = set()

    for name in selected:
        node = by_name[name]
        # weight: fp8 initializer -> DequantizeLinear(axis=0) -> fp16
        w_init = inits[node.input[1]]
        w = numpy_helper.to_array(w_init)
        if w.dtype != np.float16:
            raise UsageError(f"to_fp8 expects the fp16 graph; weight {w_init.name!r} is {w.dtype}")
        axis = output_axis(node)
        scale = stored_scale(weight_scales[name]).astype(np.float16).reshape(-1)
        if scale.shape[0] != w.shape[axis]:
            raise UsageError(f"weight scales for {name!r} have {scale.shape[0]} channels, the kernel {w.shape[axis]}")
        shape = [1] * w.ndim
        shape[axis] = -1
        q = quantize_fp8(w, scale.astype(np.float32).reshape(shape))
        q_name, s_name, z_name = f"{name}.weight_fp8", f"{name}.weight_scale", f"{name}.weight_zero_point"
        new_inits += [
            numpy_helper.from_array(q, q_name),
            numpy_helper.from_array(scale, s_name),
            helper.make_tensor(z_name, TensorProto.FLOAT8E4M3FN, [w.shape[axis]], np.zeros(w.shape[axis], np.float32)),
        ]
        dq_out = f"{name}.weight_dequantized"
        before.setdefault(name, []).append(
            helper.make_node("DequantizeLinear", [q_name, s_name, z_name], [dq_out], name=f"{name}.weight_DequantizeLinear", axis=axis)
        )
        unused_weights.add(node.input[1])
        node.input[1] = dq_out

        # activation: one shared QuantizeLinear -> DequantizeLinear per tensor
        x = node.input[0]
        if x not in shared:
            key = aliases.get(x, x)
            a_scale = stored_scale(act_scales[key]).astype(np.float16).reshape(())
            base = key
            s_name, z_name = f"{base}_fp8_scale", f"{base}_fp8_zero_point"
            new_inits += [
                numpy_helper.from_array(a_scale, s_name),
                helper.make_tensor(z_name, TensorProto.FLOAT8E4M3FN, [], [0.0]),
            ]
            q_out, dq_out = f"{base}_fp8", f"{base}_dequantized"
            after.setdefault(x, []).extend([
                helper.make_node("QuantizeLinear", [x, s_name, z_name], [q_out], name=f"{base}_QuantizeLinear"),
                helper.make_node("DequantizeLinear", [q_out, s_name, z_name], [dq_out], name=f"{base}_DequantizeLinear"),
            ])
            shared[x] = dq_out
        node.input[0] = shared[x]

    still_used = {i for n in graph.node for i in n.input}
    kept = [i for i in graph.initializer if i.name not in unused_weights or i.name in still_used]
    del graph.initializer[:]
    graph.initializer.extend(kept + new_inits)

    produced_outside = [t for t in after if t not in {o for n in graph.node for o in n.output}]
    nodes: list[onnx.NodeProto] = [n for t in produced_outside for n in after[t]]
    for node in graph.node:
        nodes.extend(before.get(node.name, []))
        nodes.append(node)
        for out in node.output:
            nodes.extend(after.get(out, []))
    del graph.node[:]
    graph.node.extend(nodes)

    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version < MIN_OPSET:
            opset.version = MIN_OPSET
    onnx.checker.check_model(model)
    return model
