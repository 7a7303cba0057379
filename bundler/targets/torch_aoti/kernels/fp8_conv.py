"""FP8 convolution on NHWC activations as an implicit GEMM (Triton), a torch custom op.

Why: the im2col FP8 convolution (``fp8_layers.Fp8ConvNHWC``'s default) concatenates the k x k
shifted views of its input before one ``torch._scaled_mm``: for a 3x3 convolution that
writes and reads 9x the activation bytes in FP8, which is what ResNet-50's 3x3 layers (over
half its FLOPs) cannot afford against cuDNN's fp16 implicit-GEMM convolution. This kernel
gathers the taps while it loads its GEMM tiles, so the input is read from memory (mostly
from L2: neighbouring output pixels share their taps) and never copied.

The GEMM: rows are the output pixels (M = N * Ho * Wo), columns the output channels, the
reduction runs over (kh, kw, C) in that order, the layout of the im2col path's kernel
``[Cout, kh*kw*Cin]`` (rows padded to ``ldw`` columns), so both paths use the same FP8
weight buffer. Operands: the input already quantized to e4m3 with the per-tensor
activation scale, the per-output-channel quantized weight; accumulation into an fp32
register tile, by default as Triton does FP8 dots on sm_90: the tensor cores'
reduced-precision accumulation over the whole reduction (``max_num_imprecise_acc_default =
2**30`` for compute capability 9.0, what cuBLAS calls fast accumulation; the fused op's
``imprecise_acc`` promotes the partial sums to fp32 every n elements instead, at a cost:
ViT-B's MLP with fc1 on this kernel, batch 32, 0.161 -> 0.191 ms with n = 32,
``benchmarks/fp8_mlp_bench.py``); the epilogue multiplies by ``scale[n]`` (activation scale
times the channel's weight scale), adds the bias, optionally applies ReLU, and stores fp16.

Fused epilogues (``fp8_conv_nhwc_fused``, the same kernel with more constexpr switches), for
the fused ResNet bottleneck (``bundler.targets.torch_aoti.fused``): a residual (an fp16
tensor of the output's shape, any NHWC strides) added before the ReLU; and, besides or
instead of the fp16 output, the result quantized to e4m3 with the *next* layer's activation
scale (the fp16 value divided by it in IEEE fp32, saturated to +-448, rounded to nearest
even: ``QuantizeLinear`` of the fp16 tensor the graph has there), so that the next FP8
convolution reads it without a quantize pass of its own. As in the ONNX graph, the
convolution's output is rounded to fp16 before the residual is added, and the sum rounded
to fp16 again. For a transformer MLP's fc1 (``bundler.targets.torch_aoti.fused_mlp``, the
kernel as a 1x1 convolution over the tokens): GELU of the fp16 output (``GELU_FORMS``)
instead of ReLU, before the e4m3 output.

Registered with ``torch.library.triton_op`` as ``trt_bundle::fp8_conv_nhwc`` so that
``torch.compile`` and AOTInductor see the Triton kernel itself (compiled into the package,
launched from its C++ wrapper) rather than an opaque Python call. Block sizes are ints of
the op (``Fp8ConvConfig``), chosen per layer by ``default_config`` from the layer's static
shape: no autotuning at build time, so an AOTInductor build with a dynamic batch has one
kernel per layer and no timing run.

Imports triton at module level: import this module only where triton may be used
(``kernels.available``).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from bundler.fp8 import E4M3_MAX
from bundler.targets.torch_aoti.fp8_layers import conv_output_hw
from bundler.targets.torch_aoti.kernels.launch import traceable

__all__ = ["GELU_FORMS", "Fp8ConvConfig", "CANDIDATE_CONFIGS", "FEW_STAGE_CONFIGS",
           "SMALL_BATCH_CONFIGS", "MEASURED_TILES",
           "MEASURED_TILES_BATCH1", "MEASURED_TILES_BATCH2", "MEASURED_TILES_BATCH4",
           "MEASURED_TILES_BY_BATCH", "TileKey", "TileTable", "tile_key", "small_batch_config", "linear_small_batch_config", "default_config", "config_for", "fp8_conv_nhwc", "fp8_conv",
           "fp8_conv_nhwc_fused", "fp8_conv_fused"]

OP = "trt_bundle::fp8_conv_nhwc"
#: GELU in the fused epilogue (``fp8_conv_fused(gelu=)``) -> the kernel's GELU switch:
#: "erf" libdevice's erf (exact to fp32), "erfc" ``_gelu_erfc`` (|error| <= 1.5e-7, about a
#: third of the instructions).
GELU_FORMS = {"erf": 1, "erfc": 2}
FUSED_OP = "trt_bundle::fp8_conv_nhwc_fused"


class Fp8ConvConfig(NamedTuple):
    """Tile sizes and launch settings of one kernel instance."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    num_warps: int = 8
    num_stages: int = 3
    group_m: int = 8


#: What ``benchmarks/fp8_conv_bench.py`` tries per shape besides ``default_config``:
#: Hopper-sized tiles (FP8 dots need block_k >= 32) that fit 3-4 stages in shared memory,
#: and small ones for ResNet-50's 7x7 and 14x14 stages (at batch 32, 1568 output rows: a
#: 128x128 tile gives 52 programs of 2048 -> 512 for 132 SMs; 64x64 gives 200).
CANDIDATE_CONFIGS = (
    Fp8ConvConfig(128, 256, 64, 8, 3),
    Fp8ConvConfig(256, 128, 64, 8, 3),
    Fp8ConvConfig(64, 128, 64, 4, 4),
    Fp8ConvConfig(128, 64, 128, 4, 3),
    Fp8ConvConfig(64, 64, 128, 4, 3),
)

#: What ``fp8_conv_bench.py --fused-layers`` also tries at batch 32: fewer pipeline stages.
#: Why: ResNet-50's 1x1 layers of 64-256 input channels reduce over one to four k tiles, and
#: at batch 32 run at 2-5x their DRAM time (the 64->256 residual layer at 56x56: 0.064 ms
#: for ~128 MB, docs/measurements/h200-2026-12-01-s6/tiles.log); stages a short loop cannot
#: fill only take shared memory. Measured on an H100 (docs/measurements/h100-2026-12-06-d):
#: two shapes gain (64->64 at 56x56: 0.019 -> 0.013 ms), the compiled model 0.6%.
FEW_STAGE_CONFIGS = (
    Fp8ConvConfig(64, 128, 64, 4, 1),
    Fp8ConvConfig(64, 128, 64, 4, 2),
    Fp8ConvConfig(128, 64, 128, 4, 1),
    Fp8ConvConfig(128, 64, 64, 4, 2),
    Fp8ConvConfig(128, 128, 64, 8, 2),
    Fp8ConvConfig(64, 64, 128, 4, 2),
)

#: What the benchmark also tries at small batches (``--batch`` <= 8): at batch 1 ResNet-50's
#: layers have 49 to 3,136 output rows, and a 128-row tile leaves most of the 132 SMs idle
#: (the 7x7 stage's 512 output channels in 64-column tiles: 8 programs). Tiles of 16-64 rows
#: and 32-64 columns (FP8 dots: block_k >= 32; below 64 rows Triton uses mma.sync, not wgmma).
SMALL_BATCH_CONFIGS = (
    Fp8ConvConfig(16, 32, 128, 2, 4),
    Fp8ConvConfig(16, 64, 128, 4, 4),
    Fp8ConvConfig(32, 32, 128, 4, 4),
    Fp8ConvConfig(32, 64, 128, 4, 3),
    Fp8ConvConfig(16, 32, 256, 4, 3),
    Fp8ConvConfig(64, 32, 128, 4, 3),
    Fp8ConvConfig(32, 128, 64, 4, 4),
)


#: A layer's shape as the tile tables key it: (cin, cout, kh, kw, sh, sw). The input size is
#: not in it: in one network at one input size (ResNet-50 at 224) these six tell the layers
#: apart, and a table is measured for one such network.
TileKey = tuple[int, int, int, int, int, int]
TileTable = dict[TileKey, Fp8ConvConfig]

#: Tiles measured per layer shape on the GPU (``benchmarks/fp8_conv_bench.py --fused-layers``
#: prints this literal), preferred over ``default_config``'s rule by ``config_for``. These:
#: timm ResNet-50's 22 FP8 layer shapes at 224x224, batch 32, the fused op with the epilogue
#: the fused model gives each layer (count-weighted where a shape has several), NVIDIA H200,
#: torch 2.11 / triton 3.6, 2026-12-01 (``docs/measurements/h200-2026-12-01-s6/tiles.log``).
#: The comment after each entry: that shape's summed time with these tiles, then with the
#: default rule's. Another GPU or network: measure again and paste its table here.
MEASURED_TILES: TileTable = {
    (64, 64, 1, 1, 1, 1): Fp8ConvConfig(128, 64, 64, 4, 4, 8),  # 1x1 s1 64->64 @56: 0.0171 ms, default 0.0171
    (64, 64, 3, 3, 1, 1): Fp8ConvConfig(128, 64, 64, 4, 4, 8),  # 3x3 s1 64->64 @56: 0.0753 ms, default 0.0753
    (64, 256, 1, 1, 1, 1): Fp8ConvConfig(64, 128, 64, 4, 4, 8),  # 1x1 s1 64->256 @56: 0.2202 ms, default 0.3184
    (256, 64, 1, 1, 1, 1): Fp8ConvConfig(128, 64, 128, 4, 3, 8),  # 1x1 s1 256->64 @56: 0.0358 ms, default 0.0358
    (256, 128, 1, 1, 1, 1): Fp8ConvConfig(256, 128, 64, 8, 3, 8),  # 1x1 s1 256->128 @56: 0.0276 ms, default 0.0289
    (128, 128, 3, 3, 2, 2): Fp8ConvConfig(128, 64, 128, 4, 3, 8),  # 3x3 s2 128->128 @56: 0.0182 ms, default 0.0227
    (128, 512, 1, 1, 1, 1): Fp8ConvConfig(128, 64, 128, 4, 3, 8),  # 1x1 s1 128->512 @28: 0.1509 ms, default 0.2012
    (256, 512, 1, 1, 2, 2): Fp8ConvConfig(256, 128, 64, 8, 3, 8),  # 1x1 s2 256->512 @56: 0.0222 ms, default 0.0286
    (512, 128, 1, 1, 1, 1): Fp8ConvConfig(128, 64, 128, 4, 3, 8),  # 1x1 s1 512->128 @28: 0.0391 ms, default 0.0421
    (128, 128, 3, 3, 1, 1): Fp8ConvConfig(128, 64, 128, 4, 3, 8),  # 3x3 s1 128->128 @28: 0.0601 ms, default 0.0714
    (512, 256, 1, 1, 1, 1): Fp8ConvConfig(128, 128, 128, 8, 3, 8),  # 1x1 s1 512->256 @28: 0.0209 ms, default 0.0209
    (256, 256, 3, 3, 2, 2): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 3x3 s2 256->256 @28: 0.0175 ms, default 0.0184
    (256, 1024, 1, 1, 1, 1): Fp8ConvConfig(64, 128, 64, 4, 4, 8),  # 1x1 s1 256->1024 @14: 0.1475 ms, default 0.1663
    (512, 1024, 1, 1, 2, 2): Fp8ConvConfig(64, 128, 64, 4, 4, 8),  # 1x1 s2 512->1024 @28: 0.0208 ms, default 0.0220
    (1024, 256, 1, 1, 1, 1): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 1x1 s1 1024->256 @14: 0.0592 ms, default 0.0603
    (256, 256, 3, 3, 1, 1): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 3x3 s1 256->256 @14: 0.0975 ms, default 0.1018
    (1024, 512, 1, 1, 1, 1): Fp8ConvConfig(128, 64, 128, 4, 3, 8),  # 1x1 s1 1024->512 @14: 0.0164 ms, default 0.0174
    (512, 512, 3, 3, 2, 2): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 3x3 s2 512->512 @14: 0.0215 ms, default 0.0279
    (512, 2048, 1, 1, 1, 1): Fp8ConvConfig(256, 128, 64, 8, 3, 8),  # 1x1 s1 512->2048 @7: 0.0534 ms, default 0.0549
    (1024, 2048, 1, 1, 2, 2): Fp8ConvConfig(256, 128, 64, 8, 3, 8),  # 1x1 s2 1024->2048 @14: 0.0162 ms, default 0.0190
    (2048, 512, 1, 1, 1, 1): Fp8ConvConfig(128, 64, 128, 4, 3, 8),  # 1x1 s1 2048->512 @7: 0.0336 ms, default 0.0339
    (512, 512, 3, 3, 1, 1): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 3x3 s1 512->512 @7: 0.0460 ms, default 0.0595
}


#: The same at batch 1 (``fp8_conv_bench.py --fused-layers --batch 1``, which also tries
#: ``SMALL_BATCH_CONFIGS``), for the graph a family compiles for static batch 1 (timm_resnet50:
#: ``torch_aoti.static_batches`` includes 1). NVIDIA H200, torch 2.11 / triton 3.6, 2026-12-01
#: (``docs/measurements/h200-2026-12-01-s7/tiles-b1.log``): the 52 fused convolutions 0.906 ms
#: with the batch-32 rule's tiles, 0.616 ms with these; the compiled model 0.444 -> 0.338 ms.
MEASURED_TILES_BATCH1: TileTable = {
    (64, 64, 1, 1, 1, 1): Fp8ConvConfig(16, 32, 256, 4, 3, 8),  # 1x1 s1 64->64 @56: 0.0113 ms, default 0.0159
    (64, 64, 3, 3, 1, 1): Fp8ConvConfig(64, 128, 64, 4, 4, 8),  # 3x3 s1 64->64 @56: 0.0338 ms, default 0.0344
    (64, 256, 1, 1, 1, 1): Fp8ConvConfig(64, 128, 64, 4, 4, 8),  # 1x1 s1 64->256 @56: 0.0455 ms, default 0.0611
    (256, 64, 1, 1, 1, 1): Fp8ConvConfig(32, 64, 128, 4, 3, 8),  # 1x1 s1 256->64 @56: 0.0224 ms, default 0.0404
    (256, 128, 1, 1, 1, 1): Fp8ConvConfig(32, 32, 128, 4, 4, 8),  # 1x1 s1 256->128 @56: 0.0107 ms, default 0.0158
    (128, 128, 3, 3, 2, 2): Fp8ConvConfig(128, 64, 128, 4, 3, 8),  # 3x3 s2 128->128 @56: 0.0115 ms, default 0.0187
    (128, 512, 1, 1, 1, 1): Fp8ConvConfig(32, 64, 128, 4, 3, 8),  # 1x1 s1 128->512 @28: 0.0431 ms, default 0.0726
    (256, 512, 1, 1, 2, 2): Fp8ConvConfig(16, 64, 128, 4, 4, 8),  # 1x1 s2 256->512 @56: 0.0108 ms, default 0.0174
    (512, 128, 1, 1, 1, 1): Fp8ConvConfig(64, 32, 128, 4, 3, 8),  # 1x1 s1 512->128 @28: 0.0498 ms, default 0.0548
    (128, 128, 3, 3, 1, 1): Fp8ConvConfig(32, 32, 128, 4, 4, 8),  # 3x3 s1 128->128 @28: 0.0333 ms, default 0.0448
    (512, 256, 1, 1, 1, 1): Fp8ConvConfig(16, 32, 256, 4, 3, 8),  # 1x1 s1 512->256 @28: 0.0112 ms, default 0.0175
    (256, 256, 3, 3, 2, 2): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 3x3 s2 256->256 @28: 0.0119 ms, default 0.0199
    (256, 1024, 1, 1, 1, 1): Fp8ConvConfig(16, 32, 128, 2, 4, 8),  # 1x1 s1 256->1024 @14: 0.0663 ms, default 0.1070
    (512, 1024, 1, 1, 2, 2): Fp8ConvConfig(256, 128, 64, 8, 3, 8),  # 1x1 s2 512->1024 @28: 0.0115 ms, default 0.0180
    (1024, 256, 1, 1, 1, 1): Fp8ConvConfig(128, 64, 128, 4, 3, 8),  # 1x1 s1 1024->256 @14: 0.0538 ms, default 0.0868
    (256, 256, 3, 3, 1, 1): Fp8ConvConfig(32, 32, 128, 4, 4, 8),  # 3x3 s1 256->256 @14: 0.0550 ms, default 0.0990
    (1024, 512, 1, 1, 1, 1): Fp8ConvConfig(32, 64, 128, 4, 3, 8),  # 1x1 s1 1024->512 @14: 0.0107 ms, default 0.0120
    (512, 512, 3, 3, 2, 2): Fp8ConvConfig(16, 32, 256, 4, 3, 8),  # 3x3 s2 512->512 @14: 0.0139 ms, default 0.0298
    (512, 2048, 1, 1, 1, 1): Fp8ConvConfig(32, 32, 128, 4, 4, 8),  # 1x1 s1 512->2048 @7: 0.0312 ms, default 0.0335
    (1024, 2048, 1, 1, 2, 2): Fp8ConvConfig(32, 32, 128, 4, 4, 8),  # 1x1 s2 1024->2048 @14: 0.0107 ms, default 0.0111
    (2048, 512, 1, 1, 1, 1): Fp8ConvConfig(16, 32, 256, 4, 3, 8),  # 1x1 s1 2048->512 @7: 0.0333 ms, default 0.0348
    (512, 512, 3, 3, 1, 1): Fp8ConvConfig(16, 32, 256, 4, 3, 8),  # 3x3 s1 512->512 @7: 0.0352 ms, default 0.0605
}


#: The same at batch 2 (``fp8_conv_bench.py --fused-layers --batch 2``, small-batch tiles
#: tried too), for timm_resnet50's static batch-2 graph. NVIDIA H100 80GB HBM3 (sm_90, as
#: the H200), torch 2.11 / triton 3.6, 2026-12-06 (``docs/measurements/h100-2026-12-06-g/
#: call1-first.log``): the 52 fused convolutions 0.675 ms with the batch-32 tiles, 0.473 ms with
#: these; the model compiled for batch 2: fp8 0.478 -> 0.364 ms, fp16 0.413.
MEASURED_TILES_BATCH2: TileTable = {
    (64, 64, 1, 1, 1, 1): Fp8ConvConfig(32, 32, 128, 4, 4, 8),  # 1x1 s1 64->64 @56: 0.0077 ms, default 0.0095
    (64, 64, 3, 3, 1, 1): Fp8ConvConfig(64, 128, 64, 4, 4, 8),  # 3x3 s1 64->64 @56: 0.0276 ms, default 0.0284
    (64, 256, 1, 1, 1, 1): Fp8ConvConfig(32, 128, 64, 4, 4, 8),  # 1x1 s1 64->256 @56: 0.0350 ms, default 0.0397
    (256, 64, 1, 1, 1, 1): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 1x1 s1 256->64 @56: 0.0156 ms, default 0.0179
    (256, 128, 1, 1, 1, 1): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 1x1 s1 256->128 @56: 0.0082 ms, default 0.0088
    (128, 128, 3, 3, 2, 2): Fp8ConvConfig(64, 32, 128, 4, 3, 8),  # 3x3 s2 128->128 @56: 0.0089 ms, default 0.0145
    (128, 512, 1, 1, 1, 1): Fp8ConvConfig(32, 64, 128, 4, 3, 8),  # 1x1 s1 128->512 @28: 0.0354 ms, default 0.0415
    (256, 512, 1, 1, 2, 2): Fp8ConvConfig(128, 64, 128, 4, 3, 8),  # 1x1 s2 256->512 @56: 0.0087 ms, default 0.0135
    (512, 128, 1, 1, 1, 1): Fp8ConvConfig(128, 64, 128, 4, 3, 8),  # 1x1 s1 512->128 @28: 0.0247 ms, default 0.0400
    (128, 128, 3, 3, 1, 1): Fp8ConvConfig(64, 32, 128, 4, 3, 8),  # 3x3 s1 128->128 @28: 0.0269 ms, default 0.0441
    (512, 256, 1, 1, 1, 1): Fp8ConvConfig(32, 128, 64, 4, 4, 8),  # 1x1 s1 512->256 @28: 0.0089 ms, default 0.0099
    (256, 256, 3, 3, 2, 2): Fp8ConvConfig(32, 32, 128, 4, 4, 8),  # 3x3 s2 256->256 @28: 0.0107 ms, default 0.0177
    (256, 1024, 1, 1, 1, 1): Fp8ConvConfig(16, 64, 128, 4, 4, 8),  # 1x1 s1 256->1024 @14: 0.0492 ms, default 0.0636
    (512, 1024, 1, 1, 2, 2): Fp8ConvConfig(32, 128, 64, 4, 4, 8),  # 1x1 s2 512->1024 @28: 0.0089 ms, default 0.0095
    (1024, 256, 1, 1, 1, 1): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 1x1 s1 1024->256 @14: 0.0430 ms, default 0.0587
    (256, 256, 3, 3, 1, 1): Fp8ConvConfig(16, 32, 128, 2, 4, 8),  # 3x3 s1 256->256 @14: 0.0554 ms, default 0.0901
    (1024, 512, 1, 1, 1, 1): Fp8ConvConfig(64, 32, 128, 4, 3, 8),  # 1x1 s1 1024->512 @14: 0.0085 ms, default 0.0115
    (512, 512, 3, 3, 2, 2): Fp8ConvConfig(16, 32, 256, 4, 3, 8),  # 3x3 s2 512->512 @14: 0.0141 ms, default 0.0272
    (512, 2048, 1, 1, 1, 1): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 1x1 s1 512->2048 @7: 0.0258 ms, default 0.0325
    (1024, 2048, 1, 1, 2, 2): Fp8ConvConfig(64, 32, 128, 4, 3, 8),  # 1x1 s2 1024->2048 @14: 0.0087 ms, default 0.0109
    (2048, 512, 1, 1, 1, 1): Fp8ConvConfig(16, 32, 256, 4, 3, 8),  # 1x1 s1 2048->512 @7: 0.0170 ms, default 0.0302
    (512, 512, 3, 3, 1, 1): Fp8ConvConfig(16, 32, 256, 4, 3, 8),  # 3x3 s1 512->512 @7: 0.0269 ms, default 0.0552
}


#: The same at batch 4, for timm_resnet50's static batch-4 graph: NVIDIA H100, torch 2.11 /
#: triton 3.6, 2026-12-06, each layer timed as 20 calls in one CUDA graph (the table before
#: was timed one call a replay, whose own ~10 us hid most layers' differences at this batch;
#: ``docs/measurements/h100-2026-12-06-i/r50-tiles-b4.log``): the 52 fused convolutions 0.500
#: ms with the batch-32 tiles, 0.318 ms with these; the model compiled for batch 4: fp8 with
#: the table before 0.452 ms, with these 0.423 ms, fp16 0.481 (1.064x -> 1.138x); the fp8
#: bundle at batch 4: 0.970x -> 1.019x its fp16 bundle (call 3 there).
MEASURED_TILES_BATCH4: TileTable = {
    (64, 64, 1, 1, 1, 1): Fp8ConvConfig(128, 64, 64, 4, 4, 8),  # 1x1 s1 64->64 @56: 0.0035 ms, default 0.0035
    (64, 64, 3, 3, 1, 1): Fp8ConvConfig(128, 64, 64, 4, 4, 8),  # 3x3 s1 64->64 @56: 0.0184 ms, default 0.0184
    (64, 256, 1, 1, 1, 1): Fp8ConvConfig(64, 128, 64, 4, 4, 8),  # 1x1 s1 64->256 @56: 0.0293 ms, default 0.0433
    (256, 64, 1, 1, 1, 1): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 1x1 s1 256->64 @56: 0.0084 ms, default 0.0092
    (256, 128, 1, 1, 1, 1): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 1x1 s1 256->128 @56: 0.0054 ms, default 0.0059
    (128, 128, 3, 3, 2, 2): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 3x3 s2 128->128 @56: 0.0057 ms, default 0.0112
    (128, 512, 1, 1, 1, 1): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 1x1 s1 128->512 @28: 0.0240 ms, default 0.0287
    (256, 512, 1, 1, 2, 2): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 1x1 s2 256->512 @56: 0.0050 ms, default 0.0054
    (512, 128, 1, 1, 1, 1): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 1x1 s1 512->128 @28: 0.0120 ms, default 0.0194
    (128, 128, 3, 3, 1, 1): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 3x3 s1 128->128 @28: 0.0176 ms, default 0.0341
    (512, 256, 1, 1, 1, 1): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 1x1 s1 512->256 @28: 0.0050 ms, default 0.0066
    (256, 256, 3, 3, 2, 2): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 3x3 s2 256->256 @28: 0.0082 ms, default 0.0141
    (256, 1024, 1, 1, 1, 1): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 1x1 s1 256->1024 @14: 0.0310 ms, default 0.0449
    (512, 1024, 1, 1, 2, 2): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 1x1 s2 512->1024 @28: 0.0045 ms, default 0.0059
    (1024, 256, 1, 1, 1, 1): Fp8ConvConfig(64, 32, 128, 4, 3, 8),  # 1x1 s1 1024->256 @14: 0.0241 ms, default 0.0401
    (256, 256, 3, 3, 1, 1): Fp8ConvConfig(64, 32, 128, 4, 3, 8),  # 3x3 s1 256->256 @14: 0.0413 ms, default 0.0718
    (1024, 512, 1, 1, 1, 1): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 1x1 s1 1024->512 @14: 0.0050 ms, default 0.0083
    (512, 512, 3, 3, 2, 2): Fp8ConvConfig(32, 32, 128, 4, 4, 8),  # 3x3 s2 512->512 @14: 0.0124 ms, default 0.0239
    (512, 2048, 1, 1, 1, 1): Fp8ConvConfig(64, 32, 128, 4, 3, 8),  # 1x1 s1 512->2048 @7: 0.0140 ms, default 0.0232
    (1024, 2048, 1, 1, 2, 2): Fp8ConvConfig(64, 64, 128, 4, 3, 8),  # 1x1 s2 1024->2048 @14: 0.0051 ms, default 0.0078
    (2048, 512, 1, 1, 1, 1): Fp8ConvConfig(16, 32, 256, 4, 3, 8),  # 1x1 s1 2048->512 @7: 0.0135 ms, default 0.0243
    (512, 512, 3, 3, 1, 1): Fp8ConvConfig(32, 32, 128, 4, 4, 8),  # 3x3 s1 512->512 @7: 0.0249 ms, default 0.0496
}


#: Tables for graphs compiled for one static batch (family.json ``torch_aoti.static_batches``):
#: batch -> its table. A layer traced with a static batch that has a table here takes its tiles
#: from it (``config_for(batch=)``); a dynamic-batch graph takes ``MEASURED_TILES``.
MEASURED_TILES_BY_BATCH: dict[int, TileTable] = {
    1: MEASURED_TILES_BATCH1, 2: MEASURED_TILES_BATCH2, 4: MEASURED_TILES_BATCH4,
    32: MEASURED_TILES}


def tile_key(cin: int, cout: int, kernel: tuple[int, int], stride: tuple[int, int]) -> TileKey:
    """The key of a layer in a tile table (``TileKey``)."""
    return (int(cin), int(cout), int(kernel[0]), int(kernel[1]), int(stride[0]), int(stride[1]))


def config_for(cin: int, cout: int, kernel: tuple[int, int], stride: tuple[int, int],
               tiles: TileTable | None = None, batch: int | None = None,
               batch_tables: dict[int, TileTable] | None = None) -> Fp8ConvConfig:
    """The tiles of a layer: from ``tiles`` (a caller's measured table), else from the
    table measured for exactly ``batch`` (``batch_tables``, default
    ``MEASURED_TILES_BY_BATCH``; batch None: a dynamic batch), else from
    ``MEASURED_TILES``, else ``default_config``'s rule."""
    key = tile_key(cin, cout, kernel, stride)
    tables = MEASURED_TILES_BY_BATCH if batch_tables is None else batch_tables
    by_batch = tables.get(batch, {}) if batch is not None else {}
    for table in (tiles or {}, by_batch, MEASURED_TILES):
        if key in table:
            return Fp8ConvConfig(*table[key])
    return default_config(cin, cout, kernel)


def small_batch_config(cin: int, cout: int, rows: int) -> Fp8ConvConfig:
    """Tiles for a layer of ``rows`` output pixels at a small batch, from what ResNet-50's
    batch-1 layers measured best (``MEASURED_TILES_BATCH1``): 16-row tiles and a deep k tile
    up to 256 rows, 32x32 up to 1,024, 32x64 beyond. A first rule, not a measurement of
    the layer itself (``fp8_conv_bench.py --fused-layers --batch 1`` measures ResNet-50's)."""
    if rows <= 256:
        return (Fp8ConvConfig(16, 32, 256, 4, 3) if cin >= 256
                else Fp8ConvConfig(16, 32, 128, 2, 4))
    if rows <= 1024:
        return Fp8ConvConfig(32, 32, 128, 4, 4)
    return Fp8ConvConfig(32, 64, 128, 4, 3)


def linear_small_batch_config(cin: int) -> Fp8ConvConfig:
    """Tiles for a Linear layer's tokens at a small static batch (``Fp8Linear``'s "triton"
    form): 64x64 with a 128-deep k tile, 256-deep for a long reduction. Measured on ViT-B's
    four shapes at 197 and 394 rows on an H100 (``benchmarks/vit_gemm_small_probe.py``,
    docs/measurements/h100-2026-12-06-j): within 2% of the best of 13 tile sets on each
    shape, where ``small_batch_config``'s 16-row tiles ran at 0.4-0.6x fp16's GEMM."""
    return Fp8ConvConfig(64, 64, 256 if cin >= 2048 else 128, 4, 3, 8)


def default_config(cin: int, cout: int, kernel: tuple[int, int]) -> Fp8ConvConfig:
    """The tiles for a layer of ``cin`` -> ``cout`` channels: 128x128x64 (8 warps) by
    default, narrower for layers of fewer than 128 output channels (ResNet-50's first stage)
    and a deeper k tile where one tap has many channels. A first rule, to be replaced by
    what ``benchmarks/fp8_conv_bench.py`` measures on the H200."""
    del kernel  # the tap count changes the loop length, not the best tile (to be measured)
    block_n = 64 if cout <= 64 else 128
    block_k = 128 if cin >= 256 and cin % 128 == 0 else 64
    warps = 8 if block_n == 128 else 4
    return Fp8ConvConfig(128, block_n, block_k, warps, 3 if block_k == 128 else 4)


@triton.jit
def _quantize_e4m3(v, s, inv, QMAX: tl.constexpr):
    """``e4m3(clamp(v / s, +-QMAX))`` with ``v / s`` rounded to fp32 exactly as IEEE division
    (``div_rn``, torch's and ONNX QuantizeLinear's), from the reciprocal ``inv = RN(1 / s)``:
    three multiply-adds instead of a division per element. ``q0 = RN(v * inv)`` is within one
    ulp of ``v / s``; the remainder ``v - q0 * s`` is then exact in one fma, and one
    correction ``RN(q0 + r * inv)`` is the correctly rounded quotient (Markstein's theorem;
    no over- or underflow here: |v| <= 65504 and 2^-14 <= s, as fp16 values). ``q0`` is first
    clamped to +-2 QMAX so that an infinite ``v`` (fp16 overflow) saturates with its sign
    instead of becoming NaN; anything beyond QMAX saturates anyway."""
    q0 = tl.minimum(tl.maximum(v * inv, -2.0 * QMAX), 2.0 * QMAX)
    r = tl.fma(q0, s, -v)          # minus the remainder: written so that -0 stays -0
    q = tl.fma(-r, inv, q0)
    q = tl.minimum(tl.maximum(q, -QMAX), QMAX)
    return q.to(tl.float8e4nv)


@triton.jit
def _gelu_erfc(g):
    """GELU(g) = g * Phi(g) with Phi from erfc in Abramowitz & Stegun's 7.1.26 form
    (``erfc(z) = t * P(t) * exp(-z^2)``, ``t = 1 / (1 + p z)``, |error| <= 1.5e-7): one
    reciprocal, one exponential and six multiply-adds, where libdevice's ``erff`` costs
    about 40 instructions. Why: in fc1's epilogue (ViT-B: 3,072 values per token) the exact
    erf is compute-bound, 26 us of a 45 us GEMM on the H200 (``benchmarks/fp8_mlp_bench.py``).
    For g < 0, Phi(g) = erfc(|g| / sqrt 2) / 2 is taken as it is (no 1 + erf cancellation).
    The output is rounded to fp16, then to e4m3: the error changes a value only at a
    rounding tie of either."""
    z = tl.abs(g) * 0.7071067811865476
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741
                                                       + t * (-1.453152027 + t * 1.061405429))))
    half_erfc = 0.5 * poly * tl.exp(-z * z)
    return g * tl.where(g >= 0, 1.0 - half_erfc, half_erfc)


@triton.jit
def _window_origins(offs_m, HO, WO, SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr,
                    PW: tl.constexpr):
    """Output pixels (flat NHWC row indices) -> (image, output row, output column, top and
    left input coordinates of their windows): a convolution kernel's row indexing."""
    wo = offs_m % WO
    ho = (offs_m // WO) % HO
    img = offs_m // (WO * HO)
    return img, ho, wo, ho * SH - PH, wo * SW - PW


@triton.jit
def _grouped_tile(pid, M, COUT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  GROUP_M: tl.constexpr):
    """Program ``pid`` -> its (row tile, column tile) in grouped order: GROUP_M row tiles
    take the column tiles in turn, so that they share those weights in L2."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(COUT, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_size, (pid % per_group) // group_size


@triton.jit
def _fp8_conv_nhwc_kernel(
        x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr, res_ptr, q_ptr, q_scale_ptr,
        M, H, W, C, HO, WO, COUT,
        stride_xn, stride_xh, stride_xw, ldw, stride_rn, stride_rh, stride_rw,
        KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
        PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
        RELU: tl.constexpr, EVEN_C: tl.constexpr, RESIDUAL: tl.constexpr,
        RES_CONTIG: tl.constexpr, OUT_F16: tl.constexpr, OUT_F8: tl.constexpr, QMAX: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr, GELU: tl.constexpr = 0, IMPRECISE_ACC: tl.constexpr = None):
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, COUT, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < COUT
    img, ho, wo, ih0, iw0 = _window_origins(offs_m, HO, WO, SH, SW, PH, PW)
    x_rows = x_ptr + img.to(tl.int64) * stride_xn
    w_cols = w_ptr + offs_n.to(tl.int64) * ldw

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    c_tiles = tl.cdiv(C, BLOCK_K)
    for it in range(0, KH * KW * c_tiles):
        tap = it // c_tiles
        c = (it % c_tiles) * BLOCK_K + offs_k
        ih = ih0 + (tap // KW) * DH
        iw = iw0 + (tap % KW) * DW
        inside = m_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)   # zero padding
        a_ptrs = x_rows[:, None] + (ih * stride_xh + iw * stride_xw)[:, None] + c[None, :]
        b_ptrs = w_cols[None, :] + (tap * C + c)[:, None]
        if EVEN_C:
            a = tl.load(a_ptrs, mask=inside[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=n_ok[None, :], other=0.0)
        else:
            c_ok = c < C
            a = tl.load(a_ptrs, mask=inside[:, None] & c_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=n_ok[None, :] & c_ok[:, None], other=0.0)
        acc = tl.dot(a, b, acc, max_num_imprecise_acc=IMPRECISE_ACC)

    # (loaded after the K loop: loaded before it, they stay live in registers through it,
    # +20-40 registers per thread on sm_90, fewer resident programs for the small tiles)
    scale = tl.load(scale_ptr + offs_n, mask=n_ok, other=0.0)
    bias = tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0)
    y = acc * scale[None, :] + bias[None, :]
    ok = m_ok[:, None] & n_ok[None, :]
    out_offs = offs_m.to(tl.int64)[:, None] * COUT + offs_n[None, :]
    if RESIDUAL:   # fp16, the output's shape, channels contiguous
        if RES_CONTIG:     # dense NHWC (the fused model's residuals): the output's offsets
            r = tl.load(res_ptr + out_offs, mask=ok, other=0.0)
        else:              # any NHWC strides (a view)
            r_rows = img.to(tl.int64) * stride_rn + ho * stride_rh + wo * stride_rw
            r = tl.load(res_ptr + r_rows[:, None] + offs_n[None, :], mask=ok, other=0.0)
        # the graph's fp16 Conv output, then its fp16 Add (two roundings, as ONNX has them)
        y = y.to(tl.float16).to(tl.float32) + r.to(tl.float32)
    if RELU:
        y = tl.maximum(y, 0.0)
    if GELU:       # the graph's fp16 MatMul + Add output, then GELU computed in fp32
        g = y.to(tl.float16).to(tl.float32)
        if GELU == 1:
            y = 0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476))
        else:
            y = _gelu_erfc(g)
    y16 = y.to(tl.float16)
    if OUT_F16:
        tl.store(out_ptr + out_offs, y16, mask=ok)
    if OUT_F8:     # QuantizeLinear of the fp16 value with the next layer's scale
        q_scale = tl.load(q_scale_ptr)
        q_inv = tl.math.div_rn(tl.full([], 1.0, tl.float32), q_scale)   # RN(1 / scale), once
        tl.store(q_ptr + out_offs, _quantize_e4m3(y16.to(tl.float32), q_scale, q_inv, QMAX),
                 mask=ok)


@triton_op(OP, mutates_args={})
def fp8_conv_nhwc(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                  bias: torch.Tensor, cout: int, kh: int, kw: int, sh: int, sw: int,
                  ph: int, pw: int, dh: int, dw: int, relu: bool, block_m: int,
                  block_n: int, block_k: int, num_warps: int, num_stages: int,
                  group_m: int) -> torch.Tensor:
    """``x`` e4m3 [N, H, W, C] (channels contiguous), ``weight`` e4m3 [>= cout, >= kh*kw*C]
    (row-major, (kh, kw, C) order), ``scale`` and ``bias`` fp32 [>= cout] -> fp16
    [N, Ho, Wo, cout] (module docstring)."""
    if x.stride(3) != 1:
        x = x.contiguous()
    n, h, w, c = x.shape
    ho, wo = conv_output_hw(h, w, (kh, kw), (sh, sw), (ph, pw), (dh, dw))
    out = torch.empty((n, ho, wo, cout), dtype=torch.float16, device=x.device)
    m = n * ho * wo
    grid = (triton.cdiv(m, block_m) * triton.cdiv(cout, block_n),)
    traceable(_fp8_conv_nhwc_kernel)[grid](
        x, weight, scale, bias, out, scale, scale, scale, m, h, w, c, ho, wo, cout,
        x.stride(0), x.stride(1), x.stride(2), weight.stride(0), 0, 0, 0,
        KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw, DH=dh, DW=dw, RELU=relu,
        EVEN_C=c % block_k == 0, RESIDUAL=False, RES_CONTIG=False, OUT_F16=True, OUT_F8=False, QMAX=E4M3_MAX,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        GROUP_M=group_m, num_warps=num_warps, num_stages=num_stages)
    return out


@triton_op(FUSED_OP, mutates_args={})
def fp8_conv_nhwc_fused(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                        bias: torch.Tensor, residual: Optional[torch.Tensor],
                        out_scale: Optional[torch.Tensor], out_f16: bool, cout: int, kh: int,
                        kw: int, sh: int, sw: int, ph: int, pw: int, dh: int, dw: int,
                        relu: bool, block_m: int, block_n: int, block_k: int, num_warps: int,
                        num_stages: int, group_m: int, gelu: int,
                        imprecise_acc: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``fp8_conv_nhwc`` with the fused epilogues: ``residual`` fp16 [N, Ho, Wo, cout] (any
    strides, channels contiguous) added before the ReLU; ``gelu``: GELU of the fp16
    result instead (a transformer MLP's fc1; ``GELU_FORMS``: 1 libdevice's erf, 2
    ``_gelu_erfc``); ``out_f16``: write the fp16 result;
    ``out_scale`` (fp32, its first element read): also write it quantized to e4m3 with that scale.
    ``imprecise_acc``: 0 leaves the accumulation to Triton's default (on sm_90 the whole
    reduction in the tensor cores' FP8 accumulator, what cuBLAS calls fast accumulation); n > 0
    adds the tensor cores' partial sums into the fp32 accumulator every n reduction elements.
    Returns (fp16 [N, Ho, Wo, cout], e4m3 [N, Ho, Wo, cout]); an output not asked for is an
    empty tensor (shape [0])."""
    if not out_f16 and out_scale is None:
        raise ValueError("fp8_conv_nhwc_fused: asked for neither output")
    if relu and gelu:
        raise ValueError("fp8_conv_nhwc_fused: ReLU or GELU, not both")
    if gelu not in (0, 1, 2):
        raise ValueError(f"fp8_conv_nhwc_fused: gelu {gelu} is not 0 (none), 1 or 2")
    if x.stride(3) != 1:
        x = x.contiguous()
    n, h, w, c = x.shape
    ho, wo = conv_output_hw(h, w, (kh, kw), (sh, sw), (ph, pw), (dh, dw))
    shape = (n, ho, wo, cout)
    out = torch.empty(shape if out_f16 else (0,), dtype=torch.float16, device=x.device)
    q = torch.empty(shape if out_scale is not None else (0,), dtype=torch.float8_e4m3fn,
                    device=x.device)
    if residual is not None and residual.stride(3) != 1:
        residual = residual.contiguous()
    res = residual if residual is not None else scale     # unread without RESIDUAL
    rs = residual.stride()[:3] if residual is not None else (0, 0, 0)
    m = n * ho * wo
    grid = (triton.cdiv(m, block_m) * triton.cdiv(cout, block_n),)
    traceable(_fp8_conv_nhwc_kernel)[grid](
        x, weight, scale, bias, out, res, q, out_scale if out_scale is not None else scale,
        m, h, w, c, ho, wo, cout,
        x.stride(0), x.stride(1), x.stride(2), weight.stride(0), rs[0], rs[1], rs[2],
        KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw, DH=dh, DW=dw, RELU=relu,
        EVEN_C=c % block_k == 0, RESIDUAL=residual is not None,
        RES_CONTIG=residual is not None and residual.is_contiguous(), OUT_F16=out_f16,
        OUT_F8=out_scale is not None, QMAX=E4M3_MAX, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        GROUP_M=group_m, GELU=gelu, IMPRECISE_ACC=imprecise_acc if imprecise_acc > 0 else None,
        num_warps=num_warps, num_stages=num_stages)
    return out, q


def fp8_conv(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor,
             cout: int, kernel: tuple[int, int], stride: tuple[int, int],
             padding: tuple[int, int], dilation: tuple[int, int] = (1, 1), *,
             relu: bool = False, config: Fp8ConvConfig | None = None) -> torch.Tensor:
    """The op with the geometry as tuples and the tiles as one config (the callers' form)."""
    cfg = config or default_config(x.shape[-1], cout, kernel)
    return torch.ops.trt_bundle.fp8_conv_nhwc(
        x, weight, scale, bias, int(cout), *map(int, kernel), *map(int, stride),
        *map(int, padding), *map(int, dilation), bool(relu), *map(int, cfg))


def fp8_conv_fused(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                   bias: torch.Tensor, cout: int, kernel: tuple[int, int],
                   stride: tuple[int, int], padding: tuple[int, int],
                   dilation: tuple[int, int] = (1, 1), *, residual: torch.Tensor | None = None,
                   relu: bool = False, gelu: str | None = None, out_f16: bool = True,
                   out_scale: torch.Tensor | None = None,
                   config: Fp8ConvConfig | None = None, imprecise_acc: int = 0
                   ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The fused op in the callers' form: (fp16 out or None, e4m3 out or None);
    ``gelu``: None or a ``GELU_FORMS`` name."""
    cfg = config or default_config(x.shape[-1], cout, kernel)
    if gelu is not None and gelu not in GELU_FORMS:
        raise ValueError(f"GELU form {gelu!r}: choose {' or '.join(GELU_FORMS)}")
    y16, y8 = torch.ops.trt_bundle.fp8_conv_nhwc_fused(
        x, weight, scale, bias, residual, out_scale, bool(out_f16), int(cout),
        *map(int, kernel), *map(int, stride), *map(int, padding), *map(int, dilation),
        bool(relu), *map(int, cfg), GELU_FORMS.get(gelu, 0), int(imprecise_acc))
    return (y16 if out_f16 else None), (y8 if out_scale is not None else None)
