"""torch-aoti's channels_last fp8 form (family.json ``torch_aoti.fp8_layout: channels_last``).

The model stays as it is, in fp16 and channels_last memory, and only the recipe's layers
become the NHWC rewrite's FP8 modules, each on the NHWC view of its input. On the CPU (FP8
GEMMs emulated in fp32 from the same FP8 operands) it must compute what the bundle's fp8
ONNX graph computes and what the NHWC rewrite computes; the build must record the form,
and `bundle study` must not reuse a bundle of another form.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from bundler.families import families_path, load_family
from runtime_py.errors import UsageError

torch = pytest.importorskip("torch")


def _layers(graph, act_scales, weight_scales):
    from bundler.build_context import fp8_layers

    layers = fp8_layers(graph, list(weight_scales), act_scales, weight_scales)
    return {n: (layer.act_scale, layer.weight_scales) for n, layer in layers.items()}


@pytest.fixture(scope="module")
def xception_fp8(graphs_fp8, graphs_torch_model, graphs_act_scales, graphs_weight_scales):
    """module path -> (activation scale, weight scales) of the bundle's 43 FP8 layers."""
    from bundler.targets.torch_aoti.model import map_nodes_to_modules

    layers = _layers(graphs_fp8, graphs_act_scales, graphs_weight_scales)
    paths = map_nodes_to_modules(graphs_torch_model, list(layers))
    return {paths[n]: s for n, s in layers.items()}


def _write_family(root, name: str, aoti: dict, drop: tuple[str, ...] = ()):
    """timm_xception's family.json with its ``torch_aoti`` settings updated by ``aoti``
    (``drop``: settings removed first), written as family ``name`` under ``root`` (with the
    class ids); returns ``root``, the folder to put on ``families_path``."""
    xception = load_family("timm_xception")
    spec = json.loads((xception.path / "family.json").read_text())
    spec["name"] = name
    for key in drop:
        spec["torch_aoti"].pop(key)
    spec["torch_aoti"].update(aoti)
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "family.json").write_text(json.dumps(spec))
    shutil.copy(xception.path / "class_ids.txt", folder / "class_ids.txt")
    return root


def _run(body, x, nhwc: bool, channels_last: bool = False):
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule

    with torch.no_grad():
        return EngineModule(body, torch.float16, nhwc, channels_last)(x).float()


def test_channels_last_fp8_model_matches_onnxruntime_and_the_nhwc_rewrite(
        graphs_fp8, graphs_torch_model, graphs_inputs, graphs_run, xception_fp8):
    """The same FP8 operands and scales as the graph: within the fp8 tolerance of ONNX
    Runtime on the bundle's fp8 graph, same top-1, and what the NHWC rewrite gives (the
    two differ only in how fp16 layers round), with cuDNN's depthwise convolutions or the
    shifted-slice ones, or the ones that feed an FP8 GEMM writing its e4m3 rows
    (``DepthwiseE4m3``, here in torch ops: the Triton kernel is tested on its own)."""
    from bundler.targets.torch_aoti.fp8_layers import Fp8Pointwise
    from bundler.targets.torch_aoti.model import rewrite_channels_last, rewrite_nhwc
    from bundler.targets.torch_aoti.nhwc_modules import (ChannelsLastView, DepthwiseE4m3,
                                                         SkipAddBlock)

    x = torch.from_numpy(graphs_inputs["eval"][:4])
    ref = graphs_run(graphs_fp8, graphs_inputs["eval"][:4])
    nhwc = _run(rewrite_nhwc(graphs_torch_model, torch.float16, fp8=xception_fp8,
                             emulate=True), x, True).numpy()
    outputs = {}
    table = load_family("timm_xception").target_settings("torch-aoti").fp8_triton_pointwise
    for depthwise in ("cudnn", "slices", "triton", "triton-rows", "triton-skip"):
        body = rewrite_channels_last(graphs_torch_model, torch.float16, fp8=xception_fp8,
                                     emulate=True, depthwise=depthwise, triton_pointwise=table)
        # "triton-skip": the layers the family's table names run on the Triton kernel: the
        # last 1x1 layer of the first two entry blocks and of the first exit block, with
        # the block's skip in its epilogue, and the first 1x1 layer of the first two blocks
        skips = [m for m in body.modules() if isinstance(m, SkipAddBlock)]
        on_triton = [m for m in body.modules()
                     if isinstance(m, Fp8Pointwise) and m.triton_tiles is not None]
        assert len(skips) == (3 if depthwise == "triton-skip" else 0)
        assert all(m.shortcut is not None for m in skips)
        assert len(on_triton) == (5 if depthwise == "triton-skip" else 0)
        triton = depthwise.startswith("triton")
        views = [m for m in body.modules() if isinstance(m, ChannelsLastView)]
        fp8 = [v for v in views if isinstance(v.layer, Fp8Pointwise)]
        assert len(fp8) == 43
        assert (len(views) > 43) is (depthwise != "cudnn")
        fused = [v for v in views if isinstance(v.layer, DepthwiseE4m3)]
        # every separable convolution's depthwise half feeds its FP8 1x1 half (the 4
        # shortcut 1x1 layers of the 43 take the fp16 block input); the exit block's
        # three have a ReLU between the halves, which goes into the kernel
        assert len(fused) == (39 if triton else 0)
        assert sum(v.layer.relu for v in fused) == (3 if triton else 0)
        # "triton-rows": every such layer asks for the row-strip tile (the kernel takes
        # it where the layer is stride 1; the CPU path here is the same arithmetic)
        assert sum(v.layer.row_strips for v in fused) == (39 if depthwise == "triton-rows"
                                                          else 0)
        # the blocks' ReLUs before them move into their load, and the 24 separable
        # convolutions before such a ReLU hand over their GEMM's raw output
        assert sum(v.layer.relu_in for v in fused) == (36 if triton else 0)
        assert sum(v.layer.raw_out for v in fp8) == (24 if triton else 0)
        convs = [m for m in body.modules() if isinstance(m, torch.nn.Conv2d)]
        assert convs and all(c.weight.dtype == torch.float16 and c.weight.is_contiguous(
            memory_format=torch.channels_last) for c in convs if c.weight.dim() == 4)
        got = outputs[depthwise] = _run(body, x, False, True).numpy()
        assert np.abs(got - ref).max() <= 0.02 * np.abs(ref).max(), depthwise
        assert (got.argmax(1) == ref.argmax(1)).all()
        assert np.abs(got - nhwc).max() <= 0.01 * np.abs(nhwc).max(), depthwise
    # the add in the GEMM's epilogue rounds as the separate add did: the Conv's output to
    # fp16, then the sum (only the epilogue's order of the two scale products differs);
    # with every block's skip in its epilogue (the 8 middle blocks' shortcut is the
    # identity), the same
    body = rewrite_channels_last(graphs_torch_model, torch.float16, fp8=xception_fp8,
                                 emulate=True, depthwise="triton-skip", triton_pointwise={
                                     (c, c, "skip"): (64, 64, 128, 4, 3, 8)
                                     for c in (128, 256, 728, 1024)})
    skips = [m for m in body.modules() if isinstance(m, SkipAddBlock)]
    assert len(skips) == 12 and sum(m.shortcut is None for m in skips) == 8
    every = _run(body, x, False, True).numpy()
    plain = outputs["triton"]
    for got in (outputs["triton-skip"], every):
        assert np.abs(got - plain).max() <= 2e-3 * np.abs(plain).max()
        assert (got.argmax(1) == plain.argmax(1)).all()


def test_fp16_gemm_outputs_in_the_family_s_form_stay_at_onnxruntime_s_result(
        graphs_fp8, graphs_torch_model, graphs_inputs, graphs_run, xception_fp8):
    """fp8_gemm "rowwise-fp16" in timm_xception's form (triton-skip, the family's Triton
    1x1 table): the GEMMs write fp16 with the fp16 bias, the depthwise kernels after them
    read that fp16 output in place, as they read bf16. On the H200 it ran 1.257x fp16
    against 1.232x under torch.compile (docs/measurements/h200-2026-12-04-c); here: the
    same top-1 as ONNX Runtime's fp8 graph, and no further from it than bf16 out (the
    graph's Conv writes fp16)."""
    from bundler.targets.torch_aoti.fp8_layers import Fp8Pointwise
    from bundler.targets.torch_aoti.model import rewrite_channels_last
    from bundler.targets.torch_aoti.nhwc_modules import DepthwiseE4m3

    x = torch.from_numpy(graphs_inputs["eval"][:4])
    ref = graphs_run(graphs_fp8, graphs_inputs["eval"][:4])
    table = load_family("timm_xception").target_settings("torch-aoti").fp8_triton_pointwise
    err = {}
    for gemm in ("rowwise", "rowwise-fp16"):
        body = rewrite_channels_last(graphs_torch_model, torch.float16, fp8=xception_fp8,
                                     emulate=True, depthwise="triton-skip",
                                     triton_pointwise=table, fp8_gemm=gemm)
        gemms = [m for m in body.modules() if isinstance(m, Fp8Pointwise)]
        assert len(gemms) == 43 and {m.gemm for m in gemms} == {gemm}
        assert sum(m.raw_out for m in gemms) == 24      # still handed over in place
        assert sum(isinstance(m, DepthwiseE4m3) for m in body.modules()) == 39
        got = _run(body, x, False, True).numpy()
        assert (got.argmax(1) == ref.argmax(1)).all(), gemm
        err[gemm] = float(np.abs(got - ref).max())
        assert err[gemm] <= 0.02 * np.abs(ref).max(), (gemm, err)
    assert err["rowwise-fp16"] <= err["rowwise"] * 1.05, err


def test_channels_last_fp8_depthwise_variant_quantizes_the_depthwise_layers(
        graphs_torch_model, graphs_inputs, xception_fp8):
    """fp8-depthwise in the channels_last form: the selected depthwise convolutions are
    quantized-dequantized as in the NHWC rewrite (``DepthwiseNHWC`` with its scales), so
    the two forms agree; a depthwise layer named as a dense FP8 one is refused by name."""
    from bundler.targets.torch_aoti.model import rewrite_channels_last, rewrite_nhwc
    from bundler.targets.torch_aoti.nhwc_modules import DepthwiseNHWC

    dw = [n for n, m in graphs_torch_model.named_modules()
          if isinstance(m, torch.nn.Conv2d) and m.groups > 1][:3]
    scales = {n: (0.05, np.full(graphs_torch_model.get_submodule(n).out_channels, 0.01,
                                np.float32)) for n in dw}
    x = torch.from_numpy(graphs_inputs["eval"][:2])
    body = rewrite_channels_last(graphs_torch_model, torch.float16, fp8=xception_fp8,
                                 fp8_depthwise=scales, emulate=True)
    quantized = [m for m in body.modules()
                 if isinstance(m, DepthwiseNHWC) and m.act_scale is not None]
    assert len(quantized) == 3
    nhwc = rewrite_nhwc(graphs_torch_model, torch.float16, fp8=xception_fp8,
                        fp8_depthwise=scales, emulate=True)
    a, b = _run(body, x, False, True), _run(nhwc, x, True)
    assert float((a - b).abs().max()) <= 0.01 * float(b.abs().max())
    with pytest.raises(UsageError, match="grouped convolution"):
        rewrite_channels_last(graphs_torch_model, torch.float16, fp8={dw[0]: scales[dw[0]]},
                              emulate=True)
    with pytest.raises(UsageError, match="depthwise form"):
        rewrite_channels_last(graphs_torch_model, torch.float16, depthwise="winograd")


def test_engine_model_builds_the_channels_last_fp8_form(graphs_torch_model, xception_fp8):
    """engine_model(channels_last=True) for fp8: the channels_last form, unpadded, with
    the shared ones column sized for the batch; channels_last with the NHWC rewrite, or an
    fp8 NCHW model, is refused."""
    from bundler.targets.torch_aoti import engine_model
    from bundler.targets.torch_aoti.fp8_layers import Fp8Pointwise

    module, padding = engine_model(graphs_torch_model, "fp8", xception_fp8, nhwc=False,
                                   channels_last=True, input_shape=(3, 299, 299),
                                   max_batch=4, fp8_gemm="rowwise-fp16")
    assert padding == {} and module.channels_last and not module.nhwc
    layers = [m for m in module.modules() if isinstance(m, Fp8Pointwise)]
    assert len(layers) == 43 and not any(m.padded_io for m in layers)
    assert {m._ones.rows for m in layers} == {4 * 150 * 150}    # the 150x150 entry block
    # the family's table of 1x1 layers for the Triton GEMM reaches the "triton-skip" form
    # (which refuses to build without one: a form that silently moved nothing)
    table = load_family("timm_xception").target_settings("torch-aoti").fp8_triton_pointwise
    module, _ = engine_model(graphs_torch_model, "fp8", xception_fp8, nhwc=False,
                             channels_last=True, depthwise="triton-skip", triton_pointwise=table)
    assert sum(m.triton_tiles is not None for m in module.modules()
               if isinstance(m, Fp8Pointwise)) == len(table) == 5
    with pytest.raises(UsageError, match="fp8_triton_pointwise"):
        engine_model(graphs_torch_model, "fp8", xception_fp8, nhwc=False,
                     channels_last=True, depthwise="triton-skip")
    with pytest.raises(UsageError, match="two forms"):
        engine_model(graphs_torch_model, "fp8", xception_fp8, nhwc=True, channels_last=True)
    with pytest.raises(UsageError, match="not the NCHW model"):
        engine_model(graphs_torch_model, "fp8", xception_fp8, nhwc=False)


def test_the_form_is_read_from_the_family_and_recorded(tmp_path):
    """family.json torch_aoti.fp8_layout picks the fp8 form (validated: a known name, and
    not together with fp8_conv triton-fused); the details say which form was built, and
    `bundle study` compares that before reusing a bundle."""
    from bundler.families import FamilyError
    from bundler.targets.torch_aoti.build import engine_details, engine_form, layout_description

    for layout, problem in (("channels_last", None), ("nchw", "fp8_layout"),
                            ("channels_last+fused", "a form of its own")):
        aoti = {"fp8_layout": layout.split("+")[0]}
        if layout.endswith("fused"):
            aoti["fp8_conv"] = "triton-fused"
        with families_path(_write_family(tmp_path / layout, "test_cl", aoti)):
            if problem is None:
                family = load_family("test_cl")
                assert family.target_settings("torch-aoti").fp8_layout == "channels_last"
                assert engine_form(family, "fp8") == "channels_last"
                assert engine_form(family, "fp16") == family.target_settings("torch-aoti").fp16_layout
                assert engine_form(family, "fp32") == "nchw"
            else:
                with pytest.raises(FamilyError, match=problem):
                    load_family("test_cl")
    assert engine_form(load_family("timm_resnet50"), "fp8", "triton-fused") == "channels_last"
    assert engine_form(load_family("timm_vit_base"), "fp8") == "as_is"
    text = layout_description("fp8", nhwc=False, channels_last=True)
    assert "NHWC view" in text
    assert layout_description("fp8", nhwc=False, channels_last=True,
                              fp8_conv="triton-fused") == "channels_last (the model as it is)"
    assert layout_description("fp8", nhwc=True, pad_channels=True).startswith("nhwc, channels padded")
    details = engine_details({}, "fp8", {}, nhwc=False, fast_accum=False, padding={},
                             batch_sizes=[1], seconds=None, channels_last=True)
    assert details["compile_options"]["layout"] == text


def test_small_static_graphs_may_be_the_nhwc_rewrite():
    """torch_aoti.small_batch_layout "nhwc": the static graphs of <= 8 images are the
    NHWC rewrite where the precision's form is channels_last (recorded, and compared by
    the study); nothing changes for other forms, larger static sizes or "same"."""
    from bundler.targets.torch_aoti.build import small_batch_form

    text = small_batch_form("nhwc", "fp8", [1, 32], channels_last=True)
    assert text == "nhwc, channels padded to multiples of 16 (static graphs of batch 1)"
    assert small_batch_form("nhwc", "fp16", [1, 2, 32], channels_last=True) == \
        "nhwc (static graphs of batch 1, 2)"
    assert small_batch_form("nhwc", "fp16", [32], channels_last=True) is None
    assert small_batch_form("same", "fp16", [1], channels_last=True) is None
    assert small_batch_form("nhwc", "fp16", [1], channels_last=False) is None
    assert small_batch_form("nhwc", "fp8", [1], channels_last=True,
                            fp8_conv="triton-fused") is None
    assert small_batch_form("nhwc", "fp32", [1], channels_last=True) is None
    with pytest.raises(UsageError, match="small-batch layout"):
        small_batch_form("nchw", "fp16", [1], channels_last=True)
    assert load_family("timm_resnet50").target_settings("torch-aoti").small_batch_layout == "same"


def test_the_depthwise_form_is_read_from_the_family_recorded_and_compared(tmp_path):
    """family.json torch_aoti.fp8_depthwise (cudnn, slices, triton; a form of the
    channels_last fp8 model only) reaches the layout description the build records, so
    that `bundle study` rebuilds a bundle of another depthwise form; cuDNN's, the form
    before it had a name, reads as before."""
    from bundler.families import FamilyError
    from bundler.targets.torch_aoti.build import engine_details, layout_description

    xception = load_family("timm_xception")
    # H200: "triton" 1.32x cuDNN + quantize; "triton-skip" 0.05 ms less at batch 32
    assert xception.target_settings("torch-aoti").fp8_depthwise == "triton-skip"
    for form, layout, problem in (("cudnn", "channels_last", None),
                                  ("triton", "channels_last", None),
                                  ("winograd", "channels_last", "must be one of"),
                                  ("triton", "nhwc", "form of the channels_last fp8 model")):
        root = _write_family(tmp_path / f"{form}-{layout}", "test_dw",
                             {"fp8_layout": layout, "fp8_depthwise": form},
                             drop=("fp8_triton_pointwise",))     # triton-skip's (below)
        with families_path(root):
            if problem is None:
                assert load_family("test_dw").target_settings("torch-aoti").fp8_depthwise == form
            else:
                with pytest.raises(FamilyError, match=problem):
                    load_family("test_dw")
    # "triton-skip" reads the family's table of 1x1 layers for the Triton GEMM: it needs
    # one, only it reads one, and each entry is checked
    entry = {"in": 64, "out": 128, "epilogue": "raw", "tiles": [64, 128, 64, 4, 4, 8]}
    for case, (form, table, problem) in enumerate((
            ("triton-skip", [entry], None),
            ("triton-skip", None, "triton-skip needs this table"),
            ("triton", [entry], "read by fp8_depthwise triton-skip only"),
            ("triton-skip", [], "non-empty list"),
            ("triton-skip", [{**entry, "epilogue": "relu"}], r"fp8_triton_pointwise\[0\]"),
            ("triton-skip", [{**entry, "tiles": [64, 128]}], r"fp8_triton_pointwise\[0\]"),
            ("triton-skip", [entry, entry], "listed twice"))):
        aoti = {"fp8_depthwise": form}
        if table is not None:
            aoti["fp8_triton_pointwise"] = table
        root = _write_family(tmp_path / f"table-{case}", "test_dw", aoti,
                             drop=("fp8_triton_pointwise",))
        with families_path(root):
            if problem is None:
                assert load_family("test_dw").target_settings("torch-aoti").fp8_triton_pointwise == {
                    (64, 128, "raw"): (64, 128, 64, 4, 4, 8)}
            else:
                with pytest.raises(FamilyError, match=problem):
                    load_family("test_dw")
    # each setting is checked on its own: both problems are reported
    root = _write_family(tmp_path / "both", "test_dw",
                         {"fp8_layout": "channels_last", "fp8_conv": "triton-fused",
                          "fp8_depthwise": "winograd"})
    with families_path(root), pytest.raises(FamilyError) as info:
        load_family("test_dw")
    assert any("a form of its own" in p for p in info.value.problems), info.value.problems
    assert any("fp8_depthwise: must be one of" in p for p in info.value.problems)
    before = "channels_last (the model as it is), FP8 layers on the NHWC view of their input"
    assert layout_description("fp8", nhwc=False, channels_last=True) == before
    texts = {d: layout_description("fp8", nhwc=False, channels_last=True, depthwise=d)
             for d in ("cudnn", "slices", "triton", "triton-rows", "triton-skip")}
    assert texts["cudnn"] == before and len(set(texts.values())) == 5
    assert "Triton kernel writing its e4m3 rows" in texts["triton"]
    details = engine_details({}, "fp8", {}, nhwc=False, fast_accum=False, padding={},
                             batch_sizes=[1], seconds=None, channels_last=True,
                             depthwise="triton")
    assert details["compile_options"]["layout"] == texts["triton"]


def test_the_pointwise_benchmark_measures_the_layers_the_engine_has(graphs_torch_model,
                                                                    xception_fp8):
    """benchmarks/pointwise_kernel_bench.py's layer list (whose measurements fill the
    family's ``torch_aoti.fp8_triton_pointwise``) is timm_xception's stride-1 FP8 1x1
    layers with the epilogue the channels_last "triton" form gives each: read off that
    form here, at 299x299."""
    from collections import Counter

    from benchmark_modules import load_benchmark
    from bundler.targets.torch_aoti.fp8_layers import Fp8Pointwise
    from bundler.targets.torch_aoti.model import rewrite_channels_last
    from bundler.targets.torch_aoti.nhwc_modules import SkipAddBlock

    bench = load_benchmark("pointwise_kernel_bench")
    body = rewrite_channels_last(graphs_torch_model, torch.float16, fp8=xception_fp8,
                                 emulate=True, depthwise="triton")
    last = {id(m.stack[-1].conv_pw.layer) for m in body.modules() if SkipAddBlock.applies(m)}
    sides = {}

    def side(mod, inp, _out) -> None:            # the NHWC input's map side
        sides[id(mod)] = inp[0].shape[1]

    hooks = [m.register_forward_hook(side) for m in body.modules()
             if isinstance(m, Fp8Pointwise)]
    _run(body, torch.zeros(1, 3, 299, 299), False, True)
    for h in hooks:
        h.remove()
    found = Counter()
    for m in body.modules():
        if isinstance(m, Fp8Pointwise) and m.stride == (1, 1):
            kind = "raw" if m.raw_out else "skip" if id(m) in last else "relu"
            found[(m.cin, m.cout, sides[id(m)], kind)] += 1
    assert found == Counter({(a, b, s, k): n for a, b, s, k, n in bench.XCEPTION_POINTWISE})
    # the table names only layers the engine has, with an epilogue they have
    table = load_family("timm_xception").target_settings("torch-aoti").fp8_triton_pointwise
    assert table and set(table) <= {(a, b, k) for a, b, _s, k in found}
