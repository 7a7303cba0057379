"""benchmarks/inductor_fp8_bench.py and its helpers, on the CPU: the H200 run gets one try,
so its pieces are checked here (variant names, the torch-side FP8 recipe and calibration,
the kernel kinds of the profile table) and the whole script runs end to end on a small ViT
family (eager, ``torch._scaled_mm``'s CPU kernel), as the dry run does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("timm")

import cpu_fp8_gemm  # noqa: E402
from benchmark_modules import load_benchmark  # noqa: E402
from bundler.families import families_path, load_family  # noqa: E402



_load = load_benchmark


@pytest.mark.parametrize("name,kind,quantize", [
    ("triton_per_fused__to_copy_add_clamp_div_native_layer_norm_view_4", "layernorm", True),
    ("triton_per_fused_add_native_layer_norm_view_6", "layernorm", False),
    ("triton_poi_fused__scaled_mm__to_copy_clamp_div_gelu_t_view_5", "activation", True),
    ("triton_poi_fused__scaled_dot_product_flash_attention__to_copy_permute_unbind_view_2",
     "quantize/convert", False),
    ("triton_poi_fused__scaled_mm__to_copy_clamp_div_t_transpose_view_3", "quantize/convert", True),
    ("triton_poi_fused_add_mul_7", "other", False),
    ("nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NNT", "fp16 GEMM", False),
    ("nvjet_qqtst_128x128_128x6_1x2_h_bz_coopA_TNT", "FP8 GEMM", False),
    ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize2x1x1", "FP8 GEMM", False),
    ("void cutlass::device_kernel<cutlass::float_e4m3_t, cutlass::bfloat16_t>", "FP8 GEMM", False),
    ("sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc", "convolution", False),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>", "attention", False),
    ("aten::_scaled_mm", "FP8 GEMM", False),
    ("aten::addmm", "fp16 GEMM", False),
])
def test_kernel_kinds_are_read_from_the_names(name, kind, quantize):
    kernel_profile = _load("kernel_profile")
    assert kernel_profile.kernel_category(name) == (kind, quantize)


def test_the_summary_counts_kernels_per_run_and_fused_quantizes():
    kernel_profile = _load("kernel_profile")
    summary = kernel_profile.summarize([
        ("nvjet_qqtst_128x128_128x6_1x2_h_bz_coopA_TNT", 4.0, 8),
        ("triton_per_fused__to_copy_add_clamp_div_native_layer_norm_view_4", 1.0, 4),
        ("triton_per_fused_add_native_layer_norm_view_6", 0.5, 2)], runs=2)
    assert summary["groups"]["FP8 GEMM"] == {"ms": 2.0, "count": 4.0}
    assert summary["groups"]["layernorm"] == {"ms": 0.75, "count": 3.0}
    assert summary["quantize_fused"]["layernorm"] == {"with_quantize": 2, "kernels": 3}
    assert summary["total_ms"] == pytest.approx(2.75)
    lines = kernel_profile.format_summary(summary, "x")
    assert any("FP8 GEMM" in line and "72.7%" in line for line in lines)


def test_the_replay_timeline_splits_idle_and_overlap_by_transition():
    kernel_profile = _load("kernel_profile")
    gemm, act = "nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NNT", "triton_poi_fused_relu_3"
    conv = "_fp8_conv_nhwc_kernel"
    one = [(gemm, 0.0, 10.0), (act, 12.0, 14.0),     # 2 us idle before the activation
           (conv, 13.0, 20.0),                       # starts 1 us before it ends: overlap
           (act, 23.0, 24.0)]                        # 3 us idle after the convolution
    two = [(n, s + 100.0, e + 100.0) for n, s, e in one]
    two[-1] = (act, 125.0, 126.0)                    # 5 us idle in the second replay
    t = kernel_profile.replay_timeline(list(reversed(one + two)), runs=2)   # any order
    assert t["kernels"] == 4
    assert t["span_us"] == pytest.approx((24.0 + 26.0) / 2)
    assert t["idle_us"] == pytest.approx((5.0 + 7.0) / 2)
    assert t["overlap_us"] == pytest.approx(1.0)
    assert t["busy_us"] == pytest.approx(t["span_us"] - t["idle_us"])
    by = {(x["from"], x["to"]): x for x in t["transitions"]}
    assert by[("fp16 GEMM", "activation")] == {"from": "fp16 GEMM", "to": "activation",
                                                "count": 1.0, "idle_us": 2.0, "overlap_us": 0.0}
    assert by[("activation", "convolution")]["overlap_us"] == 1.0
    assert by[("convolution", "activation")]["idle_us"] == pytest.approx(4.0)   # (3 + 5) / 2
    assert t["transitions"][0]["to"] == "activation"          # most idle first
    assert t["waited"][0] == {"name": act, "count": 2.0, "idle_us": 6.0}
    lines = kernel_profile.format_timeline(t, "x")
    assert "4 kernels" in lines[0] and "idle between kernels 6.0 us" in lines[0]
    with pytest.raises(ValueError, match="do not split into 3 replays"):
        kernel_profile.replay_timeline(one + two, runs=3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with a CUDA GPU (none visible)")
def test_gpu_the_replay_timeline_reads_every_kernel_of_a_cuda_graph():
    """The profiler must see the kernels inside a graph replay, each replay's together:
    a graph of 12 matmuls and ReLUs is read as (at least) its 24 kernels."""
    kernel_profile = _load("kernel_profile")
    x = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    w = torch.randn(256, 256, device="cuda", dtype=torch.float16) / 16
    stream = torch.cuda.Stream()

    def forward():
        y = x
        for _ in range(12):
            y = torch.relu(y @ w)
        return y

    with torch.cuda.stream(stream):
        forward()
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            forward()

    def replay():
        with torch.cuda.stream(stream):
            graph.replay()
        stream.synchronize()

    lines = []
    t = kernel_profile.timeline_table(replay, "toy", repeats=10, log=lines.append)
    assert t, lines
    # >= : a GEMM may take two kernels, and replay() may fill the RNG offsets first
    assert t["kernels"] >= 24, lines
    assert 0 < t["busy_us"] <= t["span_us"] and t["idle_us"] >= 0, t
    assert sum(tr["count"] for tr in t["transitions"]) == pytest.approx(t["kernels"] - 1)
    assert any(tr["from"] == "fp16 GEMM" for tr in t["transitions"]), t["transitions"]


def test_variant_names():
    bench = _load("inductor_fp8_bench")
    vit, xception = load_family("timm_vit_base"), load_family("timm_xception")
    v = bench.parse_variant("fp8-fp16out-fastacc", vit)
    assert (v.precision, v.gemm, v.fast_accum, v.recipe) == ("fp8", "rowwise-fp16", True, None)
    assert bench.parse_variant("fp8-dequant", vit).gemm == "dequantized"
    assert bench.parse_variant("fp8-depthwise-tensorwise", xception).recipe == "fp8-depthwise"
    assert bench.parse_variant("fp8-rowcols-unpadded", xception).shared_ones is False
    assert bench.parse_variant("fp16-nchw", vit).fp16_form == "nchw"
    for suffix, form in (("-dwslices", "slices"), ("-dwtriton", "triton")):
        v = bench.parse_variant("fp8" + suffix, xception)
        assert (v.depthwise, v.form) == (form, "channels_last")
        with pytest.raises(ValueError, match="channels_last form"):
            bench.parse_variant("fp8-nhwc" + suffix, xception)
    assert bench.parse_variant("fp8-sbdequant", vit).small_batch_pointwise == "dequantized"
    # fp8_conv triton-fused (ViT: the fused MLPs); without the suffix, the family's own
    v = bench.parse_variant("fp8-fp16out-tfused", vit)
    assert (v.conv, v.gemm) == ("triton-fused", "rowwise-fp16")
    assert bench.parse_variant("fp8", vit).conv is None
    # without a GEMM suffix the family's own mode (timm_xception: rowwise-fp16 since the
    # twenty-first session); -bf16out names the rowwise form it replaced
    from bundler.targets.torch_aoti.build import fp8_gemm_options

    plain, bf16 = bench.parse_variant("fp8", xception), bench.parse_variant("fp8-bf16out", xception)
    assert (plain.gemm, plain.fast_accum, bf16.gemm) == (None, None, "rowwise")
    aoti = xception.target_settings("torch-aoti")
    assert fp8_gemm_options(xception, plain.gemm, plain.fast_accum) == (aoti.fp8_gemm,
                                                                         aoti.fp8_fast_accum)
    assert fp8_gemm_options(xception, bf16.gemm, bf16.fast_accum)[0] == "rowwise"
    for bad in ("fp8-depthwise", "fp16-fastacc", "fp8-fp16out-tensorwise", "fp8-bf16out-fp16out",
                "int8", "fp8-patchconv-fastacc"):
        with pytest.raises(ValueError):
            bench.parse_variant(bad, vit)
    # -patchconv: any variant of an as_is family, its patch embedding kept a convolution
    v = bench.parse_variant("fp8-fastacc-patchconv", vit)
    assert (v.name, v.precision, v.fast_accum, v.patch_conv) == (
        "fp8-fastacc-patchconv", "fp8", True, True)
    assert bench.parse_variant("fp16-patchconv", vit).patch_conv
    assert not bench.parse_variant("fp16", vit).patch_conv
    with pytest.raises(ValueError, match="as_is"):
        bench.parse_variant("fp16-patchconv", xception)


def test_patchconv_puts_the_patch_embedding_convolution_back():
    """The -patchconv engine model: the target's PatchGemm back as a Conv2d of the same
    weights, the same output (fp32, the CPU)."""
    import timm

    from bundler.targets.torch_aoti.model import rewrite_as_is
    from bundler.targets.torch_aoti.nhwc_modules import PatchGemm

    bench = _load("inductor_fp8_bench")
    torch.manual_seed(0)
    vit = timm.create_model("vit_base_patch16_224", pretrained=False, depth=1, embed_dim=64,
                            num_heads=2, img_size=32, num_classes=10).eval()
    gemm = rewrite_as_is(vit, torch.float32)
    assert isinstance(gemm.patch_embed.proj, PatchGemm)
    conv = bench.patch_convolutions(rewrite_as_is(vit, torch.float32))
    assert isinstance(conv.patch_embed.proj, torch.nn.Conv2d)
    assert not any(isinstance(m, PatchGemm) for m in conv.modules())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(conv(x), gemm(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(conv(x), vit(x), rtol=1e-5, atol=1e-5)


def test_torch_side_recipe_selects_what_make_selects():
    """The family's expected counts (make's guard) from the torch model's facts: ViT-B's 48
    block Linears (MatMul on [N, T, C]) but not the head (a Gemm); ResNet-50's 52
    convolutions and 36 in its fp8-pointwise variant."""
    recipe = _load("torch_fp8_recipe")
    from bundler.torch_model import build_torch_model

    vit = load_family("timm_vit_base")
    model = build_torch_model(vit, seed=0)
    facts = recipe.module_facts(model, tuple(vit.input.shape))
    assert facts["blocks.0.attn.qkv"]["op_type"] == "MatMul"
    assert facts["head"]["op_type"] == "Gemm"
    chosen = recipe.select_modules(model, vit)
    assert len(chosen) == 48 and chosen[:4] == ["blocks.0.attn.qkv", "blocks.0.attn.proj",
                                                "blocks.0.mlp.fc1", "blocks.0.mlp.fc2"]
    resnet = load_family("timm_resnet50")
    model = build_torch_model(resnet, seed=0)
    assert len(recipe.select_modules(model, resnet)) == 52
    assert len(recipe.select_modules(model, resnet, "fp8-pointwise")) == 36


def test_max_scales_follow_make_s_rules():
    """Activation scale: the largest |input| over every batch / 448, weight scales per
    output channel, both through stored_scale (fp16 values, at least 2^-14)."""
    recipe = _load("torch_fp8_recipe")
    from bundler.fp8 import stored_scale

    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    with torch.no_grad():
        model[2].weight[1].zero_()                 # an all-zero channel: scale 1
    batches = [np.full((2, 8), 0.5, np.float32), np.full((1, 8), -3.0, np.float32)]
    scales = recipe.max_scales(model, ["0", "2"], batches)
    act, weights = scales["0"]
    assert act == float(stored_scale(np.float32(3.0) / np.float32(448)))
    expected = model[0].weight.detach().abs().amax(1).numpy() / 448
    assert np.array_equal(weights, stored_scale(expected))
    assert scales["2"][1][1] == 1.0
    with torch.no_grad():
        hidden = torch.relu(model[0](torch.from_numpy(np.concatenate(batches[:1]))))
        hidden2 = torch.relu(model[0](torch.from_numpy(batches[1])))
    amax = max(float(hidden.abs().max()), float(hidden2.abs().max()))
    assert scales["2"][0] == float(stored_scale(np.float32(amax) / np.float32(448)))


def _tiny_vit_family(root: Path) -> str:
    """timm_vit_base's family.json for ViT-Ti/16 (12 blocks of width 192: 48 Linears)."""
    vit = load_family("timm_vit_base")
    spec = json.loads((vit.path / "family.json").read_text())
    spec["name"] = "test_vit_tiny"
    spec["checkpoint"] = {"hf_id": "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k",
                          "timm_model": "vit_tiny_patch16_224.augreg_in21k_ft_in1k"}
    folder = root / "test_vit_tiny"
    folder.mkdir(parents=True)
    (folder / "family.json").write_text(json.dumps(spec))
    shutil.copy(vit.path / "class_ids.txt", folder / "class_ids.txt")
    return "test_vit_tiny"


@pytest.mark.skipif(not cpu_fp8_gemm.rowwise_runs(), reason=cpu_fp8_gemm.ROWWISE_REASON
                    + ": the dry run's fp8 variants take rowwise scales")
def test_the_benchmark_runs_end_to_end_on_the_cpu(tmp_path, capsys):
    """The dry run of the H200 command (seconds): the GEMM modes of a ViT, profiled,
    summarized, one JSON line per variant; an unknown variant is a usage error (exit 2)."""
    bench = _load("inductor_fp8_bench")
    out = tmp_path / "bench.jsonl"
    with families_path(tmp_path):
        name = _tiny_vit_family(tmp_path)
        assert bench.main(["--family", name, "--eager", "--device", "cpu", "--iters", "1",
                           "--eval-count", "2", "--calib-count", "2", "--batch-sizes", "2,1",
                           # not -tensorwise: the CPU kernel of tensorwise _scaled_mm
                           # takes a minute a call (its GEMM is tested on its own)
                           "--variants", "fp16,fp8,fp8-fp16out-fastacc,fp8-dequant,fp8-rowcols,"
                           "fp16-patchconv",
                           "--profile", "fp8", "--rows", "3", "--json", str(out)]) == 0
        assert bench.main(["--family", name, "--variants", "fp8-blockwise",
                           "--device", "cpu"]) == 2
    text = capsys.readouterr().out
    assert "FAILED" not in text, text
    assert "[probe] torch._scaled_mm rowwise float16 out: ok" in text
    assert "48 layers, max calibration on 2 synthetic images" in text
    assert "FP8 GEMM" in text and "kernels/run" in text
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["variant"] for r in lines] == ["fp16", "fp8", "fp8-fp16out-fastacc",
                                             "fp8-dequant", "fp8-rowcols", "fp16-patchconv"]
    assert all(set(r["ms"]) == {"2", "1"} for r in lines)
    profiled = next(r for r in lines if r["variant"] == "fp8")["kernels"]["2"]
    assert profiled["groups"]["FP8 GEMM"]["count"] == 48
    dequant = next(r for r in lines if r["variant"] == "fp8-dequant")["kernels"]
    assert dequant == {}
    assert all(0.0 <= r["agree"] <= 1.0 and r["diff"] < 1.0 for r in lines)
