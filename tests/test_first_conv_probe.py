"""benchmarks/first_conv_probe.py, the next GPU call's look at timm_xception's first
convolution (issue 18). Here, without a GPU: the convolution it finds, and that its padded
and NCHW variants compute what the bundle's form computes, so the GPU run compares speed,
not different results."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from benchmark_modules import load_benchmark  # noqa: E402


def test_the_probe_takes_the_convolution_that_reads_the_image():
    probe = load_benchmark("first_conv_probe")
    shape, conv, path = probe.first_conv("timm_xception")
    assert (shape, path) == ((3, 299, 299), "stem.0.conv")
    assert (conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride) == (
        3, 32, (3, 3), (2, 2))
    assert probe.first_conv("timm_resnet50")[2] == "conv1"


def test_padded_and_nchw_variants_compute_the_bundles_convolution():
    """Zero channels (input and weight) add nothing: pad4, pad8 and nchw give the as-is
    form's fp16 output (fp16 on the CPU, a small image)."""
    probe = load_benchmark("first_conv_probe")
    conv = torch.nn.Conv2d(3, 8, 3, 2, 1, bias=True)
    x = torch.randn(2, 3, 17, 19)
    with torch.no_grad():
        base = probe.variant_module(conv, "as-is", device="cpu")(x).float()
        for variant in ("pad4", "pad8", "nchw", "w-oihw"):
            module = probe.variant_module(conv, variant, device="cpu")
            if variant.startswith("pad"):
                assert module.weight.shape[1] == int(variant[3:])
                assert not module.weight[:, 3:].any()
            got = module(x).float()
            assert got.shape == base.shape
            assert (got - base).abs().max() <= 2e-3 * base.abs().max(), variant


def test_the_pixel_head_variants_compute_the_same_and_keep_their_weight_memory():
    """--pixels: uint8 NHWC in, every variant the as-is form's output (bias and ReLU
    after); w-oihw keeps its weight in OIHW memory, as-is in channels_last memory."""
    probe = load_benchmark("first_conv_probe")
    conv = torch.nn.Conv2d(3, 8, 3, 2, 1, bias=False)
    (x,) = probe.probe_inputs((3, 17, 19), [2], pixels=True, device="cpu").values()
    assert x.dtype == torch.uint8 and x.shape == (2, 17, 19, 3)
    with torch.no_grad():
        as_is = probe.variant_module(conv, "as-is", device="cpu", pixels=True)
        base = as_is(x).float()
        assert base.min() == 0 and base.max() > 0      # the ReLU
        assert as_is.weight.is_contiguous(memory_format=torch.channels_last)
        assert not as_is.weight.is_contiguous()
        for variant in probe.VARIANTS[1:]:
            module = probe.variant_module(conv, variant, device="cpu", pixels=True)
            got = module(x).float()
            assert (got - base).abs().max() <= 2e-3 * base.abs().max(), variant
        assert probe.variant_module(conv, "w-oihw", device="cpu").weight.is_contiguous()
