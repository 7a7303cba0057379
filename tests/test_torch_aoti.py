"""torch-aoti: target naming, compatibility decisions, details, the FP8 rewrite's math.

CPU-only tests check behaviour that does not need a GPU: which host may run a package and
what it is told otherwise, the manifest details against the schema, that every
convolution the FP8 recipe selects in the ONNX graph is found in the torch model, that
the FP8 module computes what dequantized FP8 operands give, and that the whole rewritten
model agrees with ONNX Runtime on the fp8 graph. GPU tests build real packages; they are
marked ``gpu`` and skip (with the reason) where torch sees no CUDA device.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from runtime_py.compat import GpuInfo, HostInfo, check_target
from runtime_py.engines.torch_aoti_compat import check_torch_aoti_target
from runtime_py.errors import (BundleError, CompatibilityError, EngineUnavailableError,
                               InferenceInputError, UsageError)

torch = pytest.importorskip("torch")
import cpu_fp8_gemm  # noqa: E402

CUDA = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not CUDA, reason="needs torch with a CUDA GPU (none visible)")

H200 = GpuInfo("NVIDIA H200", (9, 0))
BUILT = {"torch_version": "2.11.0+cu130", "cuda_version": "13.0", "compute_capability": "9.0",
         "device_name": "NVIDIA H200", "device": "cuda", "compile_options": {}}


def host(torch_version="2.11.1", cuda="13.0", gpus=(H200,)) -> HostInfo:
    return HostInfo(gpus=tuple(gpus), torch_version=torch_version, torch_cuda_version=cuda)


# --- naming and registration ------------------------------------------------------------

def test_target_is_registered_and_named():
    from bundler.families import load_family
    from bundler.targets import TARGETS, TargetBuild, bundle_name, target_builder

    assert "torch-aoti" in TARGETS
    builder = target_builder("torch-aoti")
    assert callable(builder.build_target) and callable(builder.check_host)
    family = load_family("timm_xception")
    assert bundle_name(family.name, family.version, "fp8", "fp8-depthwise",
                       TargetBuild("torch-aoti", "engine.pt2", b"", {}, "torch-aoti").tag) == \
        "timm_xception-fp8-depthwise-1.0.0-torch-aoti"


def test_runtime_imports_no_torch():
    code = ("import sys, runtime_py, runtime_py.engines.torch_aoti, runtime_py.compat; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_max_autotune_is_refused():
    from bundler.targets.torch_aoti import compile_options_for

    # and pointwise block sizes are not timed while compiling (a shared GPU picks slow ones)
    assert compile_options_for(None) == {"max_autotune": False,
                                         "triton.autotune_pointwise": False}
    with pytest.raises(UsageError, match="max_autotune"):
        compile_options_for({"max_autotune": True})


# --- compatibility ----------------------------------------------------------------------

def test_same_minor_cuda_major_and_cc_run():
    check_torch_aoti_target(BUILT, host())
    check_target({"backend": "torch-aoti", "details": BUILT}, host())


def test_missing_torch_or_gpu_is_unavailable():
    with pytest.raises(EngineUnavailableError, match="torch is not installed"):
        check_torch_aoti_target(BUILT, host(torch_version=None))
    with pytest.raises(EngineUnavailableError, match="no GPU"):
        check_torch_aoti_target(BUILT, host(gpus=()))
    with pytest.raises(EngineUnavailableError, match="GPU 1 was asked for"):
        check_torch_aoti_target(BUILT, host(), device=1)


def test_every_mismatch_is_named():
    ada = GpuInfo("NVIDIA L4", (8, 9))
    with pytest.raises(CompatibilityError) as err:
        check_torch_aoti_target(BUILT, host(torch_version="2.12.0", cuda="12.8", gpus=(ada,)))
    problems = err.value.problems
    assert "torch 2.11 != 2.12" in problems
    assert any(p.startswith("CUDA 13 != 12") for p in problems)
    assert any("sm_90 != sm_89" in p and "NVIDIA L4" in p for p in problems)
    message = str(err.value)
    assert "built for sm_90 with CUDA 13.0 with torch 2.11" in message
    assert "bundle rebuild BUNDLE --backend torch-aoti" in message


def test_cuda_minor_differences_and_cpu_packages_pass():
    check_torch_aoti_target(BUILT, host(cuda="13.2"))
    cpu = {**BUILT, "device": "cpu", "cuda_version": None, "compute_capability": None}
    check_torch_aoti_target(cpu, host(gpus=(), cuda=None))
    with pytest.raises(CompatibilityError, match="built for the CPU with torch 2.11") as err:
        check_torch_aoti_target(cpu, host(torch_version="2.9.0", gpus=()))
    assert err.value.problems == ["torch 2.11 != 2.9"]


def test_cpu_only_torch_cannot_run_a_cuda_package():
    with pytest.raises(CompatibilityError, match=r"CUDA none \(CPU-only torch\)") as err:
        check_torch_aoti_target(BUILT, host(cuda=None))
    assert any("CPU-only build" in p for p in err.value.problems)


# --- details ----------------------------------------------------------------------------

def _details_validator():
    import jsonschema

    from runtime_py.schemas import load_schema

    defs = load_schema("manifest")["$defs"]
    return jsonschema.Draft202012Validator({"$defs": defs, "$ref": "#/$defs/torch_aoti_details"})


@pytest.mark.parametrize("precision", ["fp32", "fp16", "fp8"])
def test_details_follow_the_schema(precision):
    from bundler.targets.torch_aoti import engine_details, host_details

    padding = {"blocks.3.stack.conv1.conv_pw": {"in": [728, 736], "out": [728, 736]}}
    for built_on in (host_details("cpu"), {k: BUILT[k] for k in
                                           ("torch_version", "cuda_version",
                                            "compute_capability", "device_name", "device")}):
        details = engine_details(built_on, precision, {"max_autotune": False},
                                 nhwc=precision == "fp8", fast_accum=False,
                                 padding=padding if precision == "fp8" else {},
                                 batch_sizes=[1, 32], seconds=61.4)
        errors = [e.message for e in _details_validator().iter_errors(details)]
        assert errors == []
        assert details["batch_sizes"] == [1, 32] and details["build_seconds"] == "61.4"
        assert ("fp8_padding" in details) == (precision == "fp8")
        assert not any(isinstance(v, float) for v in details.values())


def test_fp8_details_name_the_gemm_mode():
    from bundler.targets.torch_aoti import engine_details, host_details

    for gemm, words in (("rowwise", "rowwise scales"), ("tensorwise", "tensorwise scales")):
        details = engine_details(host_details("cpu"), "fp8", {}, nhwc=True, fast_accum=False,
                                 padding={}, batch_sizes=[1], seconds=None, fp8_gemm=gemm)
        assert words in details["compile_options"]["fp8_gemm"]


def test_fp16_and_fp8_engines_are_nhwc_by_default_fp32_is_not():
    from bundler.targets.torch_aoti import default_nhwc, default_pad_channels, engine_model

    assert default_nhwc("fp16") and default_nhwc("fp8") and not default_nhwc("fp32")
    assert not default_nhwc("fp16", False) and default_nhwc("fp32", True)
    # fp8 carries FP8-aligned channel counts through the model (run D on the H200); the
    # others keep the model's
    assert default_pad_channels("fp8") and not default_pad_channels("fp16")
    assert not default_pad_channels("fp32") and not default_pad_channels("fp8", False)
    model = _tiny_model()
    x = torch.randn(2, 3, 16, 16)
    for precision, nhwc in (("fp16", True), ("fp32", False)):
        module, _padding = engine_model(model, precision)
        assert module.nhwc is nhwc
        if precision == "fp32":
            assert torch.allclose(module(x), model(x), atol=1e-6)


def test_host_details_without_a_gpu():
    from bundler.targets.torch_aoti import check_host, host_details

    d = host_details("cpu")
    assert d["device"] == "cpu" and d["cuda_version"] is None and d["compute_capability"] is None
    assert d["torch_version"] == torch.__version__
    check_host(device="cpu", precision="fp32")
    with pytest.raises(UsageError, match="fp32 only"):
        check_host(device="cpu", precision="fp16")
    if not CUDA:
        with pytest.raises(EngineUnavailableError, match="sees none"):
            check_host(device="cuda", precision="fp16")


# --- which layers ---------------------------------------------------------------------------

def test_every_selected_conv_maps_to_a_module(graphs_fp32, graphs_family, graphs_torch_model):
    from bundler.graphs.fp8 import select_fp8_layers
    from bundler.targets.torch_aoti.model import map_nodes_to_modules

    modules = dict(graphs_torch_model.named_modules())
    for variant, count in ((None, 43), ("fp8-depthwise", 82)):
        selected = select_fp8_layers(graphs_fp32, graphs_family, variant)
        paths = map_nodes_to_modules(graphs_torch_model, selected)
        assert len(paths) == len(selected) == count
        for node, path in paths.items():
            conv = modules[path]
            assert isinstance(conv, torch.nn.Conv2d)
            assert conv.kernel_size == (1, 1) or conv.groups == conv.in_channels > 1


def test_nodes_map_by_weights_when_names_differ(graphs_fp32, graphs_selected, graphs_torch_model):
    from onnx import numpy_helper

    from bundler.targets.torch_aoti.model import map_nodes_to_modules

    inits = {i.name: numpy_helper.to_array(i) for i in graphs_fp32.graph.initializer}
    node = graphs_selected[5]
    renamed = {f"Conv_{i}": inits[f"{n}.weight"] for i, n in enumerate([node])}
    assert map_nodes_to_modules(graphs_torch_model, list(renamed), renamed) == {"Conv_0": node}
    with pytest.raises(UsageError, match="match no layer"):
        map_nodes_to_modules(graphs_torch_model, ["nowhere"])


def _layers(graph, act_scales, weight_scales):
    """node -> (activation scale, weight scales), as make hands them to the target."""
    from bundler.build_context import fp8_layers

    layers = fp8_layers(graph, list(weight_scales), act_scales, weight_scales)
    return {n: (layer.act_scale, layer.weight_scales) for n, layer in layers.items()}


def test_fp8_layers_name_the_same_tensors_in_the_fp16_and_fp8_graphs(
        graphs_fp8, graphs_fp16, graphs_act_scales, graphs_weight_scales):
    from bundler.build_context import fp8_layers

    selected = list(graphs_weight_scales)
    in_fp8 = fp8_layers(graphs_fp8, selected, graphs_act_scales, graphs_weight_scales)
    in_fp16 = fp8_layers(graphs_fp16, selected, graphs_act_scales, graphs_weight_scales)
    assert len(in_fp8) == 43 and in_fp8.keys() == in_fp16.keys()
    assert all(in_fp8[n].tensor == in_fp16[n].tensor for n in selected)
    assert {layer.tensor for layer in in_fp8.values()} == set(graphs_act_scales)
    fewer = dict(list(graphs_act_scales.items())[1:])
    with pytest.raises(UsageError, match="no fp8 scale"):
        fp8_layers(graphs_fp8, selected, fewer, graphs_weight_scales)


# --- the FP8 module's math ------------------------------------------------------------------

@pytest.mark.parametrize("cin,cout,stride", [(728, 728, 1), (256, 728, 2), (64, 128, 1)])
def test_fp8_pointwise_is_dequantized_fp8_math(cin, cout, stride):
    from bundler.targets.torch_aoti import fp8_layers as tam
    from bundler.targets.torch_aoti.fp8_layers import fake_quant_reference, padded

    gen = torch.Generator().manual_seed(cin + cout)
    conv = torch.nn.Conv2d(cin, cout, 1, stride=stride, bias=True)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen) * 0.05)
        conv.bias.copy_(torch.randn(cout, generator=gen) * 0.1)
    x = torch.randn(2, 9, 9, cin, generator=gen).relu().half()
    act_scale = float(x.float().abs().max()) / 448
    w_scale = conv.weight.detach().reshape(cout, -1).abs().amax(1).numpy() / 448
    module = tam.Fp8Pointwise(conv, act_scale, w_scale, torch.float16, emulate=True)
    assert tuple(module.weight_fp8.shape) == (padded(cout), padded(cin))
    assert module.weight_fp8.view(torch.uint8)[cout:].sum() == 0    # zero padding rows
    assert module.weight_fp8.view(torch.uint8)[:, cin:].sum() == 0  # and columns
    got = module(x).float()
    xs = x[:, ::stride, ::stride, :].float()
    ref = fake_quant_reference(xs, conv.weight.detach().reshape(cout, cin), conv.bias.detach(),
                               act_scale, w_scale)
    assert got.shape == ref.shape
    # fp16 output rounding only: both sides multiply the same FP8 operands
    assert float((got - ref).abs().max()) <= 2e-3 * float(ref.abs().max())


def _rowwise(gemm: str):
    """A GEMM-mode parameter that needs a CPU _scaled_mm with rowwise scales."""
    return pytest.param(gemm, marks=pytest.mark.skipif(not cpu_fp8_gemm.rowwise_runs(),
                                                       reason=cpu_fp8_gemm.ROWWISE_REASON))


@pytest.mark.parametrize("gemm", [_rowwise("rowwise"), _rowwise("rowwise-shared-ones"),
                                  "tensorwise", _rowwise("rowwise-fp16"),
                                  _rowwise("rowwise-fp16-shared-ones"), "dequantized"])
def test_fp8_pointwise_real_scaled_mm_matches_the_reference(gemm):
    """Every GEMM mode through torch._scaled_mm itself (the CPU kernel here, cuBLASLt on a
    GPU), or the fp16 GEMM of the dequantized operands: scales and bias in the epilogue or
    after it give the dequantized FP8 product; rowwise also with the activation scale folded
    into the weight-scale row and a slice of a shared column of ones as the row scale. The
    fp16-out modes round the output once, as the fp16 graph does: 8x tighter than bf16."""
    from bundler.targets.torch_aoti import fp8_layers as tam
    from bundler.targets.torch_aoti.fp8_layers import fake_quant_reference

    gen = torch.Generator().manual_seed(7)
    conv = torch.nn.Conv2d(728, 728, 1, bias=True)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen) * 0.05)
        conv.bias.copy_(torch.randn(728, generator=gen))
    x = torch.randn(2, 5, 5, 728, generator=gen).relu().half()
    act_scale = float(x.float().abs().max()) / 448
    w_scale = conv.weight.detach().reshape(728, -1).abs().amax(1).numpy() / 448
    ones = tam.OnesColumn(64) if gemm.endswith("-shared-ones") else None
    module = tam.Fp8Pointwise(conv, act_scale, w_scale, torch.float16,
                                        gemm=gemm.removesuffix("-shared-ones"), ones=ones)
    assert (module.ones_col is not None) == (ones is not None)
    got = module(x).float()
    ref = fake_quant_reference(x.float(), conv.weight.detach().reshape(728, 728),
                               conv.bias.detach(), act_scale, w_scale)
    assert got.shape == ref.shape == (2, 5, 5, 728)
    bound = 5e-4 if "fp16" in gemm or gemm == "dequantized" else 4e-3
    # bf16 rounding of the GEMM output (2^-9 relative), then fp16; or fp16 rounding only
    assert float((got - ref).abs().max()) <= bound * float(ref.abs().max())


def test_small_static_batches_run_the_pointwise_dequantized_and_others_the_fp8_gemm():
    """``small_batch_kernel="dequantized"``: a batch of at most ``SMALL_BATCH`` that is a
    plain int (eager, or a graph traced for a static batch) takes the dequantized fp16 GEMM
    on the same FP8 operands, bit for bit the "dequantized" mode's output; a larger one, or
    a symbolic batch (the dynamic graph), the FP8 GEMM of the layer's own mode."""
    from bundler.targets.torch_aoti import fp8_layers as tam

    gen = torch.Generator().manual_seed(3)
    conv = torch.nn.Conv2d(40, 24, 1, stride=2)
    w_scale = conv.weight.detach().reshape(24, -1).abs().amax(1).numpy() / 448
    make = lambda **kw: tam.Fp8Pointwise(conv, 0.05, w_scale, torch.float16, **kw)  # noqa: E731
    gemm = cpu_fp8_gemm.gemm_mode_that_runs_here()
    small = make(gemm=gemm, small_batch_kernel="dequantized")
    dequantized, fp8 = make(gemm="dequantized"), make(gemm=gemm)
    for n in (1, tam.SMALL_BATCH, tam.SMALL_BATCH + 1):
        x = torch.randn(n, 9, 9, 40, generator=gen).half()
        want = dequantized(x) if n <= tam.SMALL_BATCH else fp8(x)
        assert torch.equal(small(x), want), n
    assert not torch.equal(dequantized(x), fp8(x))        # the two forms are told apart
    # a symbolic batch (torch.export with a dynamic batch) keeps the FP8 GEMM
    calls = []
    small.dequantized_matmul = lambda q: calls.append("dequantized")
    from torch.export import Dim, export
    export(small, (torch.randn(2, 9, 9, 40).half(),),
           dynamic_shapes=({0: Dim("batch", min=1, max=32)},))
    assert calls == []
    # the emulated form (hosts without FP8 GEMMs) has no small-batch form
    assert make(emulate=True, small_batch_kernel="dequantized").small_batch_kernel == "gemm"


def test_fp8_pointwise_refuses_an_unknown_gemm_mode():
    from bundler.targets.torch_aoti import fp8_layers as tam

    conv = torch.nn.Conv2d(16, 16, 1)
    with pytest.raises(UsageError, match="fp8 GEMM mode 'blockwise'"):
        tam.Fp8Pointwise(conv, 0.01, np.full(16, 0.01), torch.float16, gemm="blockwise")


@pytest.mark.parametrize("gemm", ["rowwise", "tensorwise", "rowwise-fp16", "dequantized"])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("stride", [1, 2])
def test_fp8_pointwise_gives_scaled_mm_row_major_operands(batch, stride, gemm):
    """The real (not emulated) path on meta tensors: torch's shape/layout rules for
    _scaled_mm run without a GPU. The input is an NHWC view of NCHW memory, as the engine
    module hands it over; at batch 1 a plain reshape of it is column-major, which
    _scaled_mm refuses (found compiling on an H200)."""
    from bundler.targets.torch_aoti import fp8_layers as tam

    conv = torch.nn.Conv2d(64, 128, 1, stride=stride, bias=True)
    w_scale = conv.weight.detach().reshape(128, -1).abs().amax(1).numpy() / 448
    module = tam.Fp8Pointwise(conv, 0.01, w_scale, torch.float16, gemm=gemm).to("meta")
    x = torch.empty(batch, 64, 16, 16, device="meta", dtype=torch.float16).permute(0, 2, 3, 1)
    y = module(x)
    assert tuple(y.shape) == (batch, 16 // stride, 16 // stride, 128)


def _three_convs():
    """stem 3x3 stride 2, then two 1x1 convolutions (the second strided): on 3x33x33 their
    outputs are 16x16, 16x16 and 8x8 pixels."""
    with torch.random.fork_rng(devices=[]):   # seeded here, the global RNG left as it was
        torch.manual_seed(5)
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, stride=2), torch.nn.ReLU(), torch.nn.Conv2d(32, 48, 1),
            torch.nn.ReLU(), torch.nn.Conv2d(48, 40, 1, stride=2), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(40, 5)).eval()


def test_fp8_gemm_rows_is_the_largest_gemm_for_the_largest_batch():
    from bundler.targets.torch_aoti.model import fp8_gemm_rows

    model = _three_convs()
    assert fp8_gemm_rows(model, ["2", "4"], (3, 33, 33), 4) == 4 * 16 * 16
    assert fp8_gemm_rows(model, ["4"], (3, 33, 33), 3) == 3 * 8 * 8
    assert fp8_gemm_rows(model, [], (3, 33, 33), 3) == 0
    assert next(model.parameters()).device.type == "cpu"     # the probe is a copy
    with pytest.raises(UsageError, match="not in the model"):
        fp8_gemm_rows(model, ["9"], (3, 33, 33), 1)


@pytest.mark.skipif(not cpu_fp8_gemm.rowwise_runs(), reason=cpu_fp8_gemm.ROWWISE_REASON)
def test_fp8_gemms_share_one_ones_column_through_to_export_and_aoti(tmp_path):
    """One column for all GEMMs: the same tensor in every module, still one after
    ``module.to``, lifted once by torch.export, compiled into a package that runs at the
    dynamic batch sizes; the same numbers as a column per GEMM; a larger batch refused."""
    from bundler.targets.torch_aoti.model import fp8_gemm_rows, rewrite_nhwc
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule

    model = _three_convs()
    fp8 = {"2": (0.01, np.full(48, 0.002)), "4": (0.01, np.full(40, 0.002))}
    rows = fp8_gemm_rows(model, list(fp8), (3, 33, 33), 4)
    shared = EngineModule(rewrite_nhwc(model, torch.float16, fp8=fp8, fp8_rows=rows),
                          torch.float16, True)
    per_gemm = EngineModule(rewrite_nhwc(model, torch.float16, fp8=fp8), torch.float16, True)
    gemms = [m for m in shared.modules() if type(m).__name__ == "Fp8Pointwise"]
    assert len(gemms) == 2 and gemms[0].ones_col is gemms[1].ones_col
    assert tuple(gemms[0].ones_col.shape) == (rows, 1)
    moved = copy.deepcopy(shared).to("meta")
    moved = [m.ones_col for m in moved.modules() if type(m).__name__ == "Fp8Pointwise"]
    assert moved[0].device.type == "meta" and moved[0] is moved[1]
    assert gemms[0].ones_col.device.type == "cpu"
    assert all(m.ones_col is None for m in per_gemm.modules() if type(m).__name__ == "Fp8Pointwise")

    x = torch.randn(3, 3, 33, 33, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(shared(x), per_gemm(x))
        # one graph under Dynamo too (torch.compile, the Inductor benchmark): the row check
        # once broke it into one graph per GEMM, with the quantizes run eagerly in between
        dynamic = x.clone()
        torch._dynamo.mark_dynamic(dynamic, 0)
        explained = torch._dynamo.explain(shared)(dynamic)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), \
            explained.break_reasons
        with pytest.raises(UsageError, match="more than the FP8 GEMMs' 1024"):
            shared(torch.randn(5, 3, 33, 33))
    program = torch.export.export(shared, (x,), dynamic_shapes=(
        {0: torch.export.Dim("batch", min=1, max=4)},))
    lifted = program.graph_signature.inputs_to_lifted_tensor_constants
    assert [v for v in lifted.values() if v.endswith("ones_col")] == ["body.2.ones_col"]
    path = torch._inductor.aoti_compile_and_package(program,
                                                    package_path=str(tmp_path / "m.pt2"))
    package = torch._inductor.aoti_load_package(path)
    with torch.no_grad():
        for n in (1, 4):
            xn = torch.randn(n, 3, 33, 33, generator=torch.Generator().manual_seed(n))
            assert torch.allclose(package(xn), per_gemm(xn), rtol=0, atol=1e-2)


def test_depthwise_taps_equal_convolution():
    from bundler.targets.torch_aoti import nhwc_modules as tam

    gen = torch.Generator().manual_seed(3)
    for stride in (1, 2):
        conv = torch.nn.Conv2d(16, 16, 3, stride=stride, padding=1, groups=16, bias=True)
        x = torch.randn(2, 16, 11, 11, generator=gen)
        module = tam.DepthwiseNHWC(conv, torch.float32)
        got = module(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        assert torch.allclose(got, conv(x).detach(), atol=1e-5)


def test_rewrite_refuses_modules_it_cannot_lay_out():
    from bundler.targets.torch_aoti.model import rewrite_nhwc

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8))
    with pytest.raises(UsageError, match="BatchNorm2d has no NHWC form"):
        rewrite_nhwc(model, torch.float16)


def test_rewritten_fp8_model_matches_onnxruntime(graphs_fp8, graphs_family, graphs_torch_model,
                                                 graphs_act_scales, graphs_weight_scales,
                                                 graphs_inputs, graphs_run):
    """The whole fp8 engine model (FP8 GEMMs emulated in fp32 on the CPU) against ONNX
    Runtime on the bundle's fp8 graph: same selection, same scales, same FP8 operands."""
    from bundler.targets.torch_aoti.model import map_nodes_to_modules, rewrite_nhwc
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule

    layers = _layers(graphs_fp8, graphs_act_scales, graphs_weight_scales)
    paths = map_nodes_to_modules(graphs_torch_model, list(layers))
    body = rewrite_nhwc(graphs_torch_model, torch.float16,
                        fp8={paths[n]: s for n, s in layers.items()}, emulate=True)
    model = EngineModule(body, torch.float16, True)
    x = graphs_inputs["eval"]
    with torch.no_grad():
        got = model(torch.from_numpy(x)).numpy()
    ref = graphs_run(graphs_fp8, x)
    assert np.abs(got - ref).max() <= 0.02 * np.abs(ref).max()
    assert (got.argmax(1) == ref.argmax(1)).all()


def test_padded_channels_compute_the_same_model(graphs_fp8, graphs_family, graphs_torch_model,
                                                graphs_act_scales, graphs_weight_scales,
                                                graphs_inputs):
    """728 channels carried as 736 (zeros) through the blocks: the fp32 rewrite still equals
    the model, and the fp8 engine model gives what the unpadded one gives."""
    from bundler.targets.torch_aoti import engine_model
    from bundler.targets.torch_aoti.model import check_rewrite, map_nodes_to_modules, rewrite_nhwc
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule

    x = torch.from_numpy(graphs_inputs["eval"][:2])
    assert check_rewrite(graphs_torch_model, x, pad_channels=True) < 1e-5
    body = rewrite_nhwc(graphs_torch_model, torch.float32, pad_channels=True)
    widths = {int(m.weight.shape[-1]) for m in body.modules() if type(m).__name__ == "DepthwiseNHWC"}
    assert 736 in widths and 728 not in widths
    layers = _layers(graphs_fp8, graphs_act_scales, graphs_weight_scales)
    paths = map_nodes_to_modules(graphs_torch_model, list(layers))
    fp8 = {paths[n]: s for n, s in layers.items()}
    outs = []
    for pad in (False, True):
        model = EngineModule(rewrite_nhwc(graphs_torch_model, torch.float16, fp8=fp8, emulate=True,
                                          pad_channels=pad), torch.float16, True)
        with torch.no_grad():
            outs.append(model(x).float())
    assert float((outs[0] - outs[1]).abs().max()) <= 1e-3 * float(outs[0].abs().max())
    with pytest.raises(UsageError, match="padded channels are a form of the NHWC rewrite"):
        engine_model(graphs_torch_model, "fp16", nhwc=False, pad_channels=True)


# --- packaging ------------------------------------------------------------------------------

class _MemoryBundle:
    """The parts of a Bundle a runner reads, for a package built in the test."""

    def __init__(self, precision, details, package, shape, classes, batch_max,
                 input_dtype="float32"):
        self.manifest = {
            "precision": precision, "batch": {"min": 1, "opt": 1, "max": batch_max},
            "engine": {"backend": "torch-aoti", "member": "engine.pt2", "details": details},
            "inputs": [{"name": "input", "dtype": input_dtype, "shape": ["batch", *shape]}],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", classes]}]}
        self.package = package
        self.path = SimpleNamespace(name="memory.bundle")

    def read_member(self, name):
        assert name == "engine.pt2"
        return self.package


def _tiny_model():
    with torch.random.fork_rng(devices=[]):   # seeded here, the global RNG left as it was
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 16, 3, padding=1, groups=16), torch.nn.Conv2d(16, 32, 1),
            torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
            torch.nn.Linear(32, 10)).eval().requires_grad_(False)


needs_cxx = pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None,
    reason="AOTInductor on the CPU compiles C++: no C++ compiler on this host")


@pytest.fixture(scope="module")
def cpu_fp32_package():
    """The tiny model's fp32 CPU package with static graphs of batch 2 and 4 (and the
    dynamic one), compiled once for the tests that run it (~25 s of C++ on 2 cores)."""
    from bundler.targets.torch_aoti import build_engine

    return build_engine(_tiny_model(), "fp32", (3, 16, 16), {"min": 1, "max": 4},
                        device="cpu", batch_sizes=[1, 4], static_batches=[4, 2])


@pytest.mark.slow
@needs_cxx
def test_fp32_package_on_the_cpu_runs_in_the_runner(cpu_fp32_package):
    """AOTInductor packages fp32 for the CPU (minutes on 2 cores: it compiles C++)."""
    from runtime_py.engines.torch_aoti import TorchAotiRunner

    model = _tiny_model()
    package, details = cpu_fp32_package
    assert package[:2] == b"PK"                      # a zip archive: code, .so, no pickle
    assert details["device"] == "cpu" and details["batch_sizes"] == [1, 4]
    runner = TorchAotiRunner(_MemoryBundle("fp32", details, package, (3, 16, 16), 10, 4))
    x = np.random.default_rng(0).normal(size=(3, 3, 16, 16)).astype(np.float32)
    with runner:
        got = runner.infer({"input": x})["logits"]
        assert runner.device_timings(1, 1, 0) == {}   # no device side: study times infer
        assert runner.on_gpu is False                  # `bundle bench`: no copies to time
        # where the load went, each phase once, in the order it ran (prepare_bench prints it)
        assert list(runner.load_seconds) == [
            "package member", "torch import", "host check", "device and stream",
            "load checks", "graphs", "streams and slots"]
        assert all(s >= 0 for s in runner.load_seconds.values())
        assert runner.load_seconds["graphs"] > 0       # dlopen of a compiled .so
    ref = model(torch.from_numpy(x)).numpy()
    assert np.abs(got - ref).max() < 1e-4
    from bundler.targets.torch_aoti.toolchain import torch_compiler
    assert details["compile_options"]["cxx"].startswith(torch_compiler())  # recorded


@pytest.mark.slow
@needs_cxx
def test_static_batch_graphs_run_their_sizes_and_agree_with_the_dynamic_graph(
        tmp_path, cpu_fp32_package):
    """torch_aoti.static_batches: one package holds the dynamic graph and a graph per listed
    size (static: it refuses another size); the runner runs those sizes on them and every
    size gives the dynamic graph's outputs."""
    import zipfile

    from runtime_py.engines.torch_aoti import TorchAotiRunner, load_graphs

    package, details = cpu_fp32_package      # static_batches=[4, 2] asked
    assert details["static_batches"] == [2, 4]
    assert "static batch 2, 4" in details["compile_options"]["export"]
    _details_validator().validate(details)
    path = tmp_path / "engine.pt2"
    path.write_bytes(package)
    with zipfile.ZipFile(path) as archive:
        graphs_in_zip = {name.split("/aotinductor/")[1].split("/")[0]
                         for name in archive.namelist() if "/aotinductor/" in name}
    assert graphs_in_zip == {"model", "batch2", "batch4"}
    graphs = load_graphs(torch, path, ["model", "batch2", "batch4"])
    x = np.random.default_rng(0).normal(size=(4, 3, 16, 16)).astype(np.float32)

    def run(graph, n):
        out = graphs[graph](torch.from_numpy(x[:n]))
        return (out[0] if isinstance(out, (list, tuple)) else out).numpy()

    assert run("batch2", 3).shape == (2, 10)      # static: batch 2 whatever it is given
    assert run("model", 3).shape == (3, 10)
    runner = TorchAotiRunner(_MemoryBundle("fp32", details, package, (3, 16, 16), 10, 4))
    with runner, torch.no_grad():
        assert runner.static_batches == [2, 4]
        for n in (1, 2, 3, 4):
            got = runner.infer({"input": x[:n]})["logits"]
            assert got.shape == (n, 10)
            assert np.abs(got - run("model", n)).max() < 1e-4, n
            if n in (2, 4):
                assert np.abs(got - run(f"batch{n}", n)).max() < 1e-6, n
    # A manifest that claims a size the package has no graph for is refused on load (the
    # same package: a second compile only for this costs a minute of CI).
    claims = _MemoryBundle("fp32", {**details, "static_batches": [2, 3, 4]}, package,
                           (3, 16, 16), 10, 4)
    with pytest.raises(BundleError, match="no graph batch3"):
        TorchAotiRunner(claims, load_check=False).activate()


#: Run in a child (a fresh process: torch keeps the survey's answer for the process): the
#: package's graphs loaded and run as the runner does, then by torch's public loader.
#: Prints the output's shape, whether torch._inductor was imported by then, the survey's
#: cache size, and that size after torch's loader.
_SURVEY_CHILD = """
import sys, torch
from pathlib import Path
from runtime_py.engines.aoti_load import load_graphs
graphs = load_graphs(torch, Path(sys.argv[1]), ["model", "batch2"])
out = graphs["batch2"](torch.zeros(2, 3, 16, 16))
inductor = "torch._inductor" in sys.modules
from torch._inductor import cpu_vec_isa
print(tuple(out.shape), int(inductor), cpu_vec_isa.valid_vec_isa_list.cache_info().currsize)
torch._inductor.aoti_load_package(sys.argv[1])
print(cpu_vec_isa.valid_vec_isa_list.cache_info().currsize)
"""


@pytest.mark.slow
@needs_cxx
def test_graphs_load_without_torchs_cpu_isa_survey(tmp_path, cpu_fp32_package):
    """torch's aoti_load_package ends each load by surveying the CPU's vector ISAs (a test
    library and a child Python per ISA: 27 of the 36 s that the fp16 xception package took
    to load on an H100 with torch 2.11, h100-2026-12-06-b). The runner's loader and its load
    check skip the survey, and the graphs run (a tensor out, as the model returns) without
    importing torch._inductor (~5 s more of an H100's first load, h100-2026-12-06-c);
    torch's loader, in the same child, surveys."""
    from runtime_py.engines.torch_aoti import (LOAD_CHECK_CODE, child_env_with_runtime,
                                               probe_package_load)

    package, _ = cpu_fp32_package
    path = tmp_path / "engine.pt2"
    path.write_bytes(package)
    got = subprocess.run([sys.executable, "-c", _SURVEY_CHILD, str(path)], capture_output=True,
                         text=True, env=child_env_with_runtime(), cwd=tmp_path, timeout=600)
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stdout.split() == ["(2,", "10)", "0", "0", "1"]
    # the load check's own child code, with the same assertions after its load
    unsurveyed = LOAD_CHECK_CODE + (
        "\nassert 'torch._inductor' not in sys.modules, 'imported torch._inductor'\n"
        "from torch._inductor import cpu_vec_isa\n"
        "assert cpu_vec_isa.valid_vec_isa_list.cache_info().currsize == 0, 'surveyed'\n")
    probe_package_load(path, "cpu", False, code=unsurveyed)


def test_a_missing_or_unreadable_graph_is_named_before_any_load(tmp_path):
    """The graphs are the folders under aotinductor/; one the manifest lists and the package
    lacks, or a package that is no zip, is a BundleError before torch's loader runs (no
    torch is passed: calling it would fail differently)."""
    import zipfile

    from runtime_py.engines.aoti_load import load_graphs, package_graph_names

    path = tmp_path / "engine.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        for member in ("engine/data/aotinductor/model/a.wrapper.so",
                       "engine/data/aotinductor/batch2/b.wrapper.so",
                       "engine/data/aotinductor/stray-file", "engine/data/constants/c.bin"):
            archive.writestr(member, b"")
    assert package_graph_names(path) == {"model", "batch2"}
    with pytest.raises(BundleError, match=r"no graph batch4 \(it has batch2, model\)"):
        load_graphs(None, path, ["model", "batch2", "batch4"])
    path.write_bytes(b"not a zip")
    with pytest.raises(BundleError, match="not a readable zip"):
        load_graphs(None, path, ["model"])


def test_the_load_checks_child_finds_this_runtime_first(tmp_path):
    """The load check's child imports runtime_py (aoti_load): started as the check starts
    it, from another working folder, it imports this very runtime_py."""
    import runtime_py
    from runtime_py.engines.torch_aoti import child_env_with_runtime

    got = subprocess.run([sys.executable, "-c", "import runtime_py; print(runtime_py.__file__)"],
                         capture_output=True, text=True, env=child_env_with_runtime(),
                         cwd=tmp_path, timeout=60, check=True)
    assert Path(got.stdout.strip()).resolve() == Path(runtime_py.__file__).resolve()


@pytest.mark.slow
@needs_cxx
def test_the_target_compiles_the_static_batches_its_family_lists(tmp_path):
    """make and rebuild hand the target the family: its torch_aoti.static_batches become
    graphs of the package and the manifest's engine.details.static_batches."""
    import json

    from bundler.build_context import BuildContext
    from bundler.families import families_root, load_family
    from bundler.targets.torch_aoti import build_target
    from runtime_py.engines.torch_aoti import TorchAotiRunner

    shutil.copytree(families_root() / "timm_xception", tmp_path / "timm_xception")
    spec_path = tmp_path / "timm_xception" / "family.json"
    spec = json.loads(spec_path.read_text())
    spec["torch_aoti"] = {"static_batches": [3]}
    spec_path.write_text(json.dumps(spec))
    family = load_family("timm_xception", root=tmp_path)
    context = BuildContext(family, "fp32", build_torch_model=_tiny_model)
    build = build_target(b"", batch={"min": 1, "opt": 1, "max": 4}, context=context,
                         device="cpu", smoke_check=True)
    assert build.details["static_batches"] == [3]
    runner = TorchAotiRunner(_MemoryBundle("fp32", build.details, build.engine_bytes,
                                           (3, 299, 299), 10, 4))
    with runner:
        assert runner.static_batches == [3]


def test_static_batches_outside_the_range_are_refused():
    from bundler.targets.torch_aoti import static_sizes

    assert static_sizes([32, 1, 32], 1, 32) == [1, 32]
    with pytest.raises(UsageError, match=r"\[64\] are outside the batch range 1..32"):
        static_sizes([1, 64], 1, 32)
    with pytest.raises(UsageError, match="static already"):
        static_sizes([8], 8, 8)


@pytest.mark.slow
@needs_cxx
def test_make_and_verify_a_cpu_fp32_bundle(tmp_path):
    """bundle make --backend torch-aoti (device cpu) -> verify -> numerics vs ONNX Runtime."""
    from bundler.make import MakeRequest, make_bundle
    from runtime_py.format import open_bundle
    from runtime_py.numerics import check_numerics

    result = make_bundle(MakeRequest(family="timm_xception", precision="fp32",
                                     backend="torch-aoti", random_weights=True, out_dir=tmp_path,
                                     reference_count=2, target_options={"device": "cpu"}))
    assert result.path.name == "timm_xception-fp32-1.0.0-torch-aoti.bundle"
    bundle = open_bundle(result.path)
    bundle.verify()
    details = bundle.manifest["engine"]["details"]
    assert details["device"] == "cpu" and details["compile_options"]["layout"] == "nchw"
    report = check_numerics(bundle)
    assert report.ran and report.passed, report.reasons


def test_rebuild_an_onnxruntime_bundle_as_a_cpu_torch_aoti_bundle(xception_bundles, tmp_path):
    """bundle rebuild --backend torch-aoti: the torch model rebuilt from the manifest's
    family and recorded seed, compiled, and checked against the bundle's reference."""
    from bundler.rebuild import rebuild_bundle
    from runtime_py.format import open_bundle
    from runtime_py.numerics import check_numerics

    source = xception_bundles["fp32"]
    path, bundle_id = rebuild_bundle(source, "torch-aoti", tmp_path, device="cpu")
    assert path.name == "timm_xception-fp32-1.0.0-torch-aoti.bundle"
    with open_bundle(source) as src, open_bundle(path) as bundle:
        bundle.verify()
        assert bundle.manifest["rebuilt_from"] == src.id
        assert bundle.manifest["source"] == src.manifest["source"]
        assert bundle.manifest["build"]["packages"]["torch"] == torch.__version__.split("+")[0] \
            or bundle.manifest["build"]["packages"]["torch"] == str(torch.__version__)
        report = check_numerics(bundle)
    assert report.ran and report.passed, report.reasons


# --- on a GPU ---------------------------------------------------------------------------------

@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("precision", ["fp16", "fp8"])
def test_gpu_bundle_matches_its_onnxruntime_reference(tmp_path, precision):
    from bundler.make import MakeRequest, make_bundle
    from runtime_py.format import open_bundle
    from runtime_py.numerics import check_numerics

    result = make_bundle(MakeRequest(family="timm_xception", precision=precision,
                                     backend="torch-aoti", random_weights=True, out_dir=tmp_path,
                                     calib_count=16, reference_count=4))
    bundle = open_bundle(result.path)
    assert bundle.manifest["engine"]["backend"] == "torch-aoti"
    report = check_numerics(bundle)
    assert report.ran and report.passed, report.reasons


@pytest.fixture(scope="module")
def gpu_fp16_tiny():
    """(package, details) of the tiny model in fp16 for the GPU, compiled once (a minute)."""
    from bundler.targets.torch_aoti import build_engine

    return build_engine(_tiny_model(), "fp16", (3, 16, 16), {"min": 1, "max": 8}, smoke=False)


def test_timed_cudnn_algorithms_sets_the_flag_inside_and_puts_it_back():
    """``timed_cudnn_algorithms``: cudnn.benchmark on inside when asked, as it was after
    (also after an error, and when it was on before); untouched when not asked. The runner
    reads whether to from its manifest (``compile_options.cudnn_benchmark``: true, or the
    batch sizes whose graphs do)."""
    from runtime_py.engines.torch_aoti import TorchAotiRunner, timed_cudnn_algorithms

    cudnn = torch.backends.cudnn
    before = cudnn.benchmark
    for start in (False, True):
        # torch's own context manager sets the starting state and puts every flag back
        with cudnn.flags(enabled=cudnn.enabled, benchmark=start,
                         deterministic=cudnn.deterministic, allow_tf32=cudnn.allow_tf32):
            with timed_cudnn_algorithms(torch, True):
                assert cudnn.benchmark is True
            assert cudnn.benchmark is start
            with pytest.raises(RuntimeError, match="boom"):
                with timed_cudnn_algorithms(torch, True):
                    raise RuntimeError("boom")
            assert cudnn.benchmark is start
            with timed_cudnn_algorithms(torch, False):
                assert cudnn.benchmark is start
    assert cudnn.benchmark is before
    # the record: true (every size), a list of batch sizes (those), anything else: none
    for options, want, sizes in (
            ({"cudnn_benchmark": True}, True, range(1, 9)), ({}, False, ()),
            ({"cudnn_benchmark": [4, 8]}, True, (4, 8)), ({"cudnn_benchmark": "yes"}, False, ()),
            ({"cudnn_benchmark": [0]}, False, ()), ({"cudnn_benchmark": []}, False, ()),
            (None, False, ())):
        details = {} if options is None else {"compile_options": options}
        bundle = _MemoryBundle("fp16", details, b"", (3, 16, 16), 10, 8)
        runner = TorchAotiRunner(bundle)
        assert runner.cudnn_benchmark is want, options
        assert [n for n in range(1, 9) if runner.times_cudnn(n)] == list(sizes), options
        # (in the manifest's form, as prepare_bench.py reports it)
        assert runner.cudnn_timing() == ({"cudnn_benchmark": True} == options
                                         or list(sizes) or False), options
        # `bundle serve --cudnn-benchmark on|off`: the option over the record, every size
        on, off = (TorchAotiRunner(bundle, cudnn_benchmark=v) for v in (True, False))
        assert on.cudnn_benchmark is True and all(on.times_cudnn(n) for n in range(1, 9))
        assert off.cudnn_benchmark is False and not any(off.times_cudnn(n) for n in range(1, 9))


def test_cudnn_timed_sizes_reads_every_form_of_the_record_and_refuses_the_rest():
    """One rule for the manifest's record and family.json's setting (bundler's check
    calls it): true -> every size (None), false / absent -> none, batch sizes -> those."""
    from runtime_py.engines.torch_aoti import cudnn_timed_sizes

    assert cudnn_timed_sizes(True) is None
    assert cudnn_timed_sizes(False) == cudnn_timed_sizes(None) == frozenset()
    assert cudnn_timed_sizes([32, 1]) == frozenset({1, 32})
    for bad in ([], [0], [-1], [2, 2], [1.0], [True], "32", 1, {"32": True}):
        with pytest.raises(ValueError, match="expected true, false or a list of batch sizes"):
            cudnn_timed_sizes(bad)


def test_cuda_graph_sizes_are_checked_and_map_each_batch_to_a_graph():
    """``cuda_graph_sizes``: checked when the runner is made (before any GPU is touched),
    sizes above the bundle's max dropped; a batch runs on the next listed size's graph,
    and on its own size where graphs are off."""
    from runtime_py.engines.torch_aoti import TorchAotiRunner
    from runtime_py.errors import UsageError

    bundle = _MemoryBundle("fp16", {}, b"", (3, 16, 16), 10, 8)
    with pytest.raises(UsageError, match="positive integer batch sizes"):
        TorchAotiRunner(bundle, cuda_graph_sizes=[2, 0])
    assert TorchAotiRunner(bundle, cuda_graph_sizes=[2, 16]).cuda_graph_sizes == (2, 8)
    assert TorchAotiRunner(bundle).cuda_graph_sizes is None
    runner = TorchAotiRunner(bundle, cuda_graph_sizes="4,2")
    assert runner.cuda_graph_sizes == (2, 4, 8)
    assert [runner._graph_batch(n) for n in range(1, 9)] == [2, 2, 4, 4, 8, 8, 8, 8]
    plain = TorchAotiRunner(bundle, cuda_graphs=False, cuda_graph_sizes=[2])
    assert [plain._graph_batch(n) for n in (1, 3)] == [1, 3]


@pytest.mark.gpu
@needs_gpu
def test_gpu_cuda_graph_sizes_pad_each_batch_to_a_captured_graph(gpu_fp16_tiny):
    """With ``cuda_graph_sizes=(2, 4)`` (and the max, 8) only those three graphs are
    captured; every batch size 1..8, through ``infer`` (the held path and the torch
    path), ``infer_async`` and ``infer_rows_async``, gives the outputs of a runner that
    captures every size: the padding rows never reach a real row. (Within fp16's
    tolerance, not bit-equal: another batch size's graph may run other kernels.)"""
    from runtime_py.engines.torch_aoti import TorchAotiRunner

    package, details = gpu_fp16_tiny
    x = np.random.default_rng(9).normal(size=(8, 3, 16, 16)).astype(np.float32)
    every = TorchAotiRunner(_MemoryBundle("fp16", details, package, (3, 16, 16), 10, 8))
    padded = TorchAotiRunner(_MemoryBundle("fp16", details, package, (3, 16, 16), 10, 8),
                             cuda_graph_sizes=(2, 4))
    with every, padded:
        reference = {n: every.infer({"input": x[:n]})["logits"] for n in range(1, 9)}
        told: list[tuple[int, int]] = []
        padded.prepare(range(1, 9), progress=lambda *a: told.append(a))
        assert sorted(padded._graphs) == [2, 4, 8] and told == [(1, 3), (2, 3), (3, 3)]
        taken = _record_held_infers(padded)
        for n in (1, 3, 5, 8, 7, 2, 6, 4):
            got = padded.infer({"input": x[:n]})["logits"]
            assert got.shape == (n, 10) and np.allclose(got, reference[n], rtol=1e-2, atol=2e-3), n
        assert taken == [1, 3, 5, 8, 7, 2, 6, 4]          # every size on a captured graph
        for n in (3, 8, 1):
            got = padded.infer_async({"input": x[:n]}).result()["logits"]
            assert np.allclose(got, reference[n], rtol=1e-2, atol=2e-3), n
            rows = padded.infer_rows_async({"input": [x[:1], x[1:n]] if n > 1 else [x[:1]]})
            assert np.allclose(rows.result()["logits"], reference[n], rtol=1e-2, atol=2e-3), n
        padded.enqueue = "torch"                           # the torch calls' path too
        for n in (3, 5):
            got = padded.infer({"input": x[:n]})["logits"]
            assert np.allclose(got, reference[n], rtol=1e-2, atol=2e-3), n
        assert sorted(padded._graphs) == [2, 4, 8]         # nothing captured on the way


@pytest.mark.gpu
@needs_gpu
def test_gpu_cuda_graphs_give_the_same_outputs(gpu_fp16_tiny):
    from runtime_py.engines.torch_aoti import TorchAotiRunner

    package, details = gpu_fp16_tiny
    x = np.random.default_rng(1).normal(size=(5, 3, 16, 16)).astype(np.float32)
    outputs = []
    for graphs in (True, False):
        runner = TorchAotiRunner(_MemoryBundle("fp16", details, package, (3, 16, 16), 10, 8),
                                 cuda_graphs=graphs)
        with runner:
            first = runner.infer({"input": x})["logits"]
            again = runner.infer({"input": x})["logits"]   # a replay, when graphs are on
            assert runner.on_gpu
        assert np.array_equal(first, again)
        outputs.append(first)
        assert runner.graph_failures == {}
    assert np.abs(outputs[0] - outputs[1]).max() < 1e-3


def test_event_sync_refuses_an_unknown_mode():
    from runtime_py.engines.torch_aoti import TorchAotiRunner
    from runtime_py.errors import UsageError

    bundle = _MemoryBundle("fp16", {}, b"", (3, 16, 16), 10, 8)
    with pytest.raises(UsageError, match="event_sync must be one of spin, block"):
        TorchAotiRunner(bundle, event_sync="sleep")
    assert TorchAotiRunner(bundle).event_sync == "block"      # the default
    runner = TorchAotiRunner(bundle, event_sync="spin")
    assert runner.event_sync == "spin"
    with pytest.raises(UsageError, match="got 'poll'"):
        runner.set_event_sync("poll")
    assert runner.event_sync == "spin"


@pytest.mark.gpu
@needs_gpu
def test_gpu_blocking_sync_events_give_the_same_outputs_and_switch_live(gpu_fp16_tiny):
    """event_sync="block": the slots' done events are replaced by blocking-sync ones,
    results equal the spinning ones, and a switch on an active runner reads out the batch
    in flight first (its result stays with its caller)."""
    from runtime_py.engines.torch_aoti import TorchAotiRunner

    package, details = gpu_fp16_tiny
    x = np.random.default_rng(2).normal(size=(4, 3, 16, 16)).astype(np.float32)
    runner = TorchAotiRunner(_MemoryBundle("fp16", details, package, (3, 16, 16), 10, 8),
                             event_sync="spin")
    with runner:
        spun = runner.infer_async({"input": x})
        before = [slot.done for slot in runner._slots]
        runner.set_event_sync("block")          # spun is in flight: read out first
        assert all(a is not slot.done for a, slot in zip(before, runner._slots))
        blocked = [runner.infer_async({"input": x}) for _ in range(3)]   # both slots reused
        assert runner.event_sync == "block"
        for pending in blocked:
            assert np.array_equal(spun.result()["logits"], pending.result()["logits"])
        runner.set_event_sync("spin")
        assert np.array_equal(runner.infer_async({"input": x}).result()["logits"],
                              spun.result()["logits"])


@pytest.mark.gpu
@needs_gpu
def test_gpu_static_batch_graphs_are_captured_and_agree_in_fp16(gpu_fp16_tiny):
    """fp16 static-batch graphs on the GPU: CUDA graphs captured from them, outputs within
    the fp16 tolerance of the dynamic graph's (the shipped fixture, no static graphs)."""
    from bundler.targets.torch_aoti import build_engine
    from runtime_py.engines.torch_aoti import TorchAotiRunner
    from runtime_py.numerics import TOLERANCES

    package, details = build_engine(_tiny_model(), "fp16", (3, 16, 16), {"min": 1, "max": 8},
                                    smoke=True, static_batches=[1, 8])
    assert details["static_batches"] == [1, 8]
    x = np.random.default_rng(2).normal(size=(8, 3, 16, 16)).astype(np.float32)
    dynamic = TorchAotiRunner(_MemoryBundle("fp16", gpu_fp16_tiny[1], gpu_fp16_tiny[0],
                                            (3, 16, 16), 10, 8))
    static = TorchAotiRunner(_MemoryBundle("fp16", details, package, (3, 16, 16), 10, 8))
    with dynamic, static:
        assert static.static_batches == [1, 8]
        for n in (1, 5, 8):
            got = static.infer({"input": x[:n]})["logits"]
            assert np.array_equal(got, static.infer({"input": x[:n]})["logits"])  # replay
            reference = dynamic.infer({"input": x[:n]})["logits"]
            assert np.abs(got - reference).max() <= TOLERANCES["fp16"].allowed(reference), n
        assert static.graph_failures == {}


@pytest.mark.gpu
@needs_gpu
def test_gpu_fp8_batch1_graph_runs_its_pointwise_dequantized_and_agrees():
    """timm_xception's fp8 form on a tiny model: a static batch-1 graph whose 1x1 GEMM runs
    the FP8 operands dequantized (``small_batch_pointwise="dequantized"``), recorded in the
    details; one image at a time (that graph) within the fp8 tolerance of the same images
    in one batch (the dynamic graph's FP8 GEMM)."""
    from bundler.targets.torch_aoti import build_engine
    from bundler.targets.torch_aoti.build import SMALL_BATCH_POINTWISE_DESCRIPTIONS
    from runtime_py.engines.torch_aoti import TorchAotiRunner
    from runtime_py.numerics import TOLERANCES

    model = _tiny_model()
    x = np.random.default_rng(4).normal(size=(4, 3, 16, 16)).astype(np.float32)
    with torch.no_grad():
        act = float(model[:3](torch.from_numpy(x)).abs().max()) / 448
    weights = (model[3].weight.abs().amax(dim=(1, 2, 3)) / 448).numpy()
    package, details = build_engine(model, "fp8", (3, 16, 16), {"min": 1, "max": 8},
                                    fp8={"3": (act, weights)}, fp8_gemm="rowwise-fp16",
                                    smoke=True, static_batches=[1],
                                    small_batch_pointwise="dequantized")
    assert details["static_batches"] == [1]
    assert details["compile_options"]["fp8_pointwise_small_batch"] == \
        SMALL_BATCH_POINTWISE_DESCRIPTIONS["dequantized"]
    runner = TorchAotiRunner(_MemoryBundle("fp8", details, package, (3, 16, 16), 10, 8))
    with runner:
        assert runner.static_batches == [1]
        batched = runner.infer({"input": x})["logits"]
        for i in range(len(x)):
            one = runner.infer({"input": x[i:i + 1]})["logits"]
            ref = batched[i:i + 1]
            assert np.abs(one - ref).max() <= TOLERANCES["fp8"].allowed(ref), i
        assert runner.graph_failures == {}


@pytest.mark.gpu
@needs_gpu
def test_gpu_channels_last_fp8_package_agrees_with_the_nhwc_one():
    """The channels_last fp8 form (family.json torch_aoti.fp8_layout) compiled into a
    package on a tiny model, taking uint8 pixels (the pixel head in front of both of its
    forms), its batch-1 graph the NHWC rewrite (torch_aoti.small_batch_layout "nhwc"):
    recorded as such, and within the fp8 tolerance of the NHWC rewrite's float package fed
    the host's preprocessing of the same pixels, at the dynamic and the batch-1 graph."""
    from bundler.targets.torch_aoti import build_engine
    from runtime_py.engines.torch_aoti import TorchAotiRunner
    from runtime_py.numerics import TOLERANCES
    from runtime_py.preprocess import Preprocessor, pixel_input_spec, spec_from_timm_config

    spec = spec_from_timm_config({"input_size": (3, 16, 16), "interpolation": "bicubic",
                                  "crop_pct": 0.875, "mean": (0.485, 0.456, 0.406),
                                  "std": (0.229, 0.224, 0.225)}, "input")
    pixels = np.random.default_rng(5).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
    x = Preprocessor(pixel_input_spec(spec)).normalize(pixels)
    model = _tiny_model()
    with torch.no_grad():
        act = float(model[:3](torch.from_numpy(x)).abs().max()) / 448
    weights = (model[3].weight.abs().amax(dim=(1, 2, 3)) / 448).numpy()
    outs = {}
    for form in ("nhwc", "channels_last"):
        cl = form == "channels_last"
        package, details = build_engine(
            model, "fp8", (3, 16, 16), {"min": 1, "max": 8}, fp8={"3": (act, weights)},
            smoke=True, static_batches=[1], small_batch_pointwise="dequantized",
            nhwc=not cl, channels_last=cl, small_batch_layout="nhwc",
            pixel_scale_bias=Preprocessor(spec).pixel_scale_bias if cl else None)
        assert ("NHWC view" in details["compile_options"]["layout"]) is cl
        small = details["compile_options"].get("small_batch_layout")
        assert (small == "nhwc, channels padded to multiples of 16 (static graphs of batch 1)"
                if cl else small is None), small
        feed = pixels if cl else x
        bundle = _MemoryBundle("fp8", details, package, feed.shape[1:], 10, 8,
                               input_dtype="uint8" if cl else "float32")
        with TorchAotiRunner(bundle) as runner:
            outs[form] = (runner.infer({"input": feed})["logits"],
                          runner.infer({"input": feed[:1]})["logits"])
            assert runner.graph_failures == {}
    for got, ref in zip(outs["channels_last"], outs["nhwc"]):
        assert np.abs(got - ref).max() <= TOLERANCES["fp8"].allowed(ref)


@pytest.mark.gpu
@needs_gpu
def test_gpu_device_timings_time_the_engine_then_the_copies(gpu_fp16_tiny):
    from runtime_py.bench import device_timings
    from runtime_py.engines.torch_aoti import TorchAotiRunner

    package, details = gpu_fp16_tiny
    assert details["compile_options"]["cxx"]   # the toolchain it was linked with is recorded
    runner = TorchAotiRunner(_MemoryBundle("fp16", details, package, (3, 16, 16), 10, 8))
    with runner:
        timings = device_timings(runner, 8, iterations=30, warmup=3)
        with pytest.raises(InferenceInputError, match="outside"):
            runner.device_timings(9, 1, 0)
        # while active (deactivate drops the graphs): replayed, not run plainly
        assert 8 in runner._graphs and runner.graph_failures == {}
    assert set(timings) == {"graph_replay", "with_copies"}
    assert all(len(t) == 30 and min(t) > 0 for t in timings.values())
    assert np.median(timings["graph_replay"]) < np.median(timings["with_copies"])


@pytest.mark.gpu
@needs_gpu
def test_gpu_staging_modes_pinned_buffers_and_async_paths_agree(gpu_fp16_tiny):
    # a plain batch reaches the device through pinned staging or the driver's pageable
    # copy; a pinned buffer is read in place; the async path too: one answer for all
    from runtime_py.engines.torch_aoti import TorchAotiRunner

    package, details = gpu_fp16_tiny
    x = np.random.default_rng(2).normal(size=(7, 3, 16, 16)).astype(np.float32)
    runner = TorchAotiRunner(_MemoryBundle("fp16", details, package, (3, 16, 16), 10, 8))
    with runner:
        runner.staging = "pinned"
        staged = runner.infer({"input": x})["logits"]
        runner.staging = "pageable"
        pageable = runner.infer({"input": x})["logits"]
        reversed_view = runner.infer({"input": x[::-1]})["logits"]   # staged: not wrappable
        pending = [runner.infer_async({"input": x[::-1].copy()}),
                   runner.infer_async({"input": x})]
        pinned = runner.input_buffers()["input"]
        pinned[:7] = x
        in_place = runner.infer({"input": pinned[:7]})["logits"]
        reversed_, again = (p.result()["logits"] for p in pending)
    assert np.array_equal(staged, pageable) and np.array_equal(staged, in_place)
    assert np.array_equal(staged, again)
    assert np.abs(staged[::-1] - reversed_view).max() < 1e-3
    assert np.abs(staged[::-1] - reversed_).max() < 1e-3     # rows in other places of the batch


@pytest.mark.gpu
@needs_gpu
def test_gpu_held_enqueue_matches_torch_calls_and_is_taken(gpu_fp16_tiny):
    """A batch from pinned memory, after its size's graph was captured, is enqueued through
    the process's CUDA runtime (cudart_held: no GIL release); it gives the same outputs as
    torch's stream calls, batch after batch with both slots in flight, and a feed that is
    not pinned (or enqueue = "torch") still takes the torch calls."""
    from runtime_py.engines import cudart_held
    from runtime_py.engines.torch_aoti import TorchAotiRunner

    package, details = gpu_fp16_tiny
    rng = np.random.default_rng(4)
    batches = [rng.normal(size=(8, 3, 16, 16)).astype(np.float32) for _ in range(6)]
    runner = TorchAotiRunner(_MemoryBundle("fp16", details, package, (3, 16, 16), 10, 8))
    with runner:
        assert cudart_held.find() is not None, "torch's libcudart.so is not mapped"
        bufs = [runner.input_buffers()["input"] for _ in range(2)]
        runner.enqueue = "torch"
        reference = [runner.infer({"input": x})["logits"] for x in batches]
        taken = []
        real = runner._enqueue_held

        def spy(slot, sources, n):
            taken.append(True)
            return real(slot, sources, n)

        runner._enqueue_held = spy
        for mode in ("torch", "held"):
            runner.enqueue = mode
            taken.clear()
            pending = []
            for i, x in enumerate(batches):
                buf = bufs[i % 2]
                if len(pending) == 2:
                    got = pending.pop(0)
                    assert np.array_equal(got[1].result()["logits"], reference[got[0]]), mode
                buf[:8] = x
                pending.append((i, runner.infer_async({"input": buf[:8]})))
            for i, p in pending:
                assert np.array_equal(p.result()["logits"], reference[i]), mode
            assert taken == [True] * (len(batches) if mode == "held" else 0)
        taken.clear()
        plain = runner.infer_async({"input": batches[0]}).result()["logits"]
        assert np.array_equal(plain, reference[0]) and taken == []


def _record_held_infers(runner) -> list[int]:
    """The batch sizes ``runner.infer`` sends through ``_infer_held`` from now on (the
    instance's method wrapped; the runner still runs them)."""
    taken: list[int] = []
    real = runner._infer_held

    def spy(slot, arr, n, pinned):
        taken.append(n)
        return real(slot, arr, n, pinned)
    runner._infer_held = spy
    return taken


@pytest.mark.gpu
@needs_gpu
def test_gpu_infer_runs_through_the_held_path_and_agrees(gpu_fp16_tiny):
    """``infer`` (one caller waiting) enqueues through ``cudart_held`` once its size's
    graph is captured, for a pinned feed and for a plain one that is staged (``staging``
    "pinned", or "auto" for a small batch: each chunk's H2D as it is copied); the
    driver's pageable copy keeps the torch calls. The same outputs every way, sizes with and without a graph."""
    from runtime_py.engines.torch_aoti import TorchAotiRunner

    package, details = gpu_fp16_tiny
    rng = np.random.default_rng(6)
    x = rng.normal(size=(8, 3, 16, 16)).astype(np.float32)
    runner = TorchAotiRunner(_MemoryBundle("fp16", details, package, (3, 16, 16), 10, 8))
    with runner:
        runner.enqueue = "torch"
        reference = {n: runner.infer({"input": x[:n]})["logits"] for n in (1, 8)}
        runner.enqueue = "held"
        taken = _record_held_infers(runner)
        pinned = runner.input_buffers()["input"]
        assert runner.staging == "auto"               # small batches: staged, held
        for staging, expect_held in (("auto", True), ("pinned", True), ("pageable", False)):
            runner.staging = staging
            for n in (1, 8):
                taken.clear()
                for _ in range(3):
                    assert np.array_equal(runner.infer({"input": x[:n]})["logits"], reference[n])
                assert taken == ([n] * 3 if expect_held else []), staging
                pinned[:n] = x[:n]
                taken.clear()
                assert np.array_equal(runner.infer({"input": pinned[:n]})["logits"], reference[n])
                assert taken == [n]                # a pinned feed: held either way
        taken.clear()
        five = runner.infer({"input": x[:5]})["logits"]     # no graph yet for 5: torch calls
        assert taken == [] and np.abs(five - reference[8][:5]).max() < 1e-3


@pytest.mark.gpu
@needs_gpu
def test_gpu_prepare_captures_every_size_into_one_pool_and_outputs_agree(gpu_fp16_tiny):
    """``prepare`` captures the graph of each size before any batch (sizes out of range
    skipped, a second call a no-op); the graphs share one memory pool, and each size's
    outputs, run in any order, equal an unprepared runner's (a shared intermediate never
    overwrites another size's output); ``infer`` then takes the held path at once."""
    from runtime_py.engines.torch_aoti import TorchAotiRunner

    package, details = gpu_fp16_tiny
    x = np.random.default_rng(8).normal(size=(8, 3, 16, 16)).astype(np.float32)
    plain = TorchAotiRunner(_MemoryBundle("fp16", details, package, (3, 16, 16), 10, 8))
    prepared = TorchAotiRunner(_MemoryBundle("fp16", details, package, (3, 16, 16), 10, 8))
    with plain, prepared:
        reference = {n: plain.infer({"input": x[:n]})["logits"] for n in range(1, 9)}
        told: list[tuple[int, int]] = []
        prepared.prepare([0, *range(1, 9), 9], progress=lambda *a: told.append(a))
        assert sorted(prepared._graphs) == list(range(1, 9)) and prepared.graph_failures == {}
        assert told == [(k, 8) for k in range(1, 9)]
        assert sorted(prepared.capture_seconds) == list(range(1, 9))
        pools = {id(prepared._graph_pool)}
        prepared.prepare(range(1, 9), progress=lambda *a: told.append(a))
        assert {id(prepared._graph_pool)} == pools and len(told) == 8   # nothing to do
        taken = _record_held_infers(prepared)
        order = [8, 1, 5, 8, 3, 2, 7, 4, 6, 1, 8]
        for n in order:
            assert np.array_equal(prepared.infer({"input": x[:n]})["logits"], reference[n]), n
        assert taken == order
        pending = [prepared.infer_async({"input": x[:n]}) for n in (8, 3)]
        assert np.array_equal(pending[0].result()["logits"], reference[8])
        assert np.array_equal(pending[1].result()["logits"], reference[3])


@pytest.mark.gpu
@needs_gpu
def test_gpu_a_bundle_that_says_so_times_cudnn_in_each_graphs_warm_up_only(gpu_fp16_tiny):
    """compile_options.cudnn_benchmark: each size's warm-up runs with cudnn.benchmark on,
    its capture and replays with the process's flag as it was; the outputs match a runner
    without it (cuDNN may pick other algorithms: fp16 rounding, not equality)."""
    from runtime_py.engines.torch_aoti import TorchAotiRunner

    package, details = gpu_fp16_tiny

    def runner(record):
        options = {**details["compile_options"], **({} if record is None else
                                                    {"cudnn_benchmark": record})}
        return TorchAotiRunner(_MemoryBundle("fp16", {**details, "compile_options": options},
                                             package, (3, 16, 16), 10, 8))

    x = np.random.default_rng(9).normal(size=(4, 3, 16, 16)).astype(np.float32)
    plain, timed, at4 = runner(None), runner(True), runner([4])
    assert timed.cudnn_benchmark and at4.cudnn_benchmark and not plain.cudnn_benchmark
    before = torch.backends.cudnn.benchmark
    with plain, timed, at4:
        seen: dict[str, list[bool]] = {}
        for name, r in (("timed", timed), ("at4", at4)):
            run_model, flags = r._run_model, seen.setdefault(name, [])

            def recording(batch, run_model=run_model, flags=flags):
                flags.append(torch.backends.cudnn.benchmark)
                return run_model(batch)

            r._run_model = recording     # this runner's own method, on this instance
        for n in (4, 1):
            want = plain.infer({"input": x[:n]})["logits"]
            for r in (timed, at4):
                got = r.infer({"input": x[:n]})["logits"]
                np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
        for r in (timed, at4):
            assert sorted(r._graphs) == [1, 4] and r.graph_failures == {}
        # per size: the warm-up with the flag on, the capture with it as it was; a record
        # of batch sizes times the warm-ups of those sizes only
        assert seen["timed"] == [True, before, True, before]
        assert seen["at4"] == [True, before, before, before]
        assert torch.backends.cudnn.benchmark is before


@pytest.mark.gpu
@needs_gpu
def test_gpu_rows_are_copied_to_the_device_where_they_lie(gpu_fp16_tiny):
    """``infer_rows_async``: a batch given as pieces (a batcher's requests) gives the same
    outputs as the gathered batch, whether a piece lies in memory page-locked in place (an
    mmap, as the workers' arenas: pinned_host.pin), in ``input_buffers`` or in plain numpy
    memory (staged); pieces stay unchanged; a size whose graph is not captured yet is
    declined (None), as are pieces that are not rows of the input."""
    import mmap

    from runtime_py import pinned_host
    from runtime_py.engines.torch_aoti import TorchAotiRunner

    package, details = gpu_fp16_tiny
    rng = np.random.default_rng(5)
    x = rng.normal(size=(8, 3, 16, 16)).astype(np.float32)
    row = x[0].nbytes
    runner = TorchAotiRunner(_MemoryBundle("fp16", details, package, (3, 16, 16), 10, 8))
    arena = mmap.mmap(-1, 16 * row)
    with runner:
        reference = runner.infer({"input": x})["logits"]       # captures batch 8's graph
        assert runner.infer_rows_async({"input": [x[:3], x[3:]]}) is not None
        assert runner.infer_rows_async({"input": [x[:3]]}) is None       # batch 3: no graph
        assert runner.infer_rows_async({"input": [x[:4, :, :8]]}) is None  # not input rows
        region = pinned_host.pin(pinned_host.buffer_address(arena), len(arena))
        assert region is not None, "cudaHostRegister refused an anonymous shared mapping"
        try:
            in_arena = np.frombuffer(arena, np.float32, 4 * row // 4, 5 * row).reshape(4, 3, 16, 16)
            in_arena[...] = x[2:6]
            assert pinned_host.holds(in_arena) and not pinned_host.holds(x)
            own = runner.input_buffers()["input"]
            own[:2] = x[6:]
            for _ in range(3):                    # both slots, reused
                pieces = [x[:2].copy(), in_arena, own[:2]]
                before = [p.copy() for p in pieces]
                got = runner.infer_rows_async({"input": pieces}).result()["logits"]
                assert np.array_equal(got, reference)
                assert all(np.array_equal(p, b) for p, b in zip(pieces, before))
            one_by_one = [in_arena[i:i + 1] for i in range(4)] + [x[:2], own[:2]]
            order = [2, 3, 4, 5, 0, 1, 6, 7]
            got = runner.infer_rows_async({"input": one_by_one}).result()["logits"]
            assert np.array_equal(got, reference[order])
        finally:
            region.unpin()
        assert not pinned_host.holds(np.frombuffer(arena, np.uint8, 8))
        # a client's /dev/shm region, as the server maps it (ShmRegistry, locked by the runner)
        import os
        import uuid

        from runtime_py.server.shm import ShmRef, ShmRegistry

        key = f"trt-bundle-gpu-test-{uuid.uuid4().hex[:12]}"
        with open(f"/dev/shm/{key}", "wb") as f:
            f.write(x.tobytes())
        try:
            registry = ShmRegistry(pin=runner.pin_host)
            registry.register("r", key, 0, x.nbytes)
            rows = registry.read(ShmRef("r", 0, x.nbytes), np.dtype(np.float32),
                                 list(x.shape), "input 'input'")
            assert pinned_host.holds(rows), "a /dev/shm mapping was not page-locked"
            got = runner.infer_rows_async({"input": [rows[:5], rows[5:]]}).result()["logits"]
            assert np.array_equal(got, reference)
            registry.unregister("r")
            del rows
        finally:
            os.unlink(f"/dev/shm/{key}")


@pytest.mark.gpu
@needs_gpu
def test_gpu_rows_staged_ahead_are_not_copied_again_and_outputs_agree(gpu_fp16_tiny):
    """``stage_rows``: rows of the next batch copied to the device before its dispatch
    (plain numpy through the staging rows, pinned in place), then ``infer_rows_async``
    told how many are staged copies only the rest: the dispatch's pieces for the staged
    rows are zeros here, and the outputs still equal the reference. Declined: a gap, rows
    beyond the max batch. Not trusted: another caller's claim, or a claim on rows a batch
    taken in between (``infer_async``) used up; restaging from row 0 overwrites."""
    from runtime_py.engines.torch_aoti import TorchAotiRunner

    package, details = gpu_fp16_tiny
    x = np.random.default_rng(6).normal(size=(8, 3, 16, 16)).astype(np.float32)
    zeros = np.zeros_like(x)
    me, other = object(), object()
    runner = TorchAotiRunner(_MemoryBundle("fp16", details, package, (3, 16, 16), 10, 8))
    with runner:
        reference = runner.infer({"input": x})["logits"]       # captures batch 8's graph
        assert runner.stages_rows
        own = runner.input_buffers()["input"]
        for _ in range(3):                                       # both slots, reused
            assert runner.stage_rows({"input": [x[:2].copy(), x[2:3].copy()]}, 0, me)
            own[:2] = x[3:5]
            assert runner.stage_rows({"input": [own[:2]]}, 3, me)
            assert not runner.stage_rows({"input": [x[:1]]}, 6, me)      # a gap
            assert not runner.stage_rows({"input": [x[:4]]}, 5, me)      # 9 rows
            pending = runner.infer_rows_async({"input": [zeros[:5], x[5:].copy()]},
                                              staged_rows=5, staged_by=me)
            assert np.array_equal(pending.result()["logits"], reference)
        assert runner.stage_rows({"input": [zeros[:4]]}, 0, me)
        got = runner.infer_rows_async({"input": [x[:4].copy(), x[4:].copy()]},
                                      staged_rows=4, staged_by=other).result()["logits"]
        assert np.array_equal(got, reference)
        assert runner.stage_rows({"input": [zeros[:4]]}, 0, me)
        assert runner.stage_rows({"input": [x[:4].copy()]}, 0, me)
        got = runner.infer_rows_async({"input": [zeros[:4], x[4:].copy()]},
                                      staged_rows=4, staged_by=me).result()["logits"]
        assert np.array_equal(got, reference)
        # rows staged, then a batch taken in between (infer_async) uses that slot: a claim
        # at the next dispatch finds nothing staged in its own slot and copies all rows
        # (zeros staged in both slots first, so a claim honoured wrongly shows)
        for _ in range(2):
            assert runner.stage_rows({"input": [zeros[:4]]}, 0, me)
            runner.infer_rows_async({"input": [zeros[:4], zeros[4:]]}, staged_rows=4,
                                    staged_by=me).result()
        used = runner.staged_rows_used
        assert runner.stage_rows({"input": [zeros[:4]]}, 0, me)
        assert np.array_equal(runner.infer_async({"input": x}).result()["logits"], reference)
        got = runner.infer_rows_async({"input": [x[:4].copy(), x[4:].copy()]},
                                      staged_rows=4, staged_by=me).result()["logits"]
        assert np.array_equal(got, reference) and runner.staged_rows_used == used


@pytest.mark.gpu
@needs_gpu
def test_gpu_a_batcher_stages_rows_ahead_and_every_client_gets_its_own(gpu_fp16_tiny):
    """A Batcher over the runner's Model, 24 clients of one row each (batches of 8 that
    collect over the clients' round trips): rows are staged ahead and claimed at dispatch,
    and each client's output equals the runner's own for its row."""
    from concurrent.futures import ThreadPoolExecutor

    from runtime_py.batcher import Batcher
    from runtime_py.engines.torch_aoti import TorchAotiRunner
    from runtime_py.model import Model

    package, details = gpu_fp16_tiny
    bundle = _MemoryBundle("fp16", details, package, (3, 16, 16), 10, 8)
    bundle.manifest["name"] = "tiny-fp16-torch-aoti"
    bundle.id, bundle.labels = "0" * 64, None
    x = np.random.default_rng(7).normal(size=(24, 3, 16, 16)).astype(np.float32)
    runner = TorchAotiRunner(bundle)
    with runner:
        model = Model(bundle, runner)
        assert model.stages_rows
        expected = [runner.infer({"input": x[i:i + 1]})["logits"] for i in range(24)]
        with Batcher(model, max_delay_ms=20, stage_ahead=True) as b, \
                ThreadPoolExecutor(24) as pool:
            def client(i: int) -> None:
                for _ in range(20):
                    out = b.infer({"input": x[i:i + 1]}, timeout=30)["logits"]
                    assert np.allclose(out, expected[i], atol=1e-3), i
            for f in [pool.submit(client, i) for i in range(24)]:
                f.result(120)
            assert b.rows_claimed_staged > 0 and model.staged_rows_used > 0


def test_the_loaded_cuda_runtime_is_found_in_the_maps_text():
    from runtime_py.engines.cudart_held import loaded_cudart_path

    maps = ("7f00-7f10 r--p 00000000 08:01 123 /usr/lib/libc.so.6\n"
            "7f10-7f20 r-xp 00000000 00:00 0 \n"
            "7f20-7f30 r-xp 00001000 08:01 456 /opt/venv/nvidia/cu13/lib/libcudart.so.13\n")
    assert loaded_cudart_path(maps) == "/opt/venv/nvidia/cu13/lib/libcudart.so.13"
    assert loaded_cudart_path("7f00-7f10 r--p 0 08:01 1 /usr/lib/libcudart_static.a\n") is None
    assert loaded_cudart_path("") is None


# --- the child-process load check -------------------------------------------------------------

def test_a_loader_crash_in_the_child_is_a_compatibility_error(tmp_path):
    from runtime_py.engines.torch_aoti import probe_package_load

    crash = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    with pytest.raises(CompatibilityError, match="killed by SIGSEGV") as info:
        probe_package_load(tmp_path / "engine.pt2", "0", True, code=crash)
    assert "--backend onnxruntime" in str(info.value)
    with pytest.raises(CompatibilityError, match="did not finish in 1 s"):
        probe_package_load(tmp_path / "engine.pt2", "0", True, code="import time; time.sleep(30)",
                           timeout_s=1)


def _cpu_details(torch_version=None):
    from bundler.targets.torch_aoti import engine_details, host_details

    details = engine_details(host_details("cpu"), "fp32", {"max_autotune": False}, nhwc=False,
                             fast_accum=False, padding={}, batch_sizes=[1], seconds=None)
    if torch_version is not None:
        details["torch_version"] = torch_version
    return details


def test_the_load_check_runs_while_torch_is_imported_and_is_waited_for_before_the_graphs(
        monkeypatch):
    """The check's child starts once the package is on disk, before this process imports
    torch (on an H100 the check took 10.8 of 21 s, ~4 s of it the same imports this process
    makes: h100-2026-12-06-c), and this process loads the graphs only after it passed."""
    import runtime_py.engines.torch_aoti as aoti

    events: list[str] = []
    real_import = aoti.import_torch

    class Recorded(aoti.PackageLoadCheck):
        def __init__(self, path, device, single, **kwargs):
            assert Path(path).read_bytes() == b"PK package"     # on disk before the child
            super().__init__(path, device, single, code="pass", **kwargs)
            events.append(f"check started on {device}")

        def wait(self):
            super().wait()
            events.append("check passed")

    def recorded_import():
        if "torch import" not in events:
            events.append("torch import")
        return real_import()

    def recorded_load(torch, path, names, **kwargs):
        events.append(f"graphs {names}")
        raise BundleError("stop here")

    monkeypatch.setattr(aoti, "PackageLoadCheck", Recorded)
    monkeypatch.setattr(aoti, "import_torch", recorded_import)
    monkeypatch.setattr(aoti, "load_graphs", recorded_load)
    runner = aoti.TorchAotiRunner(_MemoryBundle("fp32", _cpu_details(), b"PK package",
                                                (3, 16, 16), 10, 4), load_check=True)
    with pytest.raises(BundleError, match="stop here"):
        runner.activate()
    assert events == ["check started on cpu", "torch import", "check passed", "graphs ['model']"]


def test_without_torch_activation_stops_before_writing_the_package(tmp_path, monkeypatch):
    """A host without torch gets EngineUnavailableError (what `auto` falls back on) before
    the package is written out or a load check's child is started."""
    import tempfile

    import runtime_py.engines.torch_aoti as aoti

    started = []
    monkeypatch.setattr(aoti, "PackageLoadCheck", lambda *a, **k: started.append(a))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    runner = aoti.TorchAotiRunner(_MemoryBundle("fp32", _cpu_details(), b"PK package",
                                                (3, 16, 16), 10, 4), load_check=True)
    monkeypatch.setitem(sys.modules, "torch", None)        # `import torch` fails
    with pytest.raises(EngineUnavailableError, match="which needs torch: pip install torch"):
        runner.activate()
    assert started == [] and list(tmp_path.iterdir()) == []


def test_an_activation_that_fails_before_the_load_check_ends_kills_its_child(tmp_path,
                                                                            monkeypatch):
    """A host check that refuses the package (another torch) raises its own error at once;
    the check's child, still loading, is killed and reaped, and the package folder goes."""
    import os

    import runtime_py.engines.torch_aoti as aoti

    pid_file = tmp_path / "child.pid"
    started: list = []

    class Slow(aoti.PackageLoadCheck):
        def __init__(self, path, device, single, **kwargs):
            started.append(Path(path).parent)
            code = ("import os, sys, time; "
                    f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)")
            super().__init__(path, device, single, code=code, **kwargs)

    monkeypatch.setattr(aoti, "PackageLoadCheck", Slow)
    runner = aoti.TorchAotiRunner(_MemoryBundle("fp32", _cpu_details("1.0.0"), b"PK package",
                                                (3, 16, 16), 10, 4), load_check=True)
    with pytest.raises(CompatibilityError, match=r"built for the CPU with torch 1\.0; this host has"):
        runner.activate()
    assert started and not started[0].exists()           # the package's folder is gone
    if pid_file.exists():                                # the child got as far as its code
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid_file.read_text()), 0)        # killed and reaped: no such pid


def _aoti_bundle_with(tmp_path, package: bytes):
    sys.path.insert(0, str(Path(__file__).parent))
    from synthetic_bundles import write_source_bundle

    engine = {"backend": "torch-aoti", "member": "engine.pt2", "details": _cpu_details()}
    return write_source_bundle(tmp_path, engine=engine, engine_member=package)


def test_a_package_this_torch_cannot_load_falls_back_to_onnxruntime(tmp_path):
    """A real load of a broken package by torch in the child: `auto` falls back to the
    bundle's ONNX graph with the reason; naming torch-aoti gets the error."""
    import runtime_py
    from runtime_py.reference import read_reference

    path = _aoti_bundle_with(tmp_path, b"PK\x03\x04 not really a package")
    with pytest.raises(CompatibilityError, match="test load in a child process failed"):
        runtime_py.load(path, backend="torch-aoti")
    with runtime_py.load(path) as model:
        assert "test load in a child process failed" in model.fallback_reason
        assert model.runner.backend == "onnxruntime"
        ref = read_reference(model.bundle)
        got = model.infer(ref.inputs)
        assert set(got) == set(ref.bundle) == {"logits"}
        np.testing.assert_allclose(got["logits"], ref.bundle["logits"], rtol=1e-5, atol=1e-6)


def test_the_load_check_can_be_turned_off_for_hosts_known_to_load(monkeypatch):
    from runtime_py.engines.torch_aoti import TorchAotiRunner

    bundle = _MemoryBundle("fp32", {}, b"", (3, 16, 16), 10, 4)
    assert TorchAotiRunner(bundle).load_check
    monkeypatch.setenv("TRT_BUNDLE_AOTI_LOAD_CHECK", "0")
    assert not TorchAotiRunner(bundle).load_check
    assert TorchAotiRunner(bundle, load_check=True).load_check


def test_gpu_runners_check_activity_and_batch_range_before_running():
    from runtime_py.engines.torch_aoti import TorchAotiRunner
    from runtime_py.errors import BundleError, InferenceInputError

    runner = TorchAotiRunner(_MemoryBundle("fp32", {}, b"", (3, 16, 16), 10, 4))
    x = np.zeros((5, 3, 16, 16), np.float32)
    with pytest.raises(BundleError, match="torch-aoti runner is not active"):
        runner.infer({"input": x})
    runner.is_active = True        # the checks run before any engine call
    with pytest.raises(InferenceInputError, match=r"batch 5 is outside this torch-aoti engine's range 1\.\.4"):
        runner.infer({"input": x})
    with pytest.raises(InferenceInputError, match="outside"):
        runner.infer_async({"input": x})
    assert runner.checked_batch({"input": x[:4]}) == 4


@pytest.mark.slow
@needs_cxx
def test_a_uint8_pixel_package_equals_the_float_path_on_the_same_images():
    """The pixel head compiled into the package: uint8 NHWC pixels give the logits that the
    host's float preprocessing of the same pixels gives through the float model, and the
    runner takes uint8 feeds (its staging buffers follow the manifest's dtype)."""
    from bundler.targets.torch_aoti import build_engine
    from runtime_py.engines.torch_aoti import TorchAotiRunner
    from runtime_py.preprocess import Preprocessor, pixel_input_spec, spec_from_timm_config

    spec = spec_from_timm_config({"input_size": (3, 16, 16), "interpolation": "bicubic",
                                  "crop_pct": 0.875, "mean": (0.485, 0.456, 0.406),
                                  "std": (0.229, 0.224, 0.225)}, "input")
    host = Preprocessor(spec)
    model = _tiny_model()
    package, details = build_engine(model, "fp32", (3, 16, 16), {"min": 1, "max": 4},
                                    device="cpu", batch_sizes=[3],
                                    pixel_scale_bias=host.pixel_scale_bias)
    assert "uint8" in details["compile_options"]["input"]
    pixels = np.random.default_rng(3).integers(0, 256, (3, 16, 16, 3), dtype=np.uint8)
    expected = model(torch.from_numpy(Preprocessor(pixel_input_spec(spec)).normalize(pixels)))
    bundle = _MemoryBundle("fp32", details, package, (16, 16, 3), 10, 4, input_dtype="uint8")
    with TorchAotiRunner(bundle) as runner:
        got = runner.infer({"input": pixels})["logits"]
        with pytest.raises(Exception, match="dtype float32 but the model takes uint8"):
            runner.infer({"input": pixels.astype(np.float32)})
    assert np.abs(got - expected.numpy()).max() < 1e-4


def test_the_build_hides_torch_s_own_pytree_deprecation_and_nothing_else(tmp_path):
    """torch 2.11 warns "`isinstance(treespec, LeafSpec)` is deprecated" from its own code
    once per graph on every torch-aoti build (three lines of noise in each `bundle make` on
    the H200); the build filters that message, and only that one."""
    torch = pytest.importorskip("torch")
    import warnings

    from bundler.targets.torch_aoti.build import compile_package

    class Warns(torch.nn.Module):
        def forward(self, x):
            warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...",
                          FutureWarning)
            warnings.warn("a model's own deprecation", FutureWarning)
            return torch.relu(x)

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        compile_package(Warns().eval(), (3, 4, 4), {"min": 1, "max": 2}, "cpu", {},
                        tmp_path / "m.pt2")
    messages = [str(w.message) for w in seen if issubclass(w.category, FutureWarning)]
    assert not any("LeafSpec" in m for m in messages), messages
    assert "a model's own deprecation" in messages


def test_packages_are_exported_and_compiled_with_the_fake_tensor_cache_off(tmp_path):
    """``build.FAKE_TENSOR_CACHE``: a stale cache entry laid timm_resnet50's fused stem
    convolution out NCHW on the GPU (three cuDNN conversions, 0.14 ms at batch 32). The
    module sees the setting while it is traced for export; torch's own setting is back as
    it was after the build."""
    torch = pytest.importorskip("torch")

    from bundler.targets.torch_aoti.build import FAKE_TENSOR_CACHE, compile_package

    seen = []

    class Records(torch.nn.Module):
        def forward(self, x):
            seen.append(torch._dynamo.config.fake_tensor_cache_enabled)
            return torch.relu(x)

    before = torch._dynamo.config.fake_tensor_cache_enabled
    compile_package(Records().eval(), (3, 4, 4), {"min": 1, "max": 2}, "cpu", {},
                    tmp_path / "m.pt2")
    assert FAKE_TENSOR_CACHE is False
    assert seen and set(seen) == {False}
    assert torch._dynamo.config.fake_tensor_cache_enabled == before


def test_the_model_code_digest_follows_the_rewrite_and_its_kernels(tmp_path):
    """``compile_options.model_code`` (what `--reuse` compares) is the same for the same
    sources wherever they lie, moves with a kernel's source (a tile table) or the rewrite,
    and not with the target's other modules (settings, the build's own code)."""
    from bundler.targets.torch_aoti import build

    here = Path(build.__file__).resolve().parent

    def copy_with(name: str, edit: str | None = None, file: str | None = None) -> Path:
        folder = tmp_path / name / "torch_aoti"
        shutil.copytree(here, folder, ignore=shutil.ignore_patterns("__pycache__"))
        if file is not None:
            path = folder / file
            path.write_text(path.read_text() + edit)
        return folder

    shipped = build.model_code_digest()
    assert shipped.startswith("sha256:") and len(shipped) == 71
    assert build.model_code_digest(copy_with("same")) == shipped
    tile = "\nMEASURED_TMA_TILES = {}\n"
    assert build.model_code_digest(copy_with("tiles", tile, "kernels/fp8_conv_tma.py")) != shipped
    assert build.model_code_digest(copy_with("rewrite", "\n# x\n", "fused.py")) != shipped
    assert build.model_code_digest(copy_with("settings", "\n# x\n", "settings.py")) == shipped
    details = build.engine_details({}, "fp16", {}, nhwc=False, fast_accum=False, padding={},
                                   batch_sizes=[1], seconds=None)
    assert details["compile_options"]["model_code"] == shipped
