"""Transformer MLPs with fc1, GELU and fc2's input quantize in one Triton FP8 kernel
(bundler/targets/torch_aoti/fused_mlp.py; a layout "as_is" family with
``torch_aoti.fp8_conv: triton-fused``).

No GPU here: the kernel runs under Triton's CPU interpreter in a child process
(tests/fused_mlp_interpret.py); the emulated form (the same arithmetic in torch) is compared
with the unfused fp8 model, and export shows one fused op per MLP with a dynamic batch. Its
speed on the H200 (slower than the unfused form: families/timm_vit_base/README.md) is
benchmarks/fp8_mlp_bench.py's and inductor_fp8_bench.py's (variant suffix -tfused).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("timm")
from torch import nn  # noqa: E402

from runtime_py.errors import UsageError  # noqa: E402
from triton_interpret import (TRITON_MISSING, load_script, needs_triton,  # noqa: E402
                              run_interpreted)

SCRIPT = "fused_mlp_interpret.py"


def _vit_and_scales():
    script = load_script(SCRIPT)
    calib = load_script("fp8_conv_fused_interpret.py").calibrate
    model = script.tiny_vit()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    return model, calib(model, x, script.linear_paths(model)), x


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(SCRIPT)


@needs_triton
@pytest.mark.parametrize("gelu", ["erf", "erfc"])
def test_the_kernel_writes_what_the_emulated_form_computes(interpreted, gelu):
    """fc1 + bias + GELU + QuantizeLinear with fc2's scale, in the kernel's epilogue: bit for
    bit the emulated form's e4m3 rows, 208 columns for a hidden width of 200 (fc2's padded
    input), the 8 padding columns zero."""
    r = interpreted["hidden"][gelu]
    assert r["shape"] == [15, 208] and (r["width"], r["hidden"]) == (208, 200)
    assert r["differ"] == 0 and r["ulps"] == 0
    assert r["nonzero"] > 0.9 * 15 * 200 and r["padding_nonzero"] == 0


@needs_triton
@pytest.mark.parametrize("gelu", ["erf", "erfc"])
def test_the_epilogue_gelu_is_torchs_gelu_to_fp16_rounding(interpreted, gelu):
    r = interpreted["gelu_f16"][gelu]
    assert r["negative_inputs"] > 100                # the erfc branch of g < 0 was taken
    assert r["differ"] <= 4 and r["max_abs"] < 1e-5    # (1 here: a value of ~1e-7)


def test_gelu_erfc_is_the_exact_gelu_to_a_fraction_of_an_fp16_step():
    """The epilogue's cheap GELU (Abramowitz & Stegun 7.1.26 for erfc, evaluated in fp32)
    against the exact GELU (erf in float64), on every finite fp16 input, in fp16 steps of the
    exact value: within 0.15 of a step for x >= -3.2 (0.11 here), within one step below it.
    So, rounded to fp16, the two differ only next to a rounding tie, by one step. The
    reference is float64 on purpose: torch's fp32 GELU on the CPU is a vectorized erf that
    differs by CPU (AVX-512 here: up to 5.8 steps off), which made this test fail on a new
    machine when it compared against that."""
    import torch.nn.functional as F

    from bundler.targets.torch_aoti.fused_mlp import gelu_erfc

    x = torch.arange(0, 65536, dtype=torch.int32).to(torch.int16).view(torch.float16)
    x = x[torch.isfinite(x)]
    exact = F.gelu(x.double())
    cheap = gelu_erfc(x.float()).double()
    step = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(2.0 ** -14))) - 10)
    error = (cheap - exact).abs() / step
    upper = x.float() >= -3.2
    assert float(error[upper].max()) < 0.15
    assert float(error.max()) < 1.0

    differ = exact.half() != cheap.half()
    assert 0 < int(differ.sum()) < 400                    # (254 here, 26 of them above -3.2)
    tie = (exact - exact.half().double()).abs() / step    # 0.5: halfway between two fp16s
    assert float(tie[differ & upper].min()) > 0.35        # only next to a tie
    steps = (exact.half().view(torch.int16).int() - cheap.half().view(torch.int16).int()).abs()
    assert int(steps[differ].max()) == 1
    assert float(exact.abs()[differ & ~upper].max()) < 2.5e-3


@pytest.mark.parametrize("gelu", ["erf", "erfc"])
def test_the_fused_model_equals_the_unfused_fp8_model(gelu):
    """rewrite_as_is with fp8_conv triton-fused, emulated: each MLP a FusedMlp, the output
    that of the unfused fp8 model (Fp8Linear, GELU, Fp8Linear: the same FP8 operands and
    roundings). 0 measured with either GELU; allowed: a tenth of the FP8 error itself,
    since the scales are applied in another order (an fp32 ulp can move an fp16 or e4m3
    rounding tie on another CPU's GEMM)."""
    from bundler.targets.torch_aoti import fused_mlp
    from bundler.targets.torch_aoti.model import rewrite_as_is

    model, fp8, x = _vit_and_scales()
    unfused = rewrite_as_is(model, torch.float16, fp8=fp8, emulate=True, fp8_gemm="rowwise-fp16")
    fused = rewrite_as_is(model, torch.float16, fp8=fp8, emulate=True, fp8_gemm="rowwise-fp16",
                          fp8_conv="triton-fused")
    mlps = [m for m in fused.modules() if isinstance(m, fused_mlp.FusedMlp)]
    assert len(mlps) == 2
    for m in mlps:
        m.gelu = gelu
    with torch.no_grad():
        got, ref, exact = fused(x.half()).float(), unfused(x.half()).float(), model(x)
    err = float((got - ref).abs().max() / ref.abs().max())
    fp8_err = float((ref - exact).abs().max() / exact.abs().max())
    assert fp8_err > 1e-2                                          # it is FP8 (0.06 here)
    assert err < fp8_err / 10


def test_mlps_that_cannot_be_fused_are_refused_by_name_and_unselected_ones_kept():
    from bundler.targets.torch_aoti.fused_mlp import FusedMlp, mlp_parts
    from bundler.targets.torch_aoti.fp8_layers import Fp8Linear
    from bundler.targets.torch_aoti.model import rewrite_as_is

    model, fp8, _ = _vit_and_scales()
    mlp = model.blocks[0].mlp
    assert mlp_parts(mlp, fp8, "blocks.0.mlp") == (mlp.fc1, mlp.fc2)
    assert mlp_parts(model.blocks[0].attn, fp8, "blocks.0.attn") is None
    partial = {k: v for k, v in fp8.items() if k != "blocks.1.mlp.fc2"}
    body = rewrite_as_is(model, torch.float16, fp8=partial, emulate=True,
                         fp8_conv="triton-fused")
    assert isinstance(body.blocks[0].mlp, FusedMlp)
    assert isinstance(body.blocks[1].mlp.fc1, Fp8Linear)       # fc2 not FP8: left unfused
    mlp.act = nn.GELU(approximate="tanh")
    with pytest.raises(UsageError, match="blocks.0.mlp.*not the erf GELU"):
        rewrite_as_is(model, torch.float16, fp8=fp8, emulate=True, fp8_conv="triton-fused")
    mlp.act, mlp.drop1 = nn.GELU(), nn.Dropout(0.1)
    with pytest.raises(UsageError, match="drop1 is not a no-op"):
        rewrite_as_is(model, torch.float16, fp8=fp8, emulate=True, fp8_conv="triton-fused")
    mlp.drop1 = nn.Identity()
    attn_only = {k: v for k, v in fp8.items() if ".attn." in k}
    with pytest.raises(UsageError, match="has none: leave fp8_conv out"):
        rewrite_as_is(model, torch.float16, fp8=attn_only, emulate=True,
                      fp8_conv="triton-fused")
    with pytest.raises(UsageError, match="leave fp8_pointwise_small_batch out"):
        rewrite_as_is(model, torch.float16, fp8=fp8, emulate=True, fp8_conv="triton-fused",
                      small_batch_pointwise="dequantized")


@needs_triton
def test_the_fused_model_is_exported_with_one_op_per_mlp_and_no_gelu_left():
    """engine_model for a layout as_is family with fp8_conv triton-fused: torch.export with
    a dynamic batch has one fused op per MLP (GELU in it, e4m3 out only, symbolic rows),
    no GELU op outside it, and fc2 as torch._scaled_mm on those rows."""
    from bundler.targets.torch_aoti.build import engine_model

    model, fp8, x = _vit_and_scales()
    module, padding = engine_model(model, "fp8", fp8, layout="as_is", fp8_gemm="rowwise-fp16",
                                   fp8_conv="triton-fused")
    assert padding == {}
    program = torch.export.export(module.eval(), (x,), dynamic_shapes=(
        {0: torch.export.Dim("batch", min=1, max=32)},))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    fused = [n for n in program.graph.nodes if "fp8_conv_nhwc_fused" in str(n.target)]
    assert len(fused) == 2
    for node in fused:
        f16, e4m3 = node.meta["val"]
        assert tuple(f16.shape) == (0,) and e4m3.dtype == torch.float8_e4m3fn
        assert isinstance(e4m3.shape[0], torch.SymInt) and e4m3.shape[-1] == 208
    assert not any("gelu" in t for t in targets)
    assert sum("_scaled_mm" in t for t in targets) == 3 * 2     # qkv, proj, fc2 per block


def test_families_and_the_recorded_form_name_the_fused_mlps(tmp_path):
    import json
    import shutil

    from bundler.families import FamilyError, families_root, load_family
    from bundler.targets.torch_aoti.build import FUSED_MLP_DESCRIPTION, engine_details

    host = {"torch_version": "2", "cuda_version": "13.0", "compute_capability": "9.0",
            "device_name": "H200", "device": "cuda"}
    details = engine_details(host, "fp8", {}, nhwc=False, fast_accum=False, padding={},
                             batch_sizes=[1], seconds=None, layout="as_is",
                             fp8_conv="triton-fused")
    assert details["compile_options"]["fp8_conv"] == FUSED_MLP_DESCRIPTION
    plain = engine_details(host, "fp8", {}, nhwc=False, fast_accum=False, padding={},
                           batch_sizes=[1], seconds=None, layout="as_is")
    assert "fp8_conv" not in plain["compile_options"]

    shutil.copytree(families_root() / "timm_vit_base", tmp_path / "timm_vit_base")
    spec_path = tmp_path / "timm_vit_base" / "family.json"
    spec = json.loads(spec_path.read_text())

    def load(**aoti):
        spec_path.write_text(json.dumps({**spec, "torch_aoti": {**spec["torch_aoti"], **aoti}}))
        return load_family("timm_vit_base", root=tmp_path)

    # (the family's own small-batch form, Triton Linear layers, is not the fused MLPs')
    fused = load(fp8_conv="triton-fused", fp8_pointwise_small_batch="gemm")
    assert fused.target_settings("torch-aoti").fp8_conv == "triton-fused"
    with pytest.raises(FamilyError, match="only triton-fused applies"):
        load(fp8_conv="triton")
    with pytest.raises(FamilyError, match="leave fp8_pointwise_small_batch out"):
        load(fp8_conv="triton-fused", fp8_pointwise_small_batch="dequantized",
             static_batches={"fp8": [1]})


def test_the_gelu_forms_are_the_kernels_and_an_unknown_one_is_refused():
    from bundler.targets.torch_aoti.fused_mlp import GELU_NAMES, FusedMlp

    if TRITON_MISSING is None:
        from bundler.targets.torch_aoti.kernels.fp8_conv import GELU_FORMS

        assert tuple(GELU_FORMS) == GELU_NAMES
    model, fp8, _ = _vit_and_scales()
    mlp = model.blocks[0].mlp
    with pytest.raises(UsageError, match="GELU form 'tanh'.*erf or erfc"):
        FusedMlp(mlp.fc1, mlp.fc2, fp8["blocks.0.mlp.fc1"], fp8["blocks.0.mlp.fc2"],
                 torch.float16, gelu="tanh")
