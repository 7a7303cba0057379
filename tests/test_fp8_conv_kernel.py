"""The Triton FP8 convolution (bundler/targets/torch_aoti/kernels/fp8_conv.py) and the switch
that makes the torch-aoti fp8 model use it (``fp8_conv``, ``$TRT_BUNDLE_FP8_CONV``).

No GPU here: the kernel's arithmetic and indexing run under Triton's CPU interpreter in a
child process (tests/fp8_conv_interpret.py); export shows that the op reaches the graph
that AOTInductor compiles. Its speed is benchmarks/fp8_conv_bench.py's on the H200.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from runtime_py.errors import UsageError  # noqa: E402
from family_copies import family_with  # noqa: E402
from triton_interpret import load_script, needs_triton, run_interpreted  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def interpreted():
    """The interpreter's results (tests/fp8_conv_interpret.py), run once."""
    return run_interpreted("fp8_conv_interpret.py")


def _interpreter_cases() -> list[str]:
    return list(load_script("fp8_conv_interpret.py").CASES)


@needs_triton
@pytest.mark.parametrize("case", _interpreter_cases())
def test_implicit_gemm_equals_conv2d_under_the_interpreter(interpreted, case):
    """3x3 and 1x1, stride 1 and 2, padding or none, channel counts that are not a multiple
    of the k tile, ReLU: the kernel's fp16 output equals conv2d in fp32 on the same operands
    times the scale plus the bias, to fp16 rounding."""
    if interpreted["fp8_error"]:
        print(f"this triton's interpreter does not run FP8 dots "
              f"({interpreted['fp8_error']}): checked with fp16 operands")
    assert interpreted["cases"][case] < 2e-3


@needs_triton
def test_the_triton_layer_equals_the_im2col_layer_under_the_interpreter(interpreted):
    """``Fp8ConvNHWC``'s two forms (its quantize, weight buffer, scales and bias) agree."""
    if interpreted["module"] is None:
        pytest.skip(f"this triton's interpreter does not run FP8 dots: "
                    f"{interpreted['fp8_error']}")
    assert interpreted["module"] < 2e-3


@needs_triton
def test_the_small_batch_pointwise_kernel_equals_the_gemm_under_the_interpreter(interpreted):
    """``Fp8Pointwise(small_batch_kernel="triton")``: the Triton 1x1 path (stride 2, padded
    channels) gives the GEMM path's output, zeros in the padded channels."""
    if interpreted["pointwise"] is None:
        pytest.skip(f"this triton's interpreter does not run FP8 dots: "
                    f"{interpreted['fp8_error']}")
    assert interpreted["pointwise"] < 2e-3


@needs_triton
def test_the_small_batch_linear_kernel_equals_the_gemm_under_the_interpreter(interpreted):
    """``Fp8Linear(small_batch_kernel="triton")``: a transformer's tokens through the Triton
    kernel as a 1x1 convolution over [rows, 1, 1, features] give the GEMM path's output."""
    if interpreted["linear"] is None:
        pytest.skip(f"this triton's interpreter does not run FP8 dots: "
                    f"{interpreted['fp8_error']}")
    assert interpreted["linear"] < 2e-3


@needs_triton
def test_the_split_k_linear_kernel_equals_the_gemm_under_the_interpreter(interpreted):
    """``Fp8Linear(small_batch_kernel="triton-split-k")``: the reduction split in two, the
    partial sums added, scaled and biased by the graph, gives the GEMM path's output."""
    if interpreted["linear_split_k"] is None:
        pytest.skip(f"this triton's interpreter does not run FP8 dots: "
                    f"{interpreted['fp8_error']}")
    assert interpreted["linear_split_k"] < 2e-3


@needs_triton
def test_the_split_k_form_splits_only_the_layers_whose_rows_leave_sms_idle():
    """ViT-B at a static batch of 1 (197 tokens): proj (768 -> 768) and fc2 (3072 -> 768)
    make 48 programs of 64x64 and are split in two (fc2 with 256-deep k tiles); qkv and fc1
    fill the GPU and keep the fused kernel; so does a short reduction. Traced for batch 1 on
    CUDA, a split layer's graph holds the split op and not the fused one."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from bundler.targets.torch_aoti.fp8_layers import Fp8Linear
    from bundler.targets.torch_aoti.kernels.fp8_split_k import linear_split_k_config

    assert linear_split_k_config(197, 768, 768) == (2, 64, 64, 128, 4, 3)
    assert linear_split_k_config(197, 3072, 768) == (2, 64, 64, 256, 4, 3)
    assert linear_split_k_config(197, 768, 2304) is None
    assert linear_split_k_config(197, 768, 3072) is None
    assert linear_split_k_config(197, 256, 768) is None
    assert linear_split_k_config(8 * 197, 768, 768) is None

    ops = []

    class Recorder(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(str(func.name()))
            return func(*args, **(kwargs or {}))

    for cin, cout in ((768, 768), (768, 2304)):
        ops.clear()
        layer = Fp8Linear(nn.Linear(cin, cout), 0.05, torch.full((cout,), 0.01).numpy(),
                          torch.float16, small_batch_kernel="triton-split-k")
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            layer = layer.to("cuda")
            with Recorder():
                y = layer(mode.from_tensor(torch.empty(1, 197, cin, dtype=torch.float16,
                                                       device="meta")).to("cuda"))
        assert tuple(y.shape) == (1, 197, cout) and y.dtype == torch.float16
        split = "trt_bundle::fp8_rows_partials" in ops
        fused = "trt_bundle::fp8_conv_nhwc_fused" in ops
        assert (split, fused) == ((True, False) if cout == 768 else (False, True)), ops


@needs_triton
def test_small_static_batches_trace_the_pointwise_kernel_and_others_the_gemm():
    """On CUDA inputs of a static batch of at most fp8_layers.SMALL_BATCH, the layer takes the
    Triton path (small tiles for its rows); a larger batch and a CPU input keep
    torch._scaled_mm. Fake CUDA tensors (FakeTensorMode) stand in for the GPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from bundler.targets.torch_aoti.kernels.fp8_conv import small_batch_config
    from bundler.targets.torch_aoti.fp8_layers import Fp8Pointwise, SMALL_BATCH

    conv = nn.Conv2d(64, 32, 1)
    ws = torch.full((32,), 0.01).numpy()
    layer = Fp8Pointwise(conv, 0.05, ws, torch.float16, small_batch_kernel="triton")
    calls = []
    layer.implicit_gemm = lambda x: calls.append(tuple(x.shape)) or x[..., :32]
    layer.matmul = lambda x: calls.append("gemm") or x[..., :32].reshape(-1, 32)
    with FakeTensorMode(allow_non_fake_inputs=True):
        for n in (1, SMALL_BATCH, SMALL_BATCH + 1):
            layer(torch.empty(n, 5, 5, 64, dtype=torch.float16, device="cuda"))
    layer(torch.zeros(1, 5, 5, 64, dtype=torch.float16))              # on the CPU
    assert calls == [(1, 5, 5, 64), (SMALL_BATCH, 5, 5, 64), "gemm", "gemm"]
    assert small_batch_config(728, 728, 361).block_m == 32
    assert small_batch_config(728, 728, 100).block_m == 16
    with pytest.raises(UsageError, match="small-batch pointwise kernel"):
        Fp8Pointwise(conv, 0.05, ws, torch.float16, small_batch_kernel="cudnn")


@needs_triton
def test_small_static_batches_trace_the_linear_kernel_and_others_the_gemm():
    """``Fp8Linear(small_batch_kernel="triton")``: a transformer's tokens at a static batch
    of at most SMALL_BATCH on CUDA take the Triton path, a larger batch and a CPU input the
    FP8 GEMM; its tiles are 64x64, with a deeper k tile for a long reduction (what ViT-B's
    shapes measured best at 197 and 394 rows)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from bundler.targets.torch_aoti.fp8_layers import SMALL_BATCH, Fp8Linear
    from bundler.targets.torch_aoti.kernels.fp8_conv import linear_small_batch_config

    linear = nn.Linear(64, 32)
    layer = Fp8Linear(linear, 0.05, torch.full((32,), 0.01).numpy(), torch.float16,
                      small_batch_kernel="triton")
    calls = []
    layer.implicit_gemm = lambda x: calls.append(tuple(x.shape)) or x[..., :32]
    layer.matmul = lambda x: calls.append("gemm") or x[..., :32].reshape(-1, 32)
    with FakeTensorMode(allow_non_fake_inputs=True):
        for n in (1, SMALL_BATCH, SMALL_BATCH + 1):
            layer(torch.empty(n, 7, 64, dtype=torch.float16, device="cuda"))
    layer(torch.zeros(1, 7, 64, dtype=torch.float16))                 # on the CPU
    assert calls == [(1, 7, 64), (SMALL_BATCH, 7, 64), "gemm", "gemm"]
    assert tuple(linear_small_batch_config(768)) == (64, 64, 128, 4, 3, 8)
    assert linear_small_batch_config(3072).block_k == 256


@needs_triton
def test_the_op_is_exported_with_a_dynamic_batch():
    """torch.export keeps ``trt_bundle::fp8_conv_nhwc`` as one op with a symbolic batch:
    what AOTInductor lowers to the Triton kernel (a GPU compiles it; none here)."""
    from bundler.targets.torch_aoti.fp8_layers import Fp8ConvNHWC

    conv = nn.Conv2d(32, 48, 3, 2, 1)
    layer = Fp8ConvNHWC(conv, 0.05, torch.full((48,), 0.01).numpy(), torch.float16,
                        conv_kernel="triton")

    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, x):
            return self.layer.implicit_gemm(x)

    x = torch.randn(2, 9, 9, 32, dtype=torch.float16)
    program = torch.export.export(Wrapper(), (x,), dynamic_shapes=(
        {0: torch.export.Dim("batch", min=1, max=32)},))
    calls = [n for n in program.graph.nodes if n.op == "call_function"
             and "fp8_conv_nhwc" in str(n.target)]
    assert len(calls) == 1
    out = calls[0].meta["val"]
    assert out.dtype == torch.float16 and tuple(out.shape[1:]) == (5, 5, 48)
    assert isinstance(out.shape[0], torch.SymInt)


@needs_triton
def test_torch_compile_traces_the_layer_into_one_graph_with_the_triton_kernel():
    """Dynamo (fullgraph: no break) and AOT autograd see through the op to the Triton
    kernel itself, as Inductor needs to compile it into its code (running it needs a
    GPU: the compiled call's failure on this CPU host is not what is checked)."""
    from torch._dynamo.backends.common import aot_autograd

    from bundler.targets.torch_aoti.fp8_layers import Fp8ConvNHWC

    conv = nn.Conv2d(32, 48, 3, 1, 1)
    layer = Fp8ConvNHWC(conv, 0.05, torch.full((48,), 0.01).numpy(), torch.float16,
                        conv_kernel="triton")

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, x):
            return torch.relu(self.layer.implicit_gemm(x))

    graphs = []

    def keep(graph, _inputs):
        graphs.append(graph)
        return graph.forward

    compiled = torch.compile(Block(), backend=aot_autograd(fw_compiler=keep), fullgraph=True)
    try:
        compiled(torch.randn(2, 6, 6, 32, dtype=torch.float16))
    except Exception:  # noqa: BLE001 - launching a GPU kernel on a CPU host
        pass
    assert len(graphs) == 1
    launches = [n for n in graphs[0].graph.nodes if "triton_kernel_wrapper" in str(n.target)]
    assert len(launches) == 1
    assert launches[0].kwargs["kwargs"]["KH"] == 3


# --- the switch -----------------------------------------------------------------------------

def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1),
                         nn.ReLU(), nn.Conv2d(32, 32, 1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 4)).eval()


def _scales(model: nn.Module, paths: list[str]) -> dict:
    modules = dict(model.named_modules())
    return {p: (0.01, (modules[p].weight.detach().abs().amax(dim=(1, 2, 3)) / 448).numpy())
            for p in paths}


def test_unknown_conv_kernels_are_refused_by_name():
    from bundler.targets.torch_aoti.fp8_layers import fp8_conv_kernel
    from bundler.targets.torch_aoti.model import rewrite_nhwc

    with pytest.raises(UsageError, match="'cudnn' is not one of im2col, triton"):
        fp8_conv_kernel("cudnn")
    model = _model()
    with pytest.raises(UsageError, match="im2col, triton"):
        rewrite_nhwc(model, torch.float16, fp8=_scales(model, ["2"]), fp8_conv="cudnn")


def test_emulated_models_keep_im2col_and_a_missing_triton_is_named(monkeypatch):
    from bundler.targets.torch_aoti import kernels
    from bundler.targets.torch_aoti.fp8_layers import fp8_conv_kernel

    assert fp8_conv_kernel("im2col") == "im2col"
    assert fp8_conv_kernel("triton", emulate=True) == "im2col"
    monkeypatch.setattr(kernels, "available", lambda: (False, "triton is missing (test)"))
    with pytest.raises(UsageError, match="triton is missing .test.*TRT_BUNDLE_FP8_CONV=im2col"):
        fp8_conv_kernel("triton")


@needs_triton
def test_the_rewrite_runs_dense_kxk_fp8_convs_on_the_kernel_and_1x1_on_the_gemm():
    from bundler.targets.torch_aoti.kernels.fp8_conv import default_config
    from bundler.targets.torch_aoti.fp8_layers import Fp8ConvNHWC, Fp8Pointwise
    from bundler.targets.torch_aoti.model import rewrite_nhwc

    model = _model()
    fp8 = _scales(model, ["2", "4"])
    body = rewrite_nhwc(model, torch.float16, fp8=fp8, fp8_conv="triton")
    assert isinstance(body[2], Fp8ConvNHWC) and body[2].conv_kernel == "triton"
    assert body[2].tiles == default_config(16, 32, (3, 3))
    assert isinstance(body[4], Fp8Pointwise)                 # no im2col there to replace
    assert type(body[0]).__name__ == "ConvNHWC"              # not selected: cuDNN, fp16
    emulated = rewrite_nhwc(model, torch.float16, fp8=fp8, fp8_conv="triton", emulate=True)
    assert emulated[2].conv_kernel == "im2col"
    assert rewrite_nhwc(model, torch.float16, fp8=fp8)[2].conv_kernel == "im2col"


@needs_triton
def test_the_kernel_epilogue_uses_the_graph_scales_and_the_fp16_bias():
    """conv_scale = activation scale x each channel's weight scale; bias_out = the fp16
    graph's bias in fp32 (the im2col GEMM gets it in bf16)."""
    from bundler.fp8 import stored_scale
    from bundler.targets.torch_aoti.fp8_layers import Fp8ConvNHWC

    conv = nn.Conv2d(16, 24, 3, 1, 1)
    with torch.no_grad():
        conv.bias.copy_(torch.linspace(-1.001, 1.001, 24))
    ws = (conv.weight.detach().abs().amax(dim=(1, 2, 3)) / 448).numpy()
    layer = Fp8ConvNHWC(conv, 0.0123, ws, torch.float16, conv_kernel="triton")
    expected = torch.from_numpy(stored_scale(ws)) * float(stored_scale(0.0123))
    assert torch.equal(layer.conv_scale[:24], expected)
    assert torch.equal(layer.bias_out, conv.bias.detach().half().float())


def test_the_build_option_defaults_to_im2col_and_reads_the_environment(monkeypatch):
    from bundler.targets.torch_aoti.build import FP8_CONV_ENV, default_fp8_conv

    monkeypatch.delenv(FP8_CONV_ENV, raising=False)
    assert default_fp8_conv() == "im2col"
    monkeypatch.setenv(FP8_CONV_ENV, "triton")
    assert default_fp8_conv() == "triton"
    assert default_fp8_conv("im2col") == "im2col"        # the caller's choice wins
    monkeypatch.setenv(FP8_CONV_ENV, "fast")
    with pytest.raises(UsageError, match=r"\$TRT_BUNDLE_FP8_CONV is 'fast'"):
        default_fp8_conv()


def test_fp8_details_name_the_conv_kernel():
    from bundler.targets.torch_aoti.build import engine_details

    host = {"torch_version": "2", "cuda_version": "13.0", "compute_capability": "9.0",
            "device_name": "H200", "device": "cuda"}
    common = dict(nhwc=True, fast_accum=False, padding={}, batch_sizes=[1], seconds=None)
    triton = engine_details(host, "fp8", {}, fp8_conv="triton", **common)
    assert "implicit-GEMM Triton" in triton["compile_options"]["fp8_conv"]
    im2col = engine_details(host, "fp8", {}, **common)
    assert im2col["compile_options"]["fp8_conv"].startswith("dense k x k FP8 convolutions: im2col")
    assert "fp8_conv" not in engine_details(host, "fp16", {}, **common)["compile_options"]


def test_conv_output_size_is_conv2d_s():
    from bundler.targets.torch_aoti.fp8_layers import conv_output_hw

    for k, s, p, d in [(3, 1, 1, 1), (3, 2, 1, 1), (1, 2, 0, 1), (5, 2, 2, 2), (7, 2, 3, 1)]:
        out = nn.Conv2d(1, 1, k, s, p, d)(torch.zeros(1, 1, 13, 10))
        assert conv_output_hw(13, 10, (k, k), (s, s), (p, p), (d, d)) == tuple(out.shape[2:])


def test_the_benchmark_lists_resnet50_s_quantized_convolutions():
    """benchmarks/fp8_conv_bench.py's shapes (it needs no timm) are timm resnet50's
    convolutions but the stem, at 224x224, with their counts (52: the family's)."""
    timm = pytest.importorskip("timm")
    spec = importlib.util.spec_from_file_location("fp8_conv_bench",
                                                  ROOT / "benchmarks" / "fp8_conv_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    model = timm.create_model("resnet50", pretrained=False).eval()
    found: dict = {}

    def count(conv, inputs, _out):
        key = (inputs[0].shape[1], conv.out_channels, inputs[0].shape[2], conv.kernel_size[0],
               conv.stride[0], conv.padding[0])
        found[key] = found.get(key, 0) + 1

    hooks = [m.register_forward_hook(count) for name, m in model.named_modules()
             if isinstance(m, nn.Conv2d) and name != "conv1"]
    with torch.no_grad():
        model.to("meta")(torch.empty(1, 3, 224, 224, device="meta"))
    for h in hooks:
        h.remove()
    assert found == bench.RESNET50_CONVS
    assert sum(found.values()) == 52



def test_the_family_picks_the_conv_kernel_and_the_environment_overrides_it(monkeypatch,
                                                                          tmp_path):
    """family.json torch_aoti.fp8_conv is the default of the family's fp8 builds;
    $TRT_BUNDLE_FP8_CONV overrides it for one build; an unknown name is refused at load."""
    from bundler.families import FamilyError, load_family
    from bundler.targets.torch_aoti.build import FP8_CONV_ENV, default_fp8_conv

    assert load_family("timm_resnet50").target_settings("torch-aoti").fp8_conv == "triton-fused-tma-small"
    assert load_family("timm_xception").target_settings("torch-aoti").fp8_conv == "im2col"     # no key: im2col
    monkeypatch.delenv(FP8_CONV_ENV, raising=False)
    assert default_fp8_conv(None, "triton-fused") == "triton-fused"
    assert default_fp8_conv("triton", "triton-fused") == "triton"          # the caller's
    monkeypatch.setenv(FP8_CONV_ENV, "im2col")
    assert default_fp8_conv(None, "triton-fused") == "im2col"              # one build's
    monkeypatch.delenv(FP8_CONV_ENV)
    with pytest.raises(UsageError, match="the family's torch_aoti.fp8_conv is 'fast'"):
        default_fp8_conv(None, "fast")

    with pytest.raises(FamilyError, match=r"torch_aoti.fp8_conv: must be one of"):
        family_with(tmp_path, "timm_resnet50", fp8_conv="cudnn")


def test_the_family_setting_of_the_fused_stem_is_checked_and_recorded(tmp_path):
    """family.json torch_aoti.fp8_fuse_stem: timm_resnet50 fuses its stem, the others do
    not; a value that is not a boolean, or the setting without a fused fp8_conv form, is
    refused at load; engine details record the stem only where the model had one fused."""
    from bundler.families import FamilyError, load_family
    from bundler.targets.torch_aoti.build import STEM_DESCRIPTION, engine_details

    assert load_family("timm_resnet50").target_settings("torch-aoti").fp8_fuse_stem is True
    assert load_family("timm_xception").target_settings("torch-aoti").fp8_fuse_stem is False
    with pytest.raises(FamilyError, match=r"torch_aoti.fp8_fuse_stem: must be true or false"):
        family_with(tmp_path, "timm_resnet50", fp8_fuse_stem="yes")
    with pytest.raises(FamilyError, match=r"fp8_fuse_stem: the stem is fused only in the "
                                          r"fused bottleneck forms"):
        family_with(tmp_path, "timm_resnet50", fp8_fuse_stem=True, fp8_conv="triton")

    def details(fused_stem: bool) -> dict:
        return engine_details({}, "fp8", {}, nhwc=False, fast_accum=False, padding={},
                              batch_sizes=[1], seconds=None, fp8_conv="triton-fused",
                              channels_last=True, fused_stem=fused_stem)["compile_options"]

    assert details(True)["fp8_stem"] == STEM_DESCRIPTION
    assert "fp8_stem" not in details(False)


def test_only_a_model_with_a_fused_stem_is_recorded_as_one():
    """``has_fused_stem``: the build records ``fp8_stem`` from the module it compiles, so a
    family that asks for the stem but whose model has none that ``stem_parts`` takes is
    not said to run one."""
    from torch import nn

    from bundler.targets.torch_aoti.build import has_fused_stem
    from bundler.targets.torch_aoti.fused import StemPool

    conv = nn.Conv2d(3, 8, 7, 2, 3)
    assert has_fused_stem(nn.Sequential(nn.Identity(), StemPool(conv, 0.01, out16=False)))
    assert not has_fused_stem(nn.Sequential(conv, nn.ReLU(), nn.MaxPool2d(3, 2, 1)))


def test_the_family_setting_of_small_batch_pointwise_is_checked_and_recorded(tmp_path):
    """family.json torch_aoti.fp8_pointwise_small_batch: "gemm" unless named, an unknown
    name refused at load; a package built with "triton" says so in its manifest details."""
    from bundler.families import FamilyError, load_family
    from bundler.targets.torch_aoti.build import engine_details

    def setting(family) -> str:
        return family.target_settings("torch-aoti").fp8_pointwise_small_batch

    assert setting(load_family("timm_resnet50")) == "gemm"
    edited = family_with(tmp_path, "timm_xception", fp8_pointwise_small_batch="triton")
    assert setting(edited) == "triton"
    with pytest.raises(FamilyError, match=r"torch_aoti.fp8_pointwise_small_batch: must be one of"):
        family_with(tmp_path, "timm_xception", fp8_pointwise_small_batch="cublas")
    # the split form is the Linear layers' (a tokens family's), not a convolution family's
    with pytest.raises(FamilyError, match=r"triton-split-k is the Linear layers' form"):
        family_with(tmp_path, "timm_xception", fp8_pointwise_small_batch="triton-split-k")
    assert setting(family_with(tmp_path, "timm_vit_base",
                                      fp8_pointwise_small_batch="triton-split-k")) == "triton-split-k"

    host = {"torch_version": "2", "cuda_version": "13.0", "compute_capability": "9.0",
            "device_name": "H200", "device": "cuda"}
    common = dict(nhwc=True, fast_accum=False, padding={}, batch_sizes=[1], seconds=None,
                  static_batches=[1])
    with_triton = engine_details(host, "fp8", {}, small_batch_pointwise="triton", **common)
    assert "small tiles" in with_triton["compile_options"]["fp8_pointwise_small_batch"]
    split = engine_details(host, "fp8", {}, small_batch_pointwise="triton-split-k", **common)
    assert "split in two" in split["compile_options"]["fp8_pointwise_small_batch"]
    assert "fp8_pointwise_small_batch" not in engine_details(host, "fp8", {}, **common)[
        "compile_options"]
    # where it applies, for builds and for bundle study's reuse check alike
    from bundler.targets.torch_aoti.build import effective_small_batch_pointwise as applies

    assert applies("triton", "fp8", [1]) == "triton"
    assert applies("triton", "fp8", [16, 32]) == "gemm"            # no small static graph
    assert applies("triton", "fp8", [1], fp8_conv="triton-fused") == "gemm"  # no Fp8Pointwise
    assert applies("triton", "fp16", [1]) == "gemm"
    # a tokens family's Linear layers (layout as_is) take the small-batch form too
    assert applies("dequantized", "fp8", [1], layout="as_is") == "dequantized"
    assert applies("dequantized", "fp8", [1], layout="as_is", fp8_conv="triton-fused") == \
        "dequantized"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with a CUDA GPU (none visible)")
@needs_triton
def test_gpu_the_split_k_linear_compiles_at_a_static_batch_and_matches_the_unsplit_form():
    """ViT-B's fc2 (3072 -> 768) at a static batch of 1 and 2, compiled as a package's
    static graph is (``torch.compile(dynamic=False)``), residual add after it as in the
    block: the split form (two fp32 partial sums, added by Inductor) against the fused
    kernel on the same FP8 operands, to fp16 rounding."""
    torch.manual_seed(0)
    from bundler.targets.torch_aoti.fp8_layers import Fp8Linear

    fc = nn.Linear(3072, 768)
    ws = (fc.weight.detach().abs().amax(1) / 448).numpy()
    forms = {k: Fp8Linear(fc, 0.01, ws, torch.float16, gemm="rowwise-fp16",
                          small_batch_kernel=k).cuda().eval()
             for k in ("triton", "triton-split-k")}

    def block(layer):
        return torch.compile(lambda x, r: r + layer(x), dynamic=False)

    for n in (1, 2):
        x = torch.randn(n, 197, 3072, device="cuda").half()
        r = torch.randn(n, 197, 768, device="cuda").half()
        with torch.no_grad():
            got = block(forms["triton-split-k"])(x, r).float()
            ref = block(forms["triton"])(x, r).float()
        assert float((got - ref).abs().max() / ref.abs().max()) < 2e-3, n
