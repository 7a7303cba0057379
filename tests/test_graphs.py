"""The fp32 export and the fp16/fp8 graphs of timm_xception (random seeded weights).

Stated bounds (random weights, 2 evaluation images: uniform noise and a smooth pattern in
[-1, 1]; fp8 scales = max over 2 other images). Measured on the reference host: fp32 vs
torch 1e-7; fp16 vs fp32 max |diff| 3e-4 of the largest |logit|; fp8 vs fp32 1.3%.
- fp32 ONNX vs the torch model (folded and unfolded): max |diff| <= 1e-4.
- fp16 vs fp32: max |diff| <= 2e-3 x max |fp32 logit|, same top-1, cosine >= 0.99999.
- fp8 vs fp32: max |diff| <= 5e-2 x max |fp32 logit|, cosine >= 0.999.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime_py.errors import FamilyError, UsageError, WeightsError

FP16_REL_BOUND = 2e-3
FP8_REL_BOUND = 5e-2


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _fp8_weight_dqs(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    inits = {i.name: i for i in model.graph.initializer}
    return [
        n for n in model.graph.node
        if n.op_type == "DequantizeLinear" and n.input[0] in inits
        and inits[n.input[0]].data_type == TensorProto.FLOAT8E4M3FN
    ]


# --- fp32 export ---------------------------------------------------------------------

def test_fp32_onnx_matches_torch_folded_and_unfolded(
    graphs_family, graphs_state_dict, graphs_torch_model, graphs_fp32_outputs, graphs_inputs
):
    import torch

    from bundler.torch_model import unfolded_model

    x = torch.from_numpy(graphs_inputs["eval"])
    with torch.no_grad():
        folded = graphs_torch_model(x).numpy()
        unfolded = unfolded_model(graphs_family, graphs_state_dict)(x).numpy()
    assert np.abs(graphs_fp32_outputs - folded).max() <= 1e-4
    assert np.abs(graphs_fp32_outputs - unfolded).max() <= 1e-4


def test_fp32_graph_contract(graphs_fp32, graphs_run, graphs_inputs):
    g = graphs_fp32.graph
    assert [i.name for i in g.input] == ["input"] and [o.name for o in g.output] == ["logits"]
    for vi in (g.input[0], g.output[0]):
        assert vi.type.tensor_type.shape.dim[0].dim_param == "batch"
        assert vi.type.tensor_type.elem_type == TensorProto.FLOAT
    assert max(o.version for o in graphs_fp32.opset_import if o.domain in ("", "ai.onnx")) >= 19
    assert not [n for n in g.node if n.op_type == "BatchNormalization"]
    names = [n.name for n in g.node]
    assert len(set(names)) == len(names)
    assert {"stem.0.conv", "blocks.0.stack.conv1.conv_pw", "blocks.0.shortcut.conv", "head.fc"} <= set(names)
    # dynamic batch: batch 1 runs too, and gives the same logits as inside a batch of 2
    one = graphs_run(graphs_fp32, graphs_inputs["eval"][:1])
    assert one.shape == (1, 1000)


def test_export_deterministic_and_cached(graphs_family, graphs_state_dict, graphs_fp32, graphs_export_cache, tmp_path):
    from bundler.export import export_fp32_onnx, serialize
    from bundler.torch_model import build_torch_model

    cached = list(graphs_export_cache.glob("*.onnx"))
    assert len(cached) == 1 and cached[0].read_bytes() == serialize(graphs_fp32)
    assert not list(graphs_export_cache.glob("*.tmp"))
    fresh = export_fp32_onnx(build_torch_model(graphs_family, graphs_state_dict), graphs_family, cache_dir=tmp_path)
    assert serialize(fresh) == serialize(graphs_fp32)


def test_export_cache_hit_and_env_override(graphs_family, graphs_torch_model, graphs_fp32, graphs_export_cache, monkeypatch, tmp_path):
    from bundler import export

    monkeypatch.setenv("TRT_BUNDLE_CACHE", str(tmp_path))
    assert export.default_cache_dir() == tmp_path / "export"

    def no_export(*args, **kwargs):
        raise AssertionError("exported again despite a cache entry")

    monkeypatch.setattr(export, "_export", no_export)
    hit = export.export_fp32_onnx(graphs_torch_model, graphs_family, cache_dir=graphs_export_cache)
    assert export.serialize(hit) == export.serialize(graphs_fp32)


def test_weights_digest(graphs_state_dict):
    import torch

    from bundler.export import weights_digest

    small = {k: graphs_state_dict[k] for k in sorted(graphs_state_dict)[:4]}
    digest = weights_digest(small)
    assert digest == weights_digest(dict(reversed(list(small.items()))))
    assert digest == weights_digest({k: v.numpy() for k, v in small.items()})
    changed = {k: v.clone() for k, v in small.items()}
    first = sorted(changed)[0]
    changed[first].view(-1)[0] += 1
    assert weights_digest(changed) != digest
    assert weights_digest({"a": torch.zeros(2, 3)}) != weights_digest({"a": torch.zeros(3, 2)})
    assert weights_digest({"a": torch.zeros(2)}) != weights_digest({"b": torch.zeros(2)})


# --- torch model ---------------------------------------------------------------------

def test_random_weights_deterministic(graphs_family, graphs_state_dict):
    from bundler.torch_model import random_state_dict

    again = random_state_dict(graphs_family, seed=0)
    assert all(np.array_equal(again[k].numpy(), graphs_state_dict[k].numpy()) for k in graphs_state_dict)
    other = random_state_dict(graphs_family, seed=1)
    assert not np.array_equal(other["stem.0.conv.weight"].numpy(), graphs_state_dict["stem.0.conv.weight"].numpy())
    bn_var = graphs_state_dict["stem.0.bn.running_var"].numpy()
    assert not np.allclose(bn_var, 1.0)  # the fold has something to do


def test_state_dict_mismatch_is_a_weights_error(graphs_family, graphs_state_dict):
    from bundler.torch_model import build_torch_model

    broken = dict(graphs_state_dict)
    del broken["head.fc.bias"]
    broken["extra.weight"] = broken["head.fc.weight"]
    broken["stem.0.conv.weight"] = broken["stem.0.conv.weight"][:, :2]
    with pytest.raises(WeightsError) as info:
        build_torch_model(graphs_family, broken)
    message = str(info.value)
    assert "head.fc.bias" in message and "extra.weight" in message and "stem.0.conv.weight" in message
    assert "--random-weights" in message
    with pytest.raises(UsageError):
        build_torch_model(graphs_family, graphs_state_dict, seed=3)


# --- fp16 ----------------------------------------------------------------------------

def test_fp16_is_strongly_typed(graphs_fp16):
    g = graphs_fp16.graph
    assert g.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert g.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert not [i.name for i in g.initializer if i.data_type == TensorProto.FLOAT]
    assert g.node[0].op_type == "Cast" and g.node[0].input[0] == "input"
    assert g.node[-1].op_type == "Cast" and g.node[-1].output[0] == "logits"
    inferred = onnx.shape_inference.infer_shapes(graphs_fp16, strict_mode=True).graph
    fp32_inside = [v.name for v in inferred.value_info if v.type.tensor_type.elem_type == TensorProto.FLOAT]
    assert fp32_inside == []


def test_fp16_keeps_tensor_names(graphs_fp32, graphs_fp16):
    def names(m):
        return {t for n in m.graph.node for t in list(n.input) + list(n.output)}

    assert names(graphs_fp32) - {"input", "logits"} <= names(graphs_fp16)


def test_fp16_within_bound(graphs_fp16, graphs_fp32_outputs, graphs_inputs, graphs_run):
    y32 = graphs_fp32_outputs
    y16 = graphs_run(graphs_fp16, graphs_inputs["eval"])
    assert y16.dtype == np.float32
    assert np.abs(y16 - y32).max() <= FP16_REL_BOUND * np.abs(y32).max()
    assert (y16.argmax(1) == y32.argmax(1)).all()
    assert _cosine(y16, y32).min() >= 0.99999


# --- fp8 -----------------------------------------------------------------------------

def test_default_recipe_selects_the_43_dense_convs(graphs_fp32, graphs_selected):
    assert len(graphs_selected) == 43
    assert not [n for n in graphs_selected if n.startswith(("stem.", "head.")) or "conv_dw" in n]
    assert sum(n.endswith("conv_pw") for n in graphs_selected) == 39
    assert sum(n.endswith("shortcut.conv") for n in graphs_selected) == 4


def test_fp8_graph_structure(graphs_fp8, graphs_selected):
    g = graphs_fp8.graph
    weight_dqs = _fp8_weight_dqs(graphs_fp8)
    quantizes = [n for n in g.node if n.op_type == "QuantizeLinear"]
    assert len(weight_dqs) == 43 and len(quantizes) == 43
    # one QuantizeLinear per tensor
    assert len({q.input[0] for q in quantizes}) == len(quantizes)
    inits = {i.name: i for i in g.initializer}
    for q in quantizes:
        assert inits[q.input[1]].data_type == TensorProto.FLOAT16 and list(inits[q.input[1]].dims) == []
        assert inits[q.input[2]].data_type == TensorProto.FLOAT8E4M3FN
    producers = {o: n for n in g.node for o in n.output}
    by_name = {n.name: n for n in g.node}
    for name in graphs_selected:
        conv = by_name[name]
        data, weight = producers[conv.input[0]], producers[conv.input[1]]
        assert data.op_type == "DequantizeLinear" and producers[data.input[0]].op_type == "QuantizeLinear"
        assert weight in weight_dqs and {a.name: a.i for a in weight.attribute}["axis"] == 0
        assert inits[weight.input[1]].data_type == TensorProto.FLOAT16
    onnx.checker.check_model(graphs_fp8, full_check=True)


def test_fp8_within_bound(graphs_fp8, graphs_fp32_outputs, graphs_inputs, graphs_run):
    y32 = graphs_fp32_outputs
    y8 = graphs_run(graphs_fp8, graphs_inputs["eval"])
    assert y8.dtype == np.float32 and np.isfinite(y8).all()
    assert np.abs(y8 - y32).max() <= FP8_REL_BOUND * np.abs(y32).max()
    assert _cosine(y8, y32).min() >= 0.999


def test_fp8_is_deterministic(graphs_fp16, graphs_fp8, graphs_selected, graphs_act_scales, graphs_weight_scales):
    from bundler.export import serialize
    from bundler.graphs.fp8 import to_fp8

    again = to_fp8(graphs_fp16, graphs_selected, graphs_act_scales, graphs_weight_scales)
    assert serialize(again) == serialize(graphs_fp8)


def test_fp8_weights_are_per_channel_rne_saturated(graphs_fp8, graphs_fp16, graphs_weight_scales):
    import ml_dtypes

    inits = {i.name: i for i in graphs_fp8.graph.initializer}
    name = "blocks.0.stack.conv1.conv_pw"
    q = numpy_helper.to_array(inits[f"{name}.weight_fp8"]).astype(np.float32)
    scale = numpy_helper.to_array(inits[f"{name}.weight_scale"]).astype(np.float32)
    np.testing.assert_allclose(scale, graphs_weight_scales[name], rtol=1e-3)
    w16 = numpy_helper.to_array({i.name: i for i in graphs_fp16.graph.initializer}[f"{name}.weight"])
    expected = (w16.astype(np.float32) / scale[:, None, None, None]).astype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(q, expected.astype(np.float32))
    # every channel uses its range: the largest code is (close to) 448
    assert np.abs(q.reshape(q.shape[0], -1)).max(axis=1).min() >= 416


def test_variant_depthwise_quantizes_more(graphs_fp32, graphs_fp16, graphs_family, graphs_selected):
    from bundler.graphs.fp8 import quantized_activation_tensors, select_fp8_layers, to_fp8

    depthwise = select_fp8_layers(graphs_fp32, graphs_family, "fp8-depthwise")
    assert len(depthwise) == 82 and set(graphs_selected) < set(depthwise)
    assert all(n.endswith("conv_dw") for n in set(depthwise) - set(graphs_selected))
    tensors = quantized_activation_tensors(graphs_fp16, depthwise)
    model = to_fp8(
        graphs_fp16, depthwise, {t: 0.01 for t in tensors},
        {n: np.full(_out_channels(graphs_fp32, n), 0.01, np.float32) for n in depthwise},
    )
    assert len(_fp8_weight_dqs(model)) == 82
    assert len([n for n in model.graph.node if n.op_type == "QuantizeLinear"]) == len(tensors) == 82


def _out_channels(model: onnx.ModelProto, node_name: str) -> int:
    inits = {i.name: i for i in model.graph.initializer}
    node = next(n for n in model.graph.node if n.name == node_name)
    return inits[node.input[1]].dims[0]


def test_expected_count_guards_the_recipe(graphs_fp32, graphs_family):
    from bundler.graphs.fp8 import select_fp8_layers

    recipe = graphs_family.recipe()
    recipe["expected_count"] = 42
    with pytest.raises(FamilyError, match="selects 43"):
        select_fp8_layers(graphs_fp32, recipe)
    recipe = {"select": {"include": [{"op_type": "Gemm"}]}}  # the family's rules exclude head.*
    assert select_fp8_layers(graphs_fp32, recipe) == ["head.fc"]   # Gemm: quantizable
    recipe = {"select": {"include": [{"name_regex": "."}]}}          # Adds with weights? none
    picked = select_fp8_layers(graphs_fp32, recipe)
    assert picked and all(n in {x.name for x in graphs_fp32.graph.node
                                if x.op_type in ("Conv", "Gemm", "MatMul")} for n in picked)


def test_missing_scales_are_refused(graphs_fp16, graphs_selected, graphs_act_scales, graphs_weight_scales):
    from bundler.graphs.fp8 import to_fp8

    acts = dict(list(graphs_act_scales.items())[1:])
    with pytest.raises(UsageError, match="no activation scale"):
        to_fp8(graphs_fp16, graphs_selected, acts, graphs_weight_scales)


# --- sharing, on a small hand-built graph --------------------------------------------

def _two_convs_on_one_tensor() -> onnx.ModelProto:
    """input -> Relu -> r; conv_a(r) + conv_b(r) -> out: two selected convs read r."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Relu", ["input"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "a.weight", "a.bias"], ["ya"], name="a", kernel_shape=[1, 1]),
        helper.make_node("Conv", ["r", "b.weight"], ["yb"], name="b", kernel_shape=[1, 1]),
        helper.make_node("Add", ["ya", "yb"], ["out"], name="add"),
    ]
    inits = [
        numpy_helper.from_array(rng.normal(size=(8, 4, 1, 1)).astype(np.float32), "a.weight"),
        numpy_helper.from_array(rng.normal(size=(8,)).astype(np.float32), "a.bias"),
        numpy_helper.from_array(rng.normal(size=(8, 4, 1, 1)).astype(np.float32), "b.weight"),
    ]
    graph = helper.make_graph(
        nodes, "two", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4, 5, 5])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 8, 5, 5])], initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 10
    return model


def test_two_consumers_share_one_quantize(graphs_run):
    from bundler.graphs.fp8 import E4M3_MAX, compute_weight_scales, quantized_activation_tensors, select_fp8_layers, to_fp8
    from bundler.graphs.fp16 import to_fp16

    m32 = _two_convs_on_one_tensor()
    recipe = {"select": {"include": [{"op_type": "Conv", "kernel_shape": [1, 1], "group": 1}]}, "expected_count": 2}
    selected = select_fp8_layers(m32, recipe)
    assert selected == ["a", "b"]
    assert quantized_activation_tensors(m32, selected) == ["r"]
    x = np.random.default_rng(1).normal(size=(2, 4, 5, 5)).astype(np.float32)
    m8 = to_fp8(to_fp16(m32), selected, {"r": float(np.maximum(x, 0).max()) / E4M3_MAX}, compute_weight_scales(m32, selected))
    quantizes = [n for n in m8.graph.node if n.op_type == "QuantizeLinear"]
    assert len(quantizes) == 1 and len(_fp8_weight_dqs(m8)) == 2
    dq_out = next(n for n in m8.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == quantizes[0].output[0]).output[0]
    assert [n.input[0] for n in m8.graph.node if n.op_type == "Conv"] == [dq_out, dq_out]
    y32, y8 = graphs_run(m32, x), graphs_run(m8, x)
    assert np.abs(y8 - y32).max() <= 0.1 * np.abs(y32).max()


def test_graph_input_is_named_by_its_fp32_name():
    from bundler.graphs.fp8 import quantized_activation_tensors, to_fp8
    from bundler.graphs.fp16 import to_fp16

    m32 = _two_convs_on_one_tensor()
    m32.graph.node[1].input[0] = "input"  # conv a reads the graph input directly
    m16 = to_fp16(m32)
    assert quantized_activation_tensors(m16, ["a"]) == quantized_activation_tensors(m32, ["a"]) == ["input"]
    m8 = to_fp8(m16, ["a"], {"input": 0.01}, {"a": np.full(8, 0.01, np.float32)})
    onnx.checker.check_model(m8)
