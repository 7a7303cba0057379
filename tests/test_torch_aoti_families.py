"""The torch-aoti model rewrite for the families beyond Xception, on the CPU: ResNet-50's
NHWC rewrite (its MaxPool2d included) equals the model, FP8 k x k convolutions and FP8
Linear layers are the dequantized FP8 math of the ONNX graph's Q/DQ, and the fp8 engine
models of both families build from make's layer selection (the GPU runs use the same
modules with torch._scaled_mm instead of the fp32 emulation)."""

from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from bundler.families import load_family  # noqa: E402
from bundler.fp8 import quantize, stored_scale  # noqa: E402
from runtime_py.errors import UsageError  # noqa: E402

import cpu_fp8_gemm  # noqa: E402


def _dequantized(w: torch.Tensor, scales: np.ndarray, axis: int = 0) -> torch.Tensor:
    """What the ONNX graph's weight DequantizeLinear gives: fp16 kernel, stored scales."""
    s = stored_scale(scales)
    shape = [1] * w.dim()
    shape[axis] = -1
    q = quantize(w.detach().half().float().numpy(), s.reshape(shape)).astype(np.float32)
    return torch.from_numpy(q * s.reshape(shape))


def _fake_quant(x: torch.Tensor, scale: float) -> torch.Tensor:
    s = float(stored_scale(scale))
    return torch.from_numpy(quantize(x.half().float().numpy(), np.float32(s)).astype(np.float32) * s)


@pytest.fixture(scope="module")
def resnet():
    from bundler.torch_model import build_torch_model

    return build_torch_model(load_family("timm_resnet50"), seed=0)


def test_resnet_nhwc_rewrite_equals_the_model_maxpool_included(resnet):
    from bundler.targets.torch_aoti.model import check_rewrite, rewrite_nhwc
    from bundler.targets.torch_aoti.nhwc_modules import NCHWView

    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    assert check_rewrite(resnet, x) < 1e-4
    body = rewrite_nhwc(resnet, torch.float32)
    assert isinstance(body.maxpool, NCHWView)


@pytest.mark.parametrize("stride,padding", [(1, 1), (2, 1)])
def test_fp8_conv_nhwc_is_dequantized_fp8_math(stride, padding):
    from bundler.targets.torch_aoti.fp8_layers import Fp8ConvNHWC

    gen = torch.Generator().manual_seed(stride)
    conv = torch.nn.Conv2d(32, 48, 3, stride=stride, padding=padding).requires_grad_(False)
    x = torch.randn(2, 32, 9, 9, generator=gen).abs().half().float()   # the fp16 graph's input
    w_scale = conv.weight.abs().amax(dim=(1, 2, 3)).numpy() / 448
    act_scale = float(x.abs().max()) / 448
    module = Fp8ConvNHWC(conv, act_scale, w_scale, torch.float32, emulate=True)
    got = module(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    ref = torch.nn.functional.conv2d(_fake_quant(x, act_scale), _dequantized(conv.weight, w_scale),
                                     conv.bias.half().float(), stride=stride, padding=padding)
    assert torch.allclose(got, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))


def test_fp8_linear_is_dequantized_fp8_math_over_tokens():
    from bundler.targets.torch_aoti.fp8_layers import Fp8Linear

    gen = torch.Generator().manual_seed(3)
    linear = torch.nn.Linear(64, 96).requires_grad_(False)
    x = torch.randn(2, 5, 64, generator=gen).half().float()
    w_scale = linear.weight.abs().amax(dim=1).numpy() / 448
    act_scale = float(x.abs().max()) / 448
    got = Fp8Linear(linear, act_scale, w_scale, torch.float32, emulate=True)(x)
    ref = _fake_quant(x, act_scale) @ _dequantized(linear.weight, w_scale).t() + linear.bias.half().float()
    assert got.shape == (2, 5, 96)
    assert torch.allclose(got, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))


def _unit_scales(model, paths):
    """Per-layer scales from the kernels (amax/448) and a generous activation scale."""
    modules = dict(model.named_modules())
    return {p: (0.05, modules[p].weight.detach().reshape(modules[p].weight.shape[0], -1)
                .abs().amax(dim=1).numpy() / 448) for p in paths}


def test_resnet_fp8_engine_model_quantizes_every_conv_but_the_stem(resnet):
    from bundler.targets.torch_aoti import engine_model
    from bundler.targets.torch_aoti.fp8_layers import Fp8ConvNHWC, Fp8Pointwise
    from bundler.targets.torch_aoti.nhwc_modules import ConvNHWC

    paths = [n for n, m in resnet.named_modules() if isinstance(m, torch.nn.Conv2d) and n != "conv1"]
    assert len(paths) == 52                          # the family's fp8 expected_count
    module, _padding = engine_model(resnet, "fp8", _unit_scales(resnet, paths))
    kinds = [type(m) for m in module.modules()]
    assert kinds.count(Fp8ConvNHWC) == 16 and kinds.count(Fp8Pointwise) == 36
    assert isinstance(module.body.conv1, ConvNHWC)


def test_vit_fp8_engine_model_keeps_its_layout_and_quantizes_the_block_linears():
    from bundler.targets.torch_aoti import engine_model
    from bundler.targets.torch_aoti.fp8_layers import Fp8Linear
    from bundler.torch_model import build_torch_model

    family = load_family("timm_vit_base")
    assert family.target_settings("torch-aoti").layout == "as_is"
    vit = build_torch_model(family, seed=0)
    paths = [n for n, m in vit.named_modules()
             if isinstance(m, torch.nn.Linear) and n.startswith("blocks.")]
    assert len(paths) == 48
    module, padding = engine_model(vit, "fp8", _unit_scales(vit, paths), layout="as_is",
                                   input_shape=family.input.shape, max_batch=2)
    assert padding == {} and not module.nhwc
    fp8 = [m for m in module.modules() if isinstance(m, Fp8Linear)]
    assert len(fp8) == 48 and all(m._ones.rows == 2 * 197 for m in fp8)
    assert isinstance(module.body.head, torch.nn.Linear) and module.body.head.weight.dtype == torch.float16


@pytest.mark.parametrize("patch, size, bias", [((16, 16), (32, 48), True),
                                                ((16, 8), (35, 33), False),
                                                ((4, 4), (8, 8), True)])
def test_patch_gemm_is_the_patchifying_convolution(patch, size, bias):
    """A convolution whose kernel is its stride, as one GEMM over the patches: the same
    output (rows and columns that fill no patch dropped, as the convolution drops them),
    NCHW, and laid out so that timm's flatten(2).transpose(1, 2) after it is a view."""
    from bundler.targets.torch_aoti.nhwc_modules import PatchGemm

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 24, patch, stride=patch, bias=bias).eval()
    x = torch.randn(2, 3, *size)
    gemm = PatchGemm(conv)
    with torch.no_grad():
        want, got = conv(x), gemm(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.flatten(2).transpose(1, 2).is_contiguous()


def test_only_patchifying_convolutions_become_gemms():
    from bundler.targets.torch_aoti.nhwc_modules import PatchGemm, is_patchify

    conv = torch.nn.Conv2d
    assert is_patchify(conv(3, 8, 16, stride=16)) and is_patchify(conv(3, 8, (2, 4), stride=(2, 4)))
    for other in (conv(3, 8, 16, stride=8), conv(3, 8, 3, stride=3, padding=1),
                  conv(4, 8, 2, stride=2, groups=2), conv(3, 8, 2, stride=2, dilation=2),
                  conv(3, 8, 1, padding="same"), torch.nn.Linear(3, 8)):
        assert not is_patchify(other), other
    with pytest.raises(UsageError, match="patches"):
        PatchGemm(conv(3, 8, 3, stride=1))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_vit_engine_model_runs_its_patch_embedding_as_one_gemm(precision):
    """timm_vit_base's engine model (every precision: the rewrite is rewrite_as_is's) has
    no convolution left: its 16x16/16 patch embedding is a PatchGemm, and the model's
    output is the timm model's (fp32 here: the CPU's fp16 convolution is the reference
    that is slow, not the one that is exact)."""
    from bundler.targets.torch_aoti import engine_model
    from bundler.targets.torch_aoti.nhwc_modules import PatchGemm
    from bundler.torch_model import build_torch_model

    family = load_family("timm_vit_base")
    vit = build_torch_model(family, seed=0)
    module, _ = engine_model(vit, precision, layout="as_is")
    assert isinstance(module.body.patch_embed.proj, PatchGemm)
    assert not any(isinstance(m, torch.nn.Conv2d) for m in module.modules())
    if precision == "fp32":
        x = torch.randn(2, *family.input.shape, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            torch.testing.assert_close(module(x), vit(x), rtol=1e-4, atol=1e-4)


def test_patch_gemm_exports_with_a_dynamic_batch():
    """The engine model with its PatchGemm exports as the package does (torch.export, the
    batch dimension dynamic) and the exported program computes the model at another
    batch: the patches' reshape holds no batch size of its own."""
    from torch.export import Dim, export

    from bundler.targets.torch_aoti.model import rewrite_as_is
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule

    vit = _tiny_vit()
    module = EngineModule(rewrite_as_is(vit, torch.float32), torch.float32, False).eval()
    program = export(module, (torch.randn(2, 3, 32, 32),),
                     dynamic_shapes=({0: Dim("batch", min=1, max=32)},))
    x = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), vit(x), rtol=1e-4, atol=1e-4)


def test_resnet_fp16_engine_is_the_model_in_channels_last_memory(resnet):
    """family.json torch_aoti.fp16_layout "channels_last": the fp16 engine is the model as it
    is, channels_last, the form a torch.compile user runs (no NHWC rewrite)."""
    from bundler.families import load_family
    from bundler.targets.torch_aoti import engine_model

    assert load_family("timm_resnet50").target_settings("torch-aoti").fp16_layout == "channels_last"
    assert load_family("timm_xception").target_settings("torch-aoti").fp16_layout == "channels_last"
    module, padding = engine_model(resnet, "fp32", nhwc=False, channels_last=True)
    assert padding == {} and module.channels_last and not module.nhwc
    assert module.body.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.allclose(module(x), resnet(x), rtol=1e-4, atol=1e-3)


def test_the_cudnn_timing_setting_is_checked_recorded_and_reused_by(tmp_path):
    """family.json torch_aoti.cudnn_benchmark: true, false (the default), or the batch sizes
    whose graphs time cuDNN (timm_xception: 32 only; its smaller graphs ran slower timed);
    anything else is refused at load. ``compile_options.cudnn_benchmark`` is written only
    when on, the sizes ascending (the runner reads it), and ``--reuse`` rebuilds a bundle
    of any precision whose record differs from the family's setting."""
    from bundler.families import FamilyError
    from bundler.make import MakeRequest
    from bundler.targets.torch_aoti.build import engine_details
    from bundler.targets.torch_aoti.reuse import reuse_checks
    from family_copies import family_with

    for n, bad in enumerate(("on", [], [0], [32, 32], [1.5], [True], None)):
        with pytest.raises(FamilyError, match=r"torch_aoti.cudnn_benchmark: must be true, "
                                              r"false, or a list of the batch sizes"):
            family_with(tmp_path / f"bad{n}", "timm_resnet50", cudnn_benchmark=bad)

    def options(on) -> dict:
        return engine_details({}, "fp16", {}, nhwc=False, fast_accum=False, padding={},
                              batch_sizes=[1], seconds=None, channels_last=True,
                              cudnn_benchmark=on)["compile_options"]

    assert options(True)["cudnn_benchmark"] is True
    assert "cudnn_benchmark" not in options(False)
    assert options((16, 32))["cudnn_benchmark"] == [16, 32]
    on = family_with(tmp_path / "on", "timm_resnet50", cudnn_benchmark=True)
    off = family_with(tmp_path / "off", "timm_resnet50", cudnn_benchmark=False)
    sized = family_with(tmp_path / "sized", "timm_resnet50", cudnn_benchmark=[32, 8])
    assert on.target_settings("torch-aoti").cudnn_benchmark is True
    assert sized.target_settings("torch-aoti").cudnn_benchmark == (8, 32)
    key = "cuDNN algorithms timed"
    for precision in ("fp32", "fp16", "fp8"):
        req = MakeRequest(family="timm_resnet50", precision=precision, random_weights=True)
        timed, plain = {"compile_options": options(True)}, {"compile_options": options(False)}
        at = {"compile_options": options((8, 32))}
        assert reuse_checks(timed, on, req)[key] == (True, True)
        assert reuse_checks(plain, on, req)[key] == (False, True)
        assert reuse_checks(timed, off, req)[key] == (True, False)
        assert reuse_checks(plain, off, req)[key] == (False, False)
        assert reuse_checks(at, sized, req)[key] == ([8, 32], [8, 32])
        assert reuse_checks(timed, sized, req)[key] == (True, [8, 32])
        assert reuse_checks(at, on, req)[key] == ([8, 32], True)


def test_resnet_fp8_pointwise_variant_keeps_the_3x3_convolutions_fp16(resnet):
    from bundler.families import load_family
    from bundler.targets.torch_aoti import engine_model
    from bundler.targets.torch_aoti.fp8_layers import Fp8ConvNHWC, Fp8Pointwise
    from bundler.targets.torch_aoti.nhwc_modules import ConvNHWC

    recipe = load_family("timm_resnet50").recipe("fp8-pointwise")
    assert recipe["expected_count"] == 36
    paths = [n for n, m in resnet.named_modules() if isinstance(m, torch.nn.Conv2d)
             and n != "conv1" and m.kernel_size == (1, 1)]
    module, _padding = engine_model(resnet, "fp8", _unit_scales(resnet, paths))
    kinds = [type(m) for m in module.modules()]
    assert kinds.count(Fp8ConvNHWC) == 0 and kinds.count(Fp8Pointwise) == 36
    assert kinds.count(ConvNHWC) == 17                # the stem and the 16 3x3 convolutions



def _tiny_vit():
    import timm

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return timm.create_model("vit_base_patch16_224", pretrained=False, depth=1, embed_dim=64,
                                 num_heads=2, img_size=32, num_classes=10).eval()


def _inductor_code(gemm: str, batch: int = 2, small_batch: str = "gemm") -> str:
    """The code Inductor generates (CPU codegen, which fuses as the GPU's does) for one ViT
    block of the fp8 engine model with FP8 GEMM mode ``gemm``, compiled for a static
    ``batch`` with the small-batch form ``small_batch``. Generated, not run: the CPU kernel
    of torch 2.11's ``_scaled_mm`` refuses the rowwise scales the GPU takes
    (tests/cpu_fp8_gemm.py), and the code is the same either way."""
    from torch._inductor.utils import get_code

    from bundler.targets.torch_aoti.model import rewrite_as_is
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule

    vit = _tiny_vit()
    fp8 = {n: (0.01, m.weight.detach().abs().amax(1).numpy() / 448)
           for n, m in vit.named_modules() if isinstance(m, torch.nn.Linear) and n.startswith("blocks.")}
    module = EngineModule(rewrite_as_is(vit, torch.float16, fp8=fp8, fp8_gemm=gemm,
                                        fp8_rows=max(batch, 2) * 5,
                                        small_batch_pointwise=small_batch),
                          torch.float16, False)
    try:
        with torch.no_grad():
            codes = get_code(torch.compile(module, dynamic=False),
                             torch.randn(batch, 3, 32, 32))
    finally:
        torch._dynamo.reset()
    return "\n".join(codes)


def _inductor_kernels(gemm: str, batch: int = 2, small_batch: str = "gemm") -> list[str]:
    """Names of the kernels in ``_inductor_code``."""
    code = _inductor_code(gemm, batch, small_batch)
    return sorted(set(re.findall(r"\b(cpp_fused_\w+|triton_\w+)\(", code)))


def test_vit_fp8_quantizes_fuse_and_fp16_out_removes_the_attention_convert():
    """What Inductor makes of a ViT block's FP8 GEMMs: every quantize (its clamp) lands in the
    kernel of the op before it (LayerNorm, GELU, the attention output's transpose), none is
    a pass of its own; with bf16 GEMM output the qkv output takes a convert pass before the
    attention (which Inductor cannot fuse into), with "rowwise-fp16" that pass is gone."""
    for gemm in ("rowwise", "rowwise-fp16"):
        kernels = _inductor_kernels(gemm)
        quantizing = [k for k in kernels if "clamp" in k]
        assert len(quantizing) == 4, kernels                  # qkv, proj, fc1, fc2 inputs
        assert all(any(op in k for op in ("native_layer_norm", "gelu", "transpose"))
                   for k in quantizing), kernels
        converts = [k for k in kernels if "scaled_dot_product" in k]
        assert len(converts) == (1 if gemm == "rowwise" else 0), kernels


def test_fp8_linear_small_static_batches_run_dequantized_and_others_the_fp8_gemm():
    """``Fp8Linear(small_batch_kernel="dequantized")``: a batch of at most ``SMALL_BATCH``
    that is a plain int (eager, or a graph traced for a static batch) takes the fp16 GEMM
    on the same FP8 operands, bit for bit the "dequantized" mode; a larger one, or a
    symbolic batch (the dynamic graph), the layer's FP8 GEMM. "triton" is that kernel on
    CUDA only (tests/test_fp8_conv_kernel.py): on the CPU its layer is the FP8 GEMM's."""
    from torch.export import Dim, export

    from bundler.targets.torch_aoti import fp8_layers as tam

    gen = torch.Generator().manual_seed(3)
    linear = torch.nn.Linear(40, 24)
    w_scale = linear.weight.detach().abs().amax(1).numpy() / 448
    make = lambda **kw: tam.Fp8Linear(linear, 0.05, w_scale, torch.float16, **kw)  # noqa: E731
    gemm = cpu_fp8_gemm.gemm_mode_that_runs_here()
    small = make(gemm=gemm, small_batch_kernel="dequantized")
    dequantized, fp8 = make(gemm="dequantized"), make(gemm=gemm)
    for n in (1, tam.SMALL_BATCH, tam.SMALL_BATCH + 1):
        x = torch.randn(n, 5, 40, generator=gen).half()
        want = dequantized(x) if n <= tam.SMALL_BATCH else fp8(x)
        assert torch.equal(small(x), want), n
    assert not torch.equal(dequantized(x), fp8(x))        # the two forms are told apart
    calls = []
    small.dequantized_matmul = lambda q: calls.append("dequantized")
    export(small, (torch.randn(2, 5, 40).half(),),
           dynamic_shapes=({0: Dim("batch", min=1, max=32)},))
    assert calls == []
    assert make(emulate=True, small_batch_kernel="dequantized").small_batch_kernel == "gemm"
    on_triton = make(gemm=gemm, small_batch_kernel="triton")
    x = torch.randn(1, 5, 40, generator=gen).half()
    assert torch.equal(on_triton(x), fp8(x))
    assert torch.equal(on_triton.conv_scale, on_triton.weight_scale_row[0] * on_triton.act_scale)
    assert not hasattr(small, "conv_scale")           # a buffer of the Triton form only
    with pytest.raises(UsageError, match="Linear layer: choose gemm or triton or dequantized"):
        make(small_batch_kernel="cudnn")


def test_vit_small_batch_graph_compiles_without_fp8_gemms_and_keeps_the_quantize_fused():
    """Compiled for static batch 1 with the dequantized small-batch form, a ViT block has no
    ``_scaled_mm`` left and every quantize still lands in the kernel of the op before it (no
    pass of its own), and no convolution (the patch embedding is one GEMM); compiled for a
    batch above ``SMALL_BATCH`` it keeps the FP8 GEMMs."""
    from bundler.targets.torch_aoti.fp8_layers import SMALL_BATCH

    one = _inductor_code("rowwise-fp16", batch=1, small_batch="dequantized")
    assert "_scaled_mm" not in one
    assert "convolution" not in one                     # the patch embedding: a PatchGemm
    kernels = sorted(set(re.findall(r"\b(cpp_fused_\w+|triton_\w+)\(", one)))
    # its patches: one permute, in the kernel that converts the input to fp16
    assert any("to_copy" in k and "permute" in k and "clamp" not in k for k in kernels), kernels
    quantizing = [k for k in kernels if "clamp" in k]
    assert len(quantizing) == 4, kernels                      # qkv, proj, fc1, fc2 inputs
    assert all(any(op in k for op in ("native_layer_norm", "gelu", "transpose"))
               for k in quantizing), kernels
    assert "_scaled_mm" in _inductor_code("rowwise-fp16", batch=SMALL_BATCH + 1,
                                          small_batch="dequantized")


def test_vit_family_takes_the_triton_small_batch_kernel_but_not_with_fused_mlps(tmp_path):
    """A token family's Linear layers take the Triton small-batch form; its fused MLPs
    (fp8_conv triton-fused) have one form at every batch, so not with them."""
    import json
    import shutil

    from bundler.families import families_root
    from runtime_py.errors import FamilyError

    shutil.copytree(families_root() / "timm_vit_base", tmp_path / "timm_vit_base")
    path = tmp_path / "timm_vit_base" / "family.json"
    spec = json.loads(path.read_text())
    spec["torch_aoti"]["fp8_pointwise_small_batch"] = "triton"
    spec["torch_aoti"]["static_batches"] = {"fp8": [1]}
    path.write_text(json.dumps(spec))
    family = load_family("timm_vit_base", root=tmp_path)
    assert family.target_settings("torch-aoti").fp8_pointwise_small_batch == "triton"
    spec["torch_aoti"]["fp8_conv"] = "triton-fused"
    path.write_text(json.dumps(spec))
    with pytest.raises(FamilyError) as info:
        load_family("timm_vit_base", root=tmp_path)
    assert any("fused MLPs (triton-fused) have one form" in p for p in info.value.problems)

