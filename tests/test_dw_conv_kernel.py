"""The Triton depthwise convolution that writes an FP8 GEMM's e4m3 rows
(bundler/targets/torch_aoti/kernels/dw_conv.py) and the channels_last form that uses it
(``rewrite_channels_last(depthwise="triton")``).

No GPU here: the kernel runs under Triton's CPU interpreter in a child process
(tests/dw_conv_interpret.py) against ``DepthwiseE4m3``'s torch path; export and Dynamo show
the op reaches the graph AOTInductor compiles. Whether it is faster than cuDNN's depthwise
kernel plus the quantize pass is for `benchmarks/inductor_fp8_bench.py` on the H200
(variant ``fp8-cl-dwtriton``).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from runtime_py.errors import UsageError  # noqa: E402
import cpu_fp8_gemm  # noqa: E402
from triton_interpret import load_script, needs_triton, run_interpreted  # noqa: E402


@pytest.fixture(scope="module")
def interpreted():
    """The interpreter's results (tests/dw_conv_interpret.py), run once."""
    return run_interpreted("dw_conv_interpret.py")


@needs_triton
@pytest.mark.parametrize("case", [*load_script("dw_conv_interpret.py").CASES,
                                  *load_script("dw_conv_interpret.py").ROW_CASES])
def test_the_kernel_writes_the_layer_s_e4m3_codes_under_the_interpreter(interpreted, case):
    """3x3 and 5x5, stride 1 and 2, a ReLU after or before (on a bf16 view with wider rows,
    as a GEMM's raw output is), padded channels, partial tiles: the kernel's e4m3
    codes are the torch path's (conv2d in fp32, bias, fp16 rounding, QuantizeLinear) but
    for at most one in a thousand a step apart (fp32 sums in another order), and the
    padding channels are zeros."""
    r = interpreted[case]
    assert r["nonzero"] > r["total"] // 3, r          # the case is not trivially zeros
    assert r["differ"] <= r["total"] // 1000 and r["max_steps"] <= 1, r
    assert r["padding_zero"], r


@needs_triton
def test_the_op_is_exported_with_a_dynamic_batch_and_traced_to_the_kernel():
    """torch.export keeps ``trt_bundle::dw_conv_nhwc_e4m3`` as one op with a symbolic batch
    (what AOTInductor lowers to the Triton kernel), and Dynamo (fullgraph) with AOT
    autograd sees through it to the kernel launch."""
    from torch._dynamo.backends.common import aot_autograd

    from bundler.targets.torch_aoti.kernels.dw_conv import dw_conv_e4m3
    from bundler.targets.torch_aoti.nhwc_modules import DepthwiseE4m3

    layer = DepthwiseE4m3(nn.Conv2d(40, 40, 3, 2, 1, groups=40), 0.02, 48, relu=True)

    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, x):
            m = self.layer
            return dw_conv_e4m3(x, m.weight_taps, m.bias, m.act_scale, m.cpad, m.kernel,
                                m.stride, m.padding, m.dilation, relu=m.relu)

    x = torch.randn(2, 9, 9, 40, dtype=torch.float16)
    program = torch.export.export(Wrapper(), (x,), dynamic_shapes=(
        {0: torch.export.Dim("batch", min=1, max=32)},))
    calls = [n for n in program.graph.nodes if n.op == "call_function"
             and "dw_conv_nhwc_e4m3" in str(n.target)]
    assert len(calls) == 1
    out = calls[0].meta["val"]
    assert out.dtype == torch.float8_e4m3fn and tuple(out.shape[1:]) == (5, 5, 48)
    assert isinstance(out.shape[0], torch.SymInt)

    graphs = []

    def keep(graph, _inputs):
        graphs.append(graph)
        return graph.forward

    compiled = torch.compile(Wrapper(), backend=aot_autograd(fw_compiler=keep), fullgraph=True)
    try:
        compiled(x)
    except Exception:  # noqa: BLE001 - launching a GPU kernel on a CPU host
        pass
    assert len(graphs) == 1
    launches = [n for n in graphs[0].graph.nodes if "triton_kernel_wrapper" in str(n.target)]
    assert len(launches) == 1 and launches[0].kwargs["kwargs"]["RELU"] is True


def test_the_fp8_gemm_takes_e4m3_rows_as_they_are_and_refuses_a_wrong_width():
    """``Fp8Pointwise`` fed the e4m3 rows of ``DepthwiseE4m3`` computes what it computes
    from the fp16 convolution output it would quantize itself (the same codes)."""
    from bundler.targets.torch_aoti.fp8_layers import Fp8Pointwise
    from bundler.targets.torch_aoti.nhwc_modules import DepthwiseE4m3

    torch.manual_seed(0)
    dw, pw = nn.Conv2d(40, 40, 3, 1, 1, groups=40), nn.Conv2d(40, 24, 1)
    ws = (pw.weight.detach().abs().amax(dim=(1, 2, 3)) / 448).numpy()
    gemm = Fp8Pointwise(pw, 0.02, ws, torch.float16, emulate=True)
    fused = DepthwiseE4m3(dw, 0.02, gemm.kpad)
    x = torch.randn(2, 6, 6, 40).half()
    y16 = torch.nn.functional.conv2d(x.permute(0, 3, 1, 2).float(), fused.weight_nchw,
                                     fused.bias, padding=1, groups=40).half().permute(0, 2, 3, 1)
    rows = fused(x)
    assert rows.dtype == torch.float8_e4m3fn and rows.shape == (2, 6, 6, gemm.kpad) == (2, 6, 6, 48)
    assert torch.equal(gemm(rows), gemm(y16))
    with pytest.raises(UsageError, match="e4m3 input of 40 channels to an FP8 GEMM of 48"):
        gemm(rows[..., :40].contiguous())


def test_the_triton_form_refuses_the_fp8_depthwise_recipe_and_a_missing_triton(monkeypatch):
    from bundler.targets.torch_aoti import kernels
    from bundler.targets.torch_aoti.model import rewrite_channels_last

    model = nn.Sequential(nn.Conv2d(8, 8, 3, 1, 1, groups=8)).eval()
    with pytest.raises(UsageError, match="fp8-depthwise recipe quantizes them itself"):
        rewrite_channels_last(model, torch.float16, depthwise="triton", emulate=True,
                              fp8_depthwise={"0": (0.01, [0.01] * 8)})
    monkeypatch.setattr(kernels, "available", lambda: (False, "triton is missing (test)"))
    with pytest.raises(UsageError, match="triton is missing .test.*use depthwise cudnn"):
        rewrite_channels_last(model, torch.float16, depthwise="triton")


class SeparableConv2d(nn.Module):
    """timm's separable convolution after BatchNorm folding (the rule keys on the name)."""

    def __init__(self, cin: int, cout: int, stride: int = 1, relu: bool = True,
                 bn: bool = False) -> None:
        super().__init__()
        self.conv_dw = nn.Conv2d(cin, cin, 3, stride, 1, groups=cin)
        self.bn_dw = nn.BatchNorm2d(cin).eval() if bn else nn.Identity()
        self.act_dw = nn.ReLU() if relu else nn.Identity()
        self.conv_pw = nn.Conv2d(cin, cout, 1)
        self.bn_pw, self.act_pw = nn.Identity(), nn.Identity()

    def forward(self, x):
        x = self.conv_pw(self.act_dw(self.bn_dw(self.conv_dw(x))))
        return self.act_pw(self.bn_pw(x))


def _separable_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 24, 3, 1, 1), nn.ReLU(),
                          SeparableConv2d(24, 40, relu=True), nn.ReLU(),
                          SeparableConv2d(40, 48, stride=2, relu=False), nn.ReLU(),
                          SeparableConv2d(48, 32, bn=True),   # not folded: stays cuDNN's
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 5)).eval()
    fp8 = {p: (0.05, (model.get_submodule(p).weight.detach().abs().amax(dim=(1, 2, 3)) / 448)
                  .numpy()) for p in ("2.conv_pw", "4.conv_pw", "6.conv_pw")}
    return model, fp8


@pytest.mark.parametrize("emulate", [
    pytest.param(True, id="emulated"),
    pytest.param(False, id="scaled_mm", marks=pytest.mark.skipif(
        not cpu_fp8_gemm.rowwise_runs(), reason=cpu_fp8_gemm.ROWWISE_REASON))])
def test_the_rule_fuses_separable_convolutions_into_their_fp8_gemm_and_keeps_the_rest(emulate):
    """Each ``conv_dw`` whose ``conv_pw`` is an FP8 layer becomes ``DepthwiseE4m3`` (a ReLU
    between them moves into it); one with a BatchNorm left between stays cuDNN's. A ReLU
    of the Sequential right before such a layer moves into its load (``relu_in``), and a
    separable convolution before that ReLU hands its GEMM's raw bf16 output over
    (``raw_out``; with ``torch._scaled_mm``, whose CPU kernel takes rowwise scales from
    torch 2.14). The model computes what the cuDNN form computes (same codes, fp16 layers
    aside)."""
    from bundler.targets.torch_aoti.fp8_layers import Fp8Pointwise
    from bundler.targets.torch_aoti.model import rewrite_channels_last
    from bundler.targets.torch_aoti.nhwc_modules import (ChannelsLastView, DepthwiseE4m3,
                                                         EngineModule)

    model, fp8 = _separable_model()
    forms = {d: rewrite_channels_last(model, torch.float16, fp8=fp8, emulate=emulate,
                                      depthwise=d) for d in ("cudnn", "triton")}
    fused = {n: v.layer for n, v in forms["triton"].named_modules()
             if isinstance(v, ChannelsLastView) and isinstance(v.layer, DepthwiseE4m3)}
    assert {n: (m.relu, m.relu_in) for n, m in fused.items()} == {
        "2.conv_dw": (True, True), "4.conv_dw": (False, True)}
    triton = forms["triton"]
    assert [type(triton.get_submodule(k)) for k in ("1", "3", "5", "2.act_dw")] == [
        nn.Identity, nn.Identity, nn.ReLU, nn.Identity]
    assert isinstance(triton.get_submodule("6.conv_dw"), nn.Conv2d)
    gemms = {n: v.layer.raw_out for n, v in triton.named_modules()
             if isinstance(v, ChannelsLastView) and isinstance(v.layer, Fp8Pointwise)}
    assert gemms == {"2.conv_pw": True, "4.conv_pw": False, "6.conv_pw": False}
    x = torch.randn(2, 3, 12, 12)
    if not emulate:                          # the raw output is the GEMM's bf16
        probe = []
        hook = triton.get_submodule("2.conv_pw").register_forward_hook(
            lambda _m, _i, out: probe.append(out.dtype))
    with torch.no_grad():
        a, b = (EngineModule(forms[d], torch.float16, False, True)(x) for d in ("cudnn", "triton"))
    if not emulate:
        hook.remove()
        assert probe == [torch.bfloat16]
    assert float((a - b).abs().max()) <= 0.02 * float(a.abs().max())


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs torch with a CUDA GPU (none visible)")


@pytest.mark.gpu
@needs_cuda
@needs_triton
def test_gpu_the_triton_depthwise_form_compiles_with_aotinductor_and_matches_cudnn(tmp_path):
    """The bundle path: torch.export with a dynamic batch + AOTInductor launching the
    kernel from its cpp wrapper, against the eager cuDNN form of the same model, and the
    kernel on CUDA against ``DepthwiseE4m3``'s torch path on the CPU (the same codes)."""
    from bundler.targets.torch_aoti.build import compile_package, smoke_check
    from bundler.targets.torch_aoti.model import rewrite_channels_last
    from bundler.targets.torch_aoti.nhwc_modules import DepthwiseE4m3, EngineModule

    model, fp8 = _separable_model()
    forms = {d: EngineModule(rewrite_channels_last(model, torch.float16, fp8=fp8, depthwise=d),
                             torch.float16, False, True).cuda().eval()
             for d in ("cudnn", "triton")}
    path, _ = compile_package(forms["triton"], (3, 12, 12), {"min": 1, "max": 8}, "cuda",
                              {"max_autotune": False}, tmp_path / "dw.pt2")
    diffs = smoke_check(path, forms["cudnn"], (3, 12, 12), [1, 3, 8], "cuda")
    with torch.no_grad():
        scale = float(forms["cudnn"](torch.randn(4, 3, 12, 12, device="cuda")).abs().max())
    assert max(diffs.values()) <= 2e-2 * scale, diffs
    layer = DepthwiseE4m3(nn.Conv2d(728, 728, 3, 1, 1, groups=728), 0.02, 736, relu=True)
    x = torch.randn(2, 19, 19, 728).half()
    got = layer.cuda()(x.cuda()).cpu().view(torch.uint8)
    ref = layer.cpu()(x).view(torch.uint8)
    assert int((got != ref).sum()) <= got.numel() // 1000


@pytest.mark.gpu
@needs_cuda
@needs_triton
def test_gpu_the_triton_skip_form_compiles_with_aotinductor_and_matches_the_triton_form(
        tmp_path):
    """``depthwise="triton-skip"`` on two timm Xception blocks (a projected and an identity
    shortcut) whose 1x1 layers a table sends to the Triton GEMM: AOTInductor with a dynamic
    batch launches the fused op for them, and the package computes what the "triton" form
    (``torch._scaled_mm`` and a separate add) computes."""
    from timm.models.xception_aligned import XceptionModule

    from bundler.targets.torch_aoti.build import compile_package, smoke_check
    from bundler.targets.torch_aoti.model import rewrite_channels_last
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule, SkipAddBlock
    from bundler.torch_model import fold_batchnorm

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1),
                          XceptionModule(32, 64, stride=2, norm_layer=nn.BatchNorm2d),
                          XceptionModule(64, 64, norm_layer=nn.BatchNorm2d),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 5)).eval()
    fold_batchnorm(model)
    fp8 = {n: (0.05, (m.weight.detach().abs().amax(dim=(1, 2, 3)) / 448).numpy())
           for n, m in model.named_modules()
           if isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1)}
    table = {(64, 64, "skip"): (64, 64, 64, 4, 3, 8), (32, 64, "raw"): (64, 64, 64, 4, 3, 8)}
    forms = {d: EngineModule(rewrite_channels_last(model, torch.float16, fp8=fp8, depthwise=d,
                                                   triton_pointwise=table),
                             torch.float16, False, True).cuda().eval()
             for d in ("triton", "triton-skip")}
    skip = forms["triton-skip"]
    assert sum(isinstance(m, SkipAddBlock) for m in skip.modules()) == 2
    assert sum(getattr(m, "triton_tiles", None) is not None for m in skip.modules()) == 3
    path, _ = compile_package(skip, (3, 32, 32), {"min": 1, "max": 8}, "cuda",
                              {"max_autotune": False}, tmp_path / "skip.pt2")
    diffs = smoke_check(path, forms["triton"], (3, 32, 32), [1, 3, 8], "cuda")
    with torch.no_grad():
        scale = float(forms["triton"](torch.randn(4, 3, 32, 32, device="cuda")).abs().max())
    assert max(diffs.values()) <= 2e-2 * scale, diffs


def test_the_benchmark_lists_the_depthwise_layers_the_triton_form_replaces(capsys):
    """benchmarks/dw_conv_bench.py measures what ``rewrite_channels_last(depthwise="triton")``
    replaces in timm_xception: the 39 depthwise halves of its separable convolutions (26 of
    them 728 channels at 19x19), three with the exit block's ReLU; ``--list`` runs without
    a GPU."""
    import importlib
    import sys
    from pathlib import Path

    bench_dir = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if bench_dir not in sys.path:
        sys.path.insert(0, bench_dir)
    bench = importlib.import_module("dw_conv_bench")
    layers = dict(bench.xception_dw_layers())
    assert sum(layers.values()) == 39
    # 728 channels at 19x19: the middle flow's 8 blocks of 3 and the exit flow's first two;
    # the first of each block reads the block's fp16 sum (9), the others the GEMM before
    # them raw (bf16, 17); the ReLU before each moved into the load
    assert layers[(728, 19, 19, 1, False, True, True)] == 17
    assert layers[(728, 19, 19, 1, False, True, False)] == 9
    assert sum(n for k, n in layers.items() if k[4]) == 3          # the exit block's ReLU after
    assert sum(n for k, n in layers.items() if k[5]) == 36
    assert sum(n for k, n in layers.items() if k[6]) == 24
    assert bench.main(["--list"]) == 0
    assert "39 in" in capsys.readouterr().out


def test_the_exported_cuda_graph_of_timm_xception_has_the_passes_removed():
    """What AOTInductor would compile on the H200, exported here with fake CUDA tensors (no
    GPU needed): in the Triton form, the 39 depthwise layers are the op, cuDNN keeps only
    the stem's two convolutions, 4 quantize passes remain (the block shortcuts' FP8 inputs,
    against 43), 5 ReLUs (against 44), and the dtype conversions drop by the 39 quantizes'
    two each and the 24 GEMM outputs read raw. "triton-skip" moves the layers of the
    family's ``fp8_triton_pointwise`` to the Triton GEMM and 3 skip adds into its epilogue."""
    import collections

    import numpy as np
    from torch._subclasses.fake_tensor import FakeTensorMode

    from bundler.families import load_family
    from bundler.targets.torch_aoti.model import rewrite_channels_last
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule
    from bundler.torch_model import build_torch_model

    model = build_torch_model(load_family("timm_xception"), seed=0)
    fp8 = {n: (0.05, np.full(m.out_channels, 0.01, np.float32))
           for n, m in model.named_modules()
           if isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1)}
    ops = {}
    table = load_family("timm_xception").target_settings("torch-aoti").fp8_triton_pointwise
    for form in ("cudnn", "triton", "triton-skip"):
        body = rewrite_channels_last(model, torch.float16, fp8=fp8, depthwise=form,
                                     fp8_rows=2 * 150 * 150, triton_pointwise=table)
        module = EngineModule(body, torch.float16, False, True).eval()
        with FakeTensorMode(allow_non_fake_inputs=True):
            program = torch.export.export(module.to("cuda"),
                                          (torch.randn(2, 3, 299, 299, device="cuda"),))
        ops[form] = collections.Counter(str(n.target) for n in program.graph.nodes
                                        if n.op == "call_function")
    cudnn, triton = ops["cudnn"], ops["triton"]
    relus = lambda c: c["aten.relu.default"] + c["aten.relu_.default"]  # noqa: E731
    assert (cudnn["aten._scaled_mm.default"], triton["aten._scaled_mm.default"]) == (43, 43)
    assert (cudnn["trt_bundle.dw_conv_nhwc_e4m3.default"],
            triton["trt_bundle.dw_conv_nhwc_e4m3.default"]) == (0, 39)
    assert (cudnn["aten.conv2d.default"], triton["aten.conv2d.default"]) == (41, 2)
    assert (cudnn["aten.clamp.default"], triton["aten.clamp.default"]) == (43, 4)
    assert (relus(cudnn), relus(triton)) == (44, 5)
    assert cudnn["aten.to.dtype"] - triton["aten.to.dtype"] == 2 * 39 + 24
    # "triton-skip": the family table's 5 layers on the Triton GEMM (the fused op,
    # the only one launching it in the graph), 3 of them with their block's skip add
    skip = ops["triton-skip"]
    assert skip["aten._scaled_mm.default"] == 43 - 5
    assert skip["trt_bundle.fp8_conv_nhwc_fused.default"] == 5
    assert skip["trt_bundle.fp8_conv_nhwc.default"] == 0
    assert triton["aten.add.Tensor"] - skip["aten.add.Tensor"] == 3
    assert skip["trt_bundle.dw_conv_nhwc_e4m3.default"] == 39


@needs_triton
def test_the_kernel_builds_for_the_h200_without_spills(capsys):
    """``dw_conv_bench.py --ptxas``: every tile of both kernels, fp16 and bf16 input, with
    and without the ReLUs, compiles for sm_90a (Triton's compiler and its bundled ptxas, no GPU) and
    ptxas spills nothing."""
    import importlib
    import re
    import sys
    from pathlib import Path

    from bundler.targets.torch_aoti.kernels.dw_conv import DW_CONFIGS, DW_ROW_CONFIGS

    bench_dir = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if bench_dir not in sys.path:
        sys.path.insert(0, bench_dir)
    bench = importlib.import_module("dw_conv_bench")
    assert bench.main(["--ptxas"]) == 0
    out = capsys.readouterr().out
    spills = [int(n) for n in re.findall(r"spill\s+(\d+) B", out)]
    assert "FAILED" not in out and len(spills) == (len(DW_CONFIGS) + len(DW_ROW_CONFIGS)) * 6
    assert not any(spills), out
    # The 728-channel layers' input is read 16 bytes at a time (not 2), every tile.
    loads = [(int(w), int(n)) for w, n in re.findall(r"wide loads (\d+)/(\d+)", out)]
    assert len(loads) == len(spills) and all(w >= 0.6 * n for w, n in loads), out


def test_element_alignment_is_what_every_offset_shares():
    """ALIGN, the kernel's claim that its pointer offsets are multiples of it, must hold for
    every offset the wrapper passes (a wrong claim reads the wrong addresses on the GPU,
    which Triton's interpreter would not show)."""
    from bundler.targets.torch_aoti.kernels.dw_conv import element_alignment

    assert element_alignment(728, 728 * 19 * 19, 728 * 19, 728, 0, 0) == 8
    assert element_alignment(256, 256 * 75, 256, 0, 0) == 16
    assert element_alignment(728, 728, 728, 4, 0) == 4         # a view 4 elements in
    assert element_alignment(63, 63, 0, 0) == 1
    assert element_alignment(0, 0) == 16
    assert element_alignment(728, object()) == 1        # a symbolic offset: no claim


@needs_triton
def test_the_kernel_compiles_with_its_sizes_as_constants(tmp_path):
    """torch's analysis of which tensors a user Triton kernel writes (AOTInductor, at every
    build) compiles it with the integer arguments it can pin as constants. A hint Triton
    refuses on a constant made that analysis fail on the H200 ("assuming every input is
    mutated", with a traceback per call: 312 of them in one ``bundle make``), so the kernel
    must compile both ways: the sizes as arguments and as constants."""
    import sys
    from pathlib import Path

    from bundler.fp8 import E4M3_MAX
    from bundler.targets.torch_aoti.kernels import dw_conv

    bench_dir = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if bench_dir not in sys.path:
        sys.path.insert(0, bench_dir)
    from fp8_conv_bench import ptxas_resources

    kernel = dw_conv._dw_conv_nhwc_e4m3_kernel
    sizes = dict(P=32 * 361, H=19, W=19, C=728, HO=19, WO=19, CPAD=736,
                 stride_xn=728 * 361, stride_xh=728 * 19, stride_xw=728)
    consts = dict(sizes, KH=3, KW=3, SH=1, SW=1, PH=1, PW=1, DH=1, DW=1, RELU=False,
                  RELU_IN=True, QMAX=E4M3_MAX, ALIGN=8, BLOCK_P=64, BLOCK_C=64)
    pointers = {"x_ptr": "*bf16", "w_ptr": "*fp32", "bias_ptr": "*fp32",
                "q_ptr": "*fp8e4nv", "q_scale_ptr": "*fp32"}
    sig = {n: "constexpr" if n in consts else pointers[n] for n in kernel.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
             if n in pointers}
    res = ptxas_resources(kernel, sig, consts, attrs, dict(num_warps=4), 90, tmp_path)
    assert res.spill_bytes == "0" and res.wide_loads >= 0.6 * (res.wide_loads
                                                                + res.narrow_loads)


def test_a_recipe_that_quantizes_the_depthwise_layers_builds_them_the_cudnn_way():
    """timm_xception's fp8 form runs its depthwise layers with the Triton kernel, which the
    fp8-depthwise variant (depthwise layers quantized by the recipe) cannot use: that
    variant's build, its `bundle study` reuse check and the benchmark all get cuDNN's form
    from one function, instead of the rewrite's refusal."""
    from bundler.families import load_family
    from bundler.targets.torch_aoti.build import depthwise_form
    from bundler.targets.torch_aoti.model import rewrite_channels_last

    xception = load_family("timm_xception")
    assert xception.target_settings("torch-aoti").fp8_depthwise == "triton-skip"
    assert depthwise_form(xception, "fp8") == "triton-skip"
    assert depthwise_form(xception, "fp8", "fp8-depthwise") == "cudnn"
    assert depthwise_form(xception, "fp16") == "cudnn"
    model = nn.Sequential(nn.Conv2d(8, 8, 3, 1, 1, groups=8)).eval()
    form = depthwise_form(xception, "fp8", "fp8-depthwise")
    body = rewrite_channels_last(model, torch.float16, depthwise=form, emulate=True,
                                 fp8_depthwise={"0": (0.01, [0.01] * 8)})
    assert body is not None


def test_the_row_strip_tile_is_traced_to_its_own_kernel_with_a_symbolic_grid():
    """A stride-1 layer with ``DwConvConfig.rows``: Dynamo (fullgraph) with AOT autograd
    sees one launch of the row-strip kernel, its tile and strip as constants; a stride-2
    layer with the same config launches the pixel kernel."""
    from torch._dynamo.backends.common import aot_autograd

    from bundler.targets.torch_aoti.kernels.dw_conv import ROW_STRIP_CONFIG, dw_conv_e4m3
    from bundler.targets.torch_aoti.nhwc_modules import DepthwiseE4m3

    def launch_of(stride: int):
        layer = DepthwiseE4m3(nn.Conv2d(40, 40, 3, stride, 1, groups=40), 0.02, 48,
                              row_strips=True)

        def forward(x):
            return dw_conv_e4m3(x, layer.weight_taps, layer.bias, layer.act_scale, layer.cpad,
                                layer.kernel, layer.stride, layer.padding, layer.dilation,
                                config=ROW_STRIP_CONFIG)
        graphs = []

        def keep(graph, _inputs):
            graphs.append(graph)
            return graph.forward

        torch._dynamo.reset()
        compiled = torch.compile(forward, backend=aot_autograd(fw_compiler=keep),
                                 fullgraph=True)
        try:
            compiled(torch.randn(2, 9, 9, 40, dtype=torch.float16))
        except Exception:  # noqa: BLE001 - launching a GPU kernel on a CPU host
            pass
        launches = [n for n in graphs[0].graph.nodes if "triton_kernel_wrapper" in str(n.target)]
        assert len(launches) == 1
        return launches[0].kwargs["kwargs"]

    rows = launch_of(1)
    assert rows["ROWS"] == ROW_STRIP_CONFIG.rows and rows["BLOCK_W"] == ROW_STRIP_CONFIG.block_p
    pixels = launch_of(2)
    assert "ROWS" not in pixels and pixels["BLOCK_P"] == ROW_STRIP_CONFIG.block_p
