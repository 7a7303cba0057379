"""benchmarks/fp8_tma3x3_probe.py, a TMA version of the stride-1 3x3 FP8 convolution (issue 18,
timm_resnet50's 3x3 layers) that a GPU call times against the shipped kernel. Here, without a
GPU: under Triton's interpreter it gives the shipped kernel's outputs bit for bit (padding at
every border, boxes that overhang the image), so what the GPU run reports is speed, not a
different computation."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from benchmark_modules import load_benchmark  # noqa: E402
from triton_interpret import needs_triton, run_interpreted  # noqa: E402


def _probe():
    """The probe script as a module."""
    return load_benchmark("fp8_tma3x3_probe")


@needs_triton
def test_the_tma_3x3_kernel_equals_the_shipped_one_under_the_interpreter():
    results = run_interpreted("fp8_tma3x3_probe.py", "--interpret-check", folder="benchmarks")
    assert len(results) == 5
    for name, r in results.items():
        if "e4m3_steps" in r:
            assert r["e4m3_steps"] == 0, name
            assert r["e4m3_nonzero"] > 100, name      # not a comparison of two empty outputs
        if "f16_max_diff" in r:
            assert r["f16_max_diff"] == 0.0 and r["f16_scale"] > 1.0, name
            assert r["f16_nonzero"] > 100, name
    assert "f16_max_diff" not in results["3x3 5x5 box 2x2x4 e4m3 only"]
    # stride 2: a 3x3 layer over both parities, a 1x1 downsample (fp16 only, no ReLU)
    assert set(results["3x3 s2 10x10 box 1x4x4"]) >= {"e4m3_steps", "f16_max_diff"}
    only16 = results["1x1 s2 6x6 box 2x2x4 fp16 only"]
    assert "e4m3_steps" not in only16 and only16["f16_nonzero"] == 3 * 3 * 3 * 48


@needs_triton
def test_the_probe_refuses_what_its_boxes_cannot_hold():
    probe = _probe()
    x, weight, scale, bias = probe._case(1, 6, 32, 32, 3, "cpu")
    with pytest.raises(ValueError, match="multiple of BLOCK_K"):       # a block over two taps
        probe.fp8_conv_box_tma(x, weight, scale, bias, 32, (3, 3), (1, 1),
                              tiles=(1, 4, 4, 32, 64, 4, 2))
    with pytest.raises(ValueError, match="stride 2 on 5x5: stride 1, or 2 on even sides"):
        odd = probe._case(1, 5, 32, 32, 3, "cpu")
        probe.fp8_conv_box_tma(*odd, 32, (3, 3), (1, 1), stride=2,
                               tiles=(1, 4, 4, 32, 32, 4, 2))
    with pytest.raises(ValueError, match="'same' padding"):
        probe.fp8_conv_box_tma(x, weight, scale, bias, 32, (3, 3), (0, 0))
    # fp16 rows of 128 columns: 256 bytes
    with pytest.raises(ValueError, match="rows outside 32..128 bytes"):
        probe.fp8_conv_box_tma(x, weight, scale, bias, 32, (3, 3), (1, 1),
                              tiles=(1, 4, 4, 128, 32, 4, 2))


@needs_triton
def test_the_boxes_cover_resnets_feature_maps_with_little_waste():
    """56 and 28 pixel sides take boxes that waste nothing; 14 and 7 one row or column in
    eight (boxes span at most MAX_BOX_IMAGES images); every candidate has the rows it
    claims and a channel block that divides C."""
    probe = _probe()
    for hw, c in ((56, 64), (28, 128), (14, 256), (7, 512)):
        tiles = probe.candidates(32, hw, hw, c, c)
        assert tiles, hw
        best = max(probe.useful_share(32, hw, hw, *t[:3]) for t in tiles)
        assert best == (0.875 if hw in (14, 7) else 1.0), hw
        for bi, bh, bw, bn, bk, _w, _s in tiles:
            assert bi * bh * bw in (64, 128, 256) and bi <= 8 and c % bk == 0 and bn <= c
