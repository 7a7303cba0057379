"""benchmarks/fp8_tma_probe.py, the TMA version of the fused FP8 1x1 convolution that the next
GPU call times against the shipped kernel (issue 18, timm_resnet50). Here, without a GPU: under
Triton's interpreter it gives the shipped kernel's outputs bit for bit, so what the GPU run
reports is speed, not a different computation."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
from benchmark_modules import load_benchmark  # noqa: E402
from triton_interpret import ROOT, needs_triton, run_interpreted  # noqa: E402


def _probe():
    """The probe script as a module."""
    return load_benchmark("fp8_tma_probe")


@needs_triton
def test_the_tma_kernel_equals_the_shipped_one_under_the_interpreter():
    """Every epilogue the fused model gives a 1x1 layer (residual, ReLU, fp16 and/or e4m3
    out), on 50 rows and 48 channels (edge tiles of 16), with the descriptors made in the
    kernel and on the host: the same fp16 bits and e4m3 codes."""
    results = run_interpreted("fp8_tma_probe.py", "--interpret-check", folder="benchmarks")
    assert set(results) == {f"{kind}:{name}" for kind in ("device", "host") for name in
                            ("res+relu>f16+f8", "relu>f8", ">f16", "res+relu>f16")}
    for name, r in results.items():
        if "f16_max_diff" in r:
            assert r["f16_max_diff"] == 0.0 and r["f16_scale"] > 1.0, name
        if "e4m3_steps" in r:
            assert r["e4m3_steps"] == 0, name
    for kind in ("device", "host"):
        only_f8 = results[f"{kind}:relu>f8"]
        assert "e4m3_steps" in only_f8 and "f16_max_diff" not in only_f8


@needs_triton
def test_the_tma_kernel_refuses_rows_that_tma_cannot_address():
    """TMA needs 16-byte row strides: 24 input channels of e4m3 are refused before a launch."""
    probe = _probe()
    x, weight, scale, bias, _ = probe._case(1, 3, 24, 32, False, "cpu")
    with pytest.raises(ValueError, match="16-byte"):
        probe.tma_1x1(x, weight, scale, bias, 32)
    x, weight, scale, bias, _ = probe._case(1, 3, 32, 32, False, "cpu")
    with pytest.raises(ValueError, match="choose one of device, host"):
        probe.tma_1x1(x, weight, scale, bias, 32, descriptors="shared")


def test_the_fit_tiles_are_tiles_a_bundle_can_take_and_small_batches_get_small_rows():
    """`--fit` proposes only tiles whose descriptors AOTInductor can encode (a faster tile the
    package cannot hold would be a figure no bundle reaches), and at a small static batch
    its own list, whose rows start at 16 as the shipped kernel's small-batch tables do."""
    from bundler.targets.torch_aoti.fp8_layers import SMALL_BATCH
    from bundler.targets.torch_aoti.kernels.fp8_conv_tma import DEFAULT_TMA_TILES, tiles_fit

    probe = _probe()
    for tiles in probe.FIT_TILES + probe.SMALL_FIT_TILES:
        assert tiles_fit(tiles), tiles
    assert probe.fit_candidates(SMALL_BATCH) == probe.SMALL_FIT_TILES
    assert probe.fit_candidates(SMALL_BATCH + 1) == probe.FIT_TILES
    assert min(t[0] for t in probe.SMALL_FIT_TILES) == 16
    assert min(t[0] for t in probe.FIT_TILES) >= 64
    assert DEFAULT_TMA_TILES in probe.SMALL_FIT_TILES


@pytest.mark.parametrize("script", ["fp8_tma_probe.py", "fp8_conv_bench.py",
                                    "vit_gemm_small_probe.py"])
def test_the_layer_benchmarks_refuse_a_per_graph_count_below_one(script):
    """`--per-graph N` divides a replay of N captured calls by N; 0 would divide by zero
    after minutes of compiling, so it is refused at once (argparse's exit 2, the project's
    `bench_args.positive_int`), GPU or not."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--per-graph", "0"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "argument --per-graph: one positive integer, got '0'" in done.stderr


@needs_triton
def test_the_vit_probes_split_k_form_gives_the_fused_kernels_output_under_the_interpreter():
    """benchmarks/vit_gemm_small_probe.py `--split-k`: the reduction split 1-4 ways (fewer
    where the reduction has fewer k tiles), its fp32 partial sums added by a second kernel,
    gives the fp16 output of the fused kernel the model's batch-1 graph runs, on rows and
    outputs with edge tiles and a reduction that does not fill its last k tile."""
    results = run_interpreted("vit_gemm_small_probe.py", "--interpret-check",
                              folder="benchmarks")
    assert len(results) == 8
    for name, r in results.items():
        splits = int(name.rsplit("split", 1)[1])
        # 96 channels are 3 k tiles of 32: a fourth split has nothing left to add
        assert r["splits_made"] == min(splits, 3), name
        assert r["max_diff_over_max"] <= 1e-3, name       # at most an fp16 rounding apart
        assert r["partials_vs_exact"] < 1e-5, name
