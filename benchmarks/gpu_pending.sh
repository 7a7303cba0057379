#!/usr/bin/env bash
# H200 runs that the sessions of 2026-12-03 ran in pieces, kept as one script (results in
# docs/measurements/h200-2026-12-03 and h200-2026-12-03-b):
#
#   benchmarks/gpu_pending.sh dw OUT_DIR      # ~25 s warm, no bundles: the row-strip
#       depthwise tiles (kernels/dw_conv.py DW_ROW_CONFIGS) against the default pixel tile
#       on the 728x19x19 layers (26 of the 39), each tile's e4m3 codes checked against
#       cuDNN + quantize ("differ"). Eleventh session: the best row tile 0.837 ms against
#       the pixel tile's 0.810 (the family keeps `triton`).
#   benchmarks/gpu_pending.sh dw-gather OUT_DIR   # ~2 min warm, no bundles: the depthwise
#       kernel with each input row loaded once (dw_kernel_variants.py gath<R>: its taps by
#       tl.gather, sdot<R>: by 0/1 shift matrices on the tensor cores; not yet timed;
#       docs/measurements/h200-2026-12-03-h) against the shipped kernel and the copy floor
#   benchmarks/gpu_pending.sh skip OUT_DIR   # ~5 min: timm_xception's FP8 1x1 layers on
#       cuBLASLt or the Triton kernel (skip adds in its epilogue), per layer shape and tile
#       (pointwise_kernel_bench.py), then inductor_fp8_bench.py fp16, fp8 and fp8-dwskip at
#       static batch 32
#   benchmarks/gpu_pending.sh cudnn-fp8 OUT_DIR   # ~5 min, no bundles: ResNet-50's FP8
#       convolutions on cuDNN's own FP8 kernels (the cuDNN frontend's Python graph API) next to
#       cuDNN fp16, im2col and the Triton kernel, per layer (fp8_conv_bench.py). Needs the
#       nvidia-cudnn-frontend wheel for cp312 in the carried wheel folder (pip download
#       nvidia-cudnn-frontend ...). Nineteenth session: 0.90x cuDNN fp16 over the 52 layers,
#       the Triton kernel 1.50x (docs/measurements/h200-2026-12-04-b)
#   benchmarks/gpu_pending.sh fp16-peer OUT_DIR   # ~6 min: timm_xception's fp16 bundle
#       (float32 input, built into /tmp/pending) against the torch.compile peer at batch 32,
#       timed and profiled by kernel (aoti_static_vs_peer.py --profile). Nineteenth session:
#       the 0.96x of the eighteenth was one pointwise kernel's block size, timed by Inductor
#       while compiling beside other builds; packages no longer time them (h200-2026-12-04-b)
#   benchmarks/gpu_pending.sh fastacc OUT_DIR   # ~8 min: issue 18's next step for timm_xception.
#       The twenty-first session built the fp8 bundle with fp16 GEMM outputs (the old
#       `fp16out` step): 1.228x fp16 at batch 32 against 1.200x with bf16 outputs, now the
#       family's `fp8_gemm: rowwise-fp16` (docs/measurements/h200-2026-12-04-d). Under
#       torch.compile, fast accumulation on top of it ran 1.287x (h200-2026-12-04-c). This
#       builds the uint8 fp16 and fp8 bundles as the family has them and an fp8 one with
#       `fp8_fast_accum` (into /tmp/pending/fastacc), checks it (verify --numerics) and times
#       the three with the peer in one process (aoti_static_vs_peer.py; its |diff| column is
#       each bundle's distance from the fp16 one). Random weights cannot say what fast
#       accumulation does to real-weights top-1, and on timm_vit_base it cost agreement
#       with fp32 (92.2% -> 84.4%, random weights): family.json keeps it off until they can.
#   benchmarks/gpu_pending.sh vit-patch OUT_DIR   # ~90 s, no bundles: issue 18, timm_vit_base's
#       patch embedding as one GEMM over the patches (model.PatchGemm; twenty-seventh
#       session: 1.13x at batch 32, 1.17-1.21x at batch 1, h200-2026-12-05-b)
#       against cuDNN's 16x16/16 convolution it replaces (-patchconv), fp16
#       and fp8, static batches 1 and 32, one process, profiled by kernel. The 2026-12-01
#       profile had that convolution at 0.233 ms (batch 32) and 0.083 ms (batch 1) plus
#       0.087 / 0.015 ms of layout conversions, of a 2.8 / 0.68 ms fp8 engine
#       (docs/measurements/h200-2026-12-01-s3/vit-fp8.log)
#   benchmarks/gpu_pending.sh vit-peer OUT_DIR    # ~6 min: timm_vit_base's fp16 and fp8
#       bundles with PatchGemm (built in parallel into /tmp/pending/vit), fp8 verified
#       (verify --numerics), both timed with the torch.compile peer in one process (the
#       fp16 bundle against the peer: 1.22x / 1.08x at batch 1 / 32 with PatchGemm).
#       The fp8 build needs onnxruntime >= 1.32 (its reference outputs); the H200 has
#       1.30: carry an onnxruntime cp312 wheel with the others
#   benchmarks/gpu_pending.sh build OUT_DIR      # the uint8-input fp16 and fp8 bundles into
#       /tmp/pending (~200 s; reused while the machine stays warm)
#   benchmarks/gpu_pending.sh prebuild OUT_DIR   # `build` and vit-peer's timm_vit_base
#       fp16 and fp8 bundles, the four at once (~5 min); later steps reuse them (--reuse)
#   benchmarks/gpu_pending.sh overhead OUT_DIR   # issue 14: Model.infer / with_copies,
#       batch 1 and 32, fp8 and fp16 (needs `build`; ~170 s)
#   [SERVE="fp8:8 fp16:8"] benchmarks/gpu_pending.sh serve OUT_DIR   # `build`, then
#       serve_bench.py over HTTP, gRPC, gRPC streaming and HTTP + shared memory, each
#       bundle with its front-end worker count (~170 s per bundle), the 64 clients in 8
#       and in 32 processes (a gRPC client's call holds its process's GIL ~4x as long as
#       an HTTP one's: 8 clients per process may queue on it; the 32-process figures of
#       the eleventh session were void, the clients' start-up is now waited for).
#       PATHS=, GRPC=builtin,grpcio (both gRPC servers side by side), PROCS=8 narrow it;
#       GRPC_CLIENT=raw,grpcio measures the gRPC paths with both clients (raw: the lean
#       h2_grpc_client, the default; grpcio: grpcio's stub, the twelfth session's client);
#       REPEATS=3 measures each path three times next to its own batcher figure and shows
#       the median round (about 3x the time: 8 s a round here).
#   benchmarks/gpu_pending.sh stage OUT_DIR   # `build` (with the GPU tests of stage_rows
#       beside it), then serve_bench.py on the fp8 bundle (STAGE_BUNDLES="fp8 fp16" for
#       both) with the batcher's rows staged ahead of their dispatch off and on, gRPC and
#       HTTP, 64 clients in 8 processes, 16 front-end workers (~7 min on a fresh machine;
#       twenty-ninth session, two H100 hosts: no gain, h100-2026-12-05-d)
#   benchmarks/gpu_pending.sh prepare OUT_DIR   # `build`, then prepare_bench.py on the fp16
#       bundle: its preparation for serving (73 s on an H100, h100-2026-12-05-d) and its
#       graph replay at batch 1 and 32, as is, with cuDNN's v7 API or heuristic mode B,
#       and with graphs for 1,2,4,8,16,24,32 only (cuda_graph_sizes: batches padded up)
#       (~6 min after `build` on the same warm machine: a fresh build and this in one call
#       can pass the 10-minute limit; the GPU tests of prepare and the staged rows run
#       beside the build). Thirty-first session, an H100: default 54.2 s, graph sizes
#       10.7 s with the same replay, load 36 s (h100-2026-12-05-e); the cuDNN variants,
#       the load's phases (now printed under each variant) and the replays at 12 and 17
#       (with graph sizes: the graphs of 16 and 24, what padding costs there) not yet run
#   benchmarks/gpu_pending.sh gputest OUT_DIR   # every GPU test (pytest -m gpu tests), the
#       two that build whole bundles last (~400 s for the other 22 on an H100, thirty-fourth
#       session, each compiling its packages; those two ~3 min each: more than one call
#       holds, GPUTEST_LIMIT= and GPUTEST_BUNDLES_LIMIT= set the two steps' limits;
#       GPUTEST_BUNDLES=0 leaves the two out)
#   benchmarks/gpu_pending.sh pair OUT_DIR   # `build`, then serve_pair_bench.py: the fp8
#       and fp16 bundles served side by side in one process, HTTP and gRPC (PATHS=), 64
#       clients in 8 and 32 processes (PROCS=), REPEATS=3 rounds, each round measuring
#       both bundles back to back: issue 15's fp8/fp16 at the client in one run (~280 s;
#       PAIR_LIMIT= caps the step, 330 s; WORKERS= front-end workers per server, 8;
#       STAGE=on: the batchers stage rows ahead of their dispatch; STAGE=off,on: both,
#       switched live in each round; GRAPH_SIZES: both bundles' CUDA graph sizes, by
#       default 1,2,4,8,16,24 (the fp16 bundle prepares in ~11 s instead of ~54, the same
#       replay, and the rounds' batches are full: thirty-first session), GRAPH_SIZES= for
#       every size. Twenty-ninth session, on an H100: staging off 1.358 / 1.376 over gRPC /
#       HTTP, on 1.229 / 1.289, docs/measurements/h100-2026-12-05-d; thirty-first, another
#       H100, graph sizes: 1.351-1.364 over both, h100-2026-12-05-e)
#   benchmarks/gpu_pending.sh load OUT_DIR   # `build`, then the fp16 bundle's activation by
#       phase (prepare_bench.py), with the load check on, off and on again, each in a process
#       of its own, graph sizes 1,2,4,8,16,24 (thirty-fourth session, H100s: ~66 s -> 5.0 s)
#   benchmarks/gpu_pending.sh tma OUT_DIR   # ~4-5 min, no bundles: issue 18, timm_resnet50's
#       dense 1x1 FP8 convolutions on a TMA version of the fused kernel (fp8_tma_probe.py)
#       against the shipped kernel per layer and epilogue, then a package built on it with
#       AOTInductor (device-side descriptors need Triton's global scratch). The thirty-fifth
#       session ruled out the residual loaded early, fewer stages and persistent programs
#       (h100-2026-12-06-d)
#   benchmarks/gpu_pending.sh tma-small OUT_DIR   # ~2 min a batch, no bundles: issue 18, the
#       same per-layer comparison at batch 1, 4 and 2 (TMA_BATCHES=), host descriptors, the
#       tiles a package can hold with rows from 16 (fp8_tma_probe.py --fit: SMALL_FIT_TILES).
#       The static graphs of batch 1-8 run the shipped kernel: with batch 32's TMA tiles batch
#       1 was slower (0.370 ms against 0.356), a comparison of replay overheads: each layer is
#       now timed 20 calls to a graph (--per-graph); with one call every layer read the
#       replay's own ~10 us, shipped and TMA alike. Forty-first session (h100-2026-12-06-i):
#       TMA 1.28x / 1.22x / 1.39x the shipped layers at batch 1 / 2 / 4 with the tables of
#       the time, about 1.1x against batch 4's re-measured ones
#   benchmarks/gpu_pending.sh resnet-tma OUT_DIR   # ~6-8 min: issue 18, timm_resnet50's fp16
#       and fp8 `triton-fused` bundles (into /tmp/pending/r50; the family's fp8 form until
#       the thirty-seventh session) and an fp8 one with fp8_conv triton-fused-tma (the default now)
#       (the dense 1x1 layers on kernels/fp8_conv_tma.py, into /tmp/pending/r50-tma), built
#       at once; the TMA one verified (verify --numerics), the three timed with the peer in
#       one process (aoti_static_vs_peer.py, batches 1 and 32, or R50_BATCHES=1,2,4,...)
#   benchmarks/gpu_pending.sh first OUT_DIR   # one call that does what a lent card is
#       most needed for, when machines are scarce (thirty-second session: 16 calls got
#       none that ran its command): the GPU tests without the two whole-bundle ones
#       (`GPUTEST_BUNDLES=0 gputest`, ~400 s on an H100), on the card's own torch. The
#       forty-seventh session moved every Triton launch of the kernels onto
#       kernels/launch.py's `traceable` (torch 2.11's wrap_triton refuses an interpreted
#       kernel): on the H200 its ViT and ResNet fp8 builds ran on it (verified) and 5 GPU
#       tests passed before that call's limit; xception's depthwise kernel has not run on it.
#       The same session's H200 (h200-2026-12-07-a) ran `vit-split-k`: the split-K form at
#       0.974x fp16 at batch 1 and 0.993x at 2 against the family's 0.878x / 0.943x, so
#       the family now ships it; and `r50-tma3x3` with the kernel profile: in the package
#       the box kernel takes its 10 layers in 0.159 ms, the shipped kernel with its tuned
#       tiles ~0.157 ms (the probe's 1.20x was against untuned tiles), and the FP8 1x1
#       layers take 0.52 ms against fp16's bare cuBLAS GEMMs' 0.37 (they also move the
#       residual and both outputs): their bandwidth is the next lever for 1.2x.
#       The forty-sixth session's H100 (h100-2026-12-07-b) ran `r50-tma3x3`: the 3x3 TMA form
#       as a bundle no faster than the family's fp8 at batch 32 (1.195 against 1.190 ms)
#       and slower at 3 and 8, so the family keeps triton-fused-tma-small. The forty-fifth's
#       H100 (h100-2026-12-07-a) ran `vit-split-k`
#       with the fp16 base and `tma3x3` (the 3x3 TMA kernel 1.20x the shipped one over
#       those layers in the probe). The forty-fourth's H200 ran `gaps` and `vit-gemm-b1`
#       (h200-2026-12-06-l); the forty-third's `pair` (issue 15's client ratio: 1.211 HTTP,
#       1.210 gRPC, met; `next` repeats it on an H200). The GPU tests (`gputest`) passed on
#       an H100 at c6a1394, all 25 (h100-2026-12-06-h); the replay timeline's and the
#       split-K Linear's at 519d47a (h100-2026-12-07-a); the 3x3 TMA package case
#       (test_fp8_conv_tma.py -k box) failed there at export (fixed at 0e060cb, not rerun
#       as a test; the forty-sixth's r50-tma3x3 bundle, built through the same export,
#       passed `verify --numerics`)
#   benchmarks/gpu_pending.sh gaps OUT_DIR   # ~8 min: issue 18, timm_vit_base's and
#       timm_resnet50's fp16 and fp8 bundles as the families have them, four builds at once;
#       ViT's fp8 (static graphs 1 and 2 since the forty-third session) verified; each
#       family's pair timed with the peer (ViT 1, 2, 32; ResNet 1, 32) and the device
#       timeline of each graph replay (aoti_static_vs_peer.py --timeline,
#       kernel_profile.replay_timeline): the fp8 graphs' replays run 50-85 us longer than
#       their kernels, against 11-35 us for the fp16 bundles (h200-2026-12-06-k); which
#       transitions hold that idle time. Forty-fourth session, H200 (h200-2026-12-06-l):
#       our Triton kernels wait ~0.4 us each, cuBLAS/cuDNN/Inductor ones ~0.1 us; ResNet's
#       fp8 batch 32 idles 25 us (fp16 36): its distance to 1.2x is kernel time
#   benchmarks/gpu_pending.sh b1-next OUT_DIR   # ~6 min: `pdl`, then `vit-b1`: why the fp8
#       batch-1 graphs stay near or under fp16
#   benchmarks/gpu_pending.sh r50-tma-small OUT_DIR   # ~5 min: issue 18, timm_resnet50's fp16
#       and fp8 bundles as the family has them (into /tmp/pending/r50-small) and an fp8 one
#       with fp8_conv triton-fused-tma-small (its static graphs of batch 1, 2 and 4 with the
#       dense 1x1 layers on TMA, MEASURED_TMA_TILES_BY_BATCH: per layer 1.22-1.39x the
#       shipped kernel, h100-2026-12-06-i; into /tmp/pending/r50-tma-small), built at once,
#       the new one verified, the three timed with the peer in one process (batches 1, 2, 4,
#       8, 32; R50_BATCHES=) and profiled by kernel at batch 1 (the fp8 batch-1 graph ran
#       0.371 ms as a package against 0.343 as the module under torch.compile: which kernels
#       differ). Where it wins, family.json's fp8_conv becomes it
#   benchmarks/gpu_pending.sh r50-tiles-b1 OUT_DIR   # ~4 min, no bundles: `r50-tiles-small`
#       at batch 1. MEASURED_TILES_BATCH1 was picked with each layer timed one call a
#       replay, whose own ~10 us hid the differences (batch 4's re-measured tiles took its
#       bundle from 0.970x to 1.019x fp16); batch 1 is at parity (1.007x)
#   benchmarks/gpu_pending.sh families OUT_DIR   # ~8 min on any card: `prebuild` (timm_xception's
#       uint8 pair and timm_vit_base's fp16 and fp8, four builds at once), then `vit-peer`
#       on the ViT bundles: every image family's bundles built at the commit, ViT timed
#   benchmarks/gpu_pending.sh xception-time OUT_DIR   # `build` (reused after `families`),
#       then timm_xception's uint8 fp16 and fp8 bundles with the peer, batches 1 and 32
#   benchmarks/gpu_pending.sh r50-tiles-small OUT_DIR   # ~8 min a size (one call each:
#       SMALL_BATCHES=2, then SMALL_BATCHES=4), no bundles: timm_resnet50's fused FP8 layers
#       at batch 2 and 4, every candidate tile (fp8_conv_bench.py --fused-layers --batch N),
#       each printing a MEASURED_TILES_BATCH<N> table, then the model compiled for that batch:
#       fp16, fp8 fused with those tiles (fp8-fused-tuned) and with the table it has now.
#       Thirty-seventh session, H100s: fp8 ran 0.84x / 0.91x fp16 at batch 2 / 4 on the
#       dynamic graph's batch-32 tiles, and a static
#       graph with the batch-1 tiles helped 2 and hurt 4 (h100-2026-12-06-f, call 10); the
#       model compiled for batch 2 with the batch-32 tiles ran 0.883x fp16 (call 12, whose
#       budget left the layers none); such tables and `static_batches` {"fp8": [1, 2, 4]}
#       are the next try
#   benchmarks/gpu_pending.sh r50-small OUT_DIR   # ~6 min: issue 18, timm_resnet50's fp16 and
#       fp8 bundles as the family has them (fp8: static graphs for batch 1, 2 and 4, each with
#       its measured tiles) and the fp8 form before (static batch 1 only, the family folder
#       copied with that one change), built at once; the new fp8 verified, the three timed
#       with the peer in one process at batches 1,2,4,8,16,32 (R50_BATCHES=)
#   benchmarks/gpu_pending.sh vit-gemm-b1 OUT_DIR   # ~2 min, no bundles: issue 18, ViT-B's
#       four Linear shapes at batch 1 and 2, fp16 cuBLAS against the family's FP8 GEMM and
#       the Triton kernel per tile set, 20 calls a graph (vit_gemm_small_probe.py): whether
#       any FP8 GEMM beats fp16's there before a batch-1 form is built on it
#   benchmarks/gpu_pending.sh vit-b1 OUT_DIR   # ~6 min: issue 18, timm_vit_base's fp16 and fp8
#       bundles as the family has them (fp8: graphs for batch 1 and 2 with the Linear layers
#       on the Triton kernel), fp8 without static graphs and fp8 with the batch-1 graph only,
#       the last two from copies of the family folder, built at once; the family's fp8
#       verified, the four timed with the peer at batches 1, 2 and 32 (VIT_BATCHES=) and
#       profiled by kernel at batch 1 (forty-third session, H200: 0.866x fp16 at batch 1 and
#       0.937x at batch 2, against 0.768x / 0.853x without static graphs, h200-2026-12-06-k)
#   benchmarks/gpu_pending.sh vit-split-k OUT_DIR   # ~4 min (fp16 and fp8 reused when
#       PENDING_DIR has them): issue 18, timm_vit_base fp8 with proj and fc2 split in two in
#       its batch-1 and batch-2 graphs (fp8_pointwise_small_batch triton-split-k, a copy of
#       the family folder) against the family's fp8 and fp16 and the peer at batches 1 and
#       2, with the replay timeline; the split bundle verified. VIT_SPLIT_BASE=fp16: fp16
#       and the split form only (~3 min). Forty-seventh session, H200 (h200-2026-12-07-a):
#       0.974x / 0.993x fp16 at batch 1 / 2 against the family's 0.878x / 0.943x; the family
#       has shipped the split form since, so both fp8 bundles are now the same form
#   benchmarks/gpu_pending.sh r50-module-b1 OUT_DIR   # ~4 min, no bundles: issue 18, why
#       timm_resnet50's fp8 batch-1 graph ran 0.371 ms as a package and 0.343 as a
#       torch.compile module (h100-2026-12-06-i): fp16 and fp8-fused compiled for batch 1
#       as the benchmark does and with a package's Inductor options (+pkg: no pointwise
#       autotuning), the fp8 two profiled by kernel
#   benchmarks/gpu_pending.sh tma3x3 OUT_DIR   # ~4 min, no bundles: issue 18, timm_resnet50's
#       3x3 FP8 layers and strided 1x1 downsamples at batch 32 on the box kernel (each window
#       tap one TMA box of a box of output pixels; stride 2 through the input's parity view;
#       fp8_tma3x3_probe.py) against the shipped kernel, best of its candidate boxes per
#       layer, each printed as its MEASURED_BOX_TILES entry, then a package on it
#       (AOTInductor, 4-D host descriptors). Stride 1 ran 1.20x on an H100
#       (h100-2026-12-07-a); the strided layers and the 56x56 layer's new 8-warp and
#       256-pixel candidates have not run
#   benchmarks/gpu_pending.sh r50-tma3x3 OUT_DIR   # ~5 min: issue 18, timm_resnet50's fp16
#       and fp8 as the family builds them (into /tmp/pending/r50-small) and an fp8 one with
#       fp8_conv triton-fused-tma-3x3 (its stride-1 3x3 layers on fp8_conv_box_tma outside
#       the small static graphs; into /tmp/pending/r50-tma3x3), built at once, the new one
#       verified, the three timed with the peer at batches 1, 3, 8 and 32 (R50_BATCHES=;
#       3: the dynamic graph's worst case for boxes of 8 images) with replay timelines.
#       Forty-sixth session, H100 (h100-2026-12-07-b): fp8/fp16 1.190x family, 1.185x 3x3
#       form at 32; 0.829x / 0.802x at 3; 0.952x / 0.931x at 8: busy time 1097.6 against
#       1094.9 us at 32, where the probe's per-layer times promised ~60 us less. The
#       timing now profiles each package by kernel at 32 too (--profile): where the box
#       kernels' time goes in the package, against the probe's
#   benchmarks/gpu_pending.sh r50-stem OUT_DIR   # ~6 min, no bundles: issue 18, the fused
#       stem of timm_resnet50 (rewrite_fused(fuse_stem=True), torch_aoti.fp8_fuse_stem): its GPU
#       test, stem_layout_probe.py (the stem alone as a package, plain and strict export: its
#       convolution's layout) and the whole module compiled with it and without. Forty-eighth
#       session, H100 (h100-2026-12-07-d): the module 1.066 against 1.128 ms at batch 32,
#       the stem alone as a package NHWC and 0.030 ms for the fused kernel against 0.067 for
#       Inductor's two; but the family's fp8 bundle built with it ran the stem's convolution
#       on NCHW data (cuDNN's conversions 0.118 ms and a copy 0.033), 1.182x fp16 at 32:
#       a stale fake-tensor cache entry, found in the forty-ninth session (r50-stem-bundles)
#   benchmarks/gpu_pending.sh first-conv OUT_DIR   # ~1-2 min, no bundles: issue 18, the first
#       convolution of timm_xception (FAMILY= another) in fp16 as the bundles run it, with its
#       3 input channels padded to 4 and 8, and NCHW (first_conv_probe.py): its stem ran
#       cuDNN's NCHW kernel after a conversion on the H200, 0.23 ms of ~4.1 at batch 32. Then
#       the same behind the bundles' uint8 pixel head with bias and ReLU (--pixels), and each
#       with the weight in OIHW memory (w-oihw): on the H100 the probe's plain form ran NHWC,
#       the fp16 bundle NCHW, the fp8 bundle (OIHW weight) NHWC (h100-2026-12-07-f)
#   benchmarks/gpu_pending.sh cudnn-bench OUT_DIR   # ~5 min: issue 18, timm_xception's (uint8)
#       and timm_resnet50's fp16 bundles as the families have them (reused on a warm
#       machine), each timed with the peer with cudnn.benchmark off and on (two processes,
#       aoti_static_vs_peer.py --cudnn-benchmark; the on run profiled at 32).
#       CUDNN_FAMILIES="xception" or "r50" for one. xception's fp16 bundle and the peer run
#       the 3-channel stem as cuDNN's NCHW sgemm after a conversion (0.25 ms at 32, H100),
#       the fp8 bundle an NHWC kernel (0.05 ms); the stem's weight in OIHW memory did not
#       change the pick and cost both families at batch 1 (fifty-first session,
#       h100-2026-12-07-g; the setting that did it is gone). Timed, cuDNN dropped the
#       conversion: xception's fp16 4-5% faster at batch 32, ResNet's 4% slower (same run)
#   benchmarks/gpu_pending.sh cudnn-family OUT_DIR   # ~8 min: issue 18, a family's uint8
#       fp16 and fp8 bundles from two family copies, torch_aoti.cudnn_benchmark false and
#       true (the runtime times cuDNN's algorithms in each graph's warm-up), four builds at
#       once; each pair timed with the peer in its own process (PyTorch caches one cuDNN
#       plan per convolution for the process, timed or not). CUDNN_FAMILY: the family
#       (timm_xception; it names the setting since h100-2026-12-07-h); CUDNN_PRECISIONS=fp16:
#       the fp16 pair alone (~5 min)
#   benchmarks/gpu_pending.sh r50-stem-bundles OUT_DIR   # ~7 min: issue 18, timm_resnet50's
#       fp16 and fp8 bundles as the family has them (family.json torch_aoti.fp8_fuse_stem) and
#       the fp8 one from a family copy with the stem unfused, built at once, the fused
#       one verified, the three timed with the peer at batch 1 and 32. Forty-ninth session:
#       the stem's convolution ran NCHW in the package because of a stale fake-tensor cache
#       entry (build.FAKE_TENSOR_CACHE, now off while a package is built)
#   benchmarks/gpu_pending.sh study OUT_DIR   # ~6-7 min for the builds (two calls: a second
#       on the same warm machine reuses them): issue 18's table on one card, every family's
#       fp16 and fp8 bundles as the families have them (timm_xception with uint8 input, into
#       PENDING_DIR as `build` does; timm_resnet50 into r50-stem/; timm_vit_base into vit/),
#       six builds at once, then each family's pair timed with the peer in a process of its
#       own (batches 1 and 32; ViT also 2). STUDY_FAMILIES="xception r50" narrows it
#   benchmarks/gpu_pending.sh prepare-cudnn OUT_DIR   # `build`, then the fp16 bundle
#       prepared for serving (prepare_bench.py, graph sizes 1,2,4,8,16,24,32, each replay
#       timed) with cuDNN's algorithms timed as the bundle records it (timm_xception: the
#       graph of 32 only), in no graph and in every graph, each in its own process (~2 min
#       after the build). Fifty-fourth session, H100 (h100-2026-12-07-i): timed in every
#       graph, the sizes below 32 ran 2-9% slower and the preparation took twice as long
#   benchmarks/gpu_pending.sh pdl OUT_DIR   # ~1 min, no bundles: issue 18, a chain of small
#       dependent Triton kernels in one CUDA graph with and without programmatic dependent
#       launch (pdl_probe.py): the gap per launch that the fp8 batch-1 graphs show
#   benchmarks/gpu_pending.sh next OUT_DIR   # after `families` on the same warm machine: on
#       an H200 `pair` (as `first`), on any other card `xception-time`
#
# Bundles: PENDING_DIR (/tmp/pending). Logs: OUT_DIR/<step>.log. Each step prints as it goes
# and has its own timeout. Exit 3: the packages the steps need are missing
# there (`preflight`, below; benchmarks/device_wheels.sh).
set -u
steps="study|prepare-cudnn|cudnn-family|cudnn-bench|first-conv|r50-stem-bundles|dw|dw-gather|skip|cudnn-fp8|fp16-peer|fastacc|vit-patch|vit-peer|build|prebuild|overhead|serve|stage|prepare|load|gputest|tma|tma-small|resnet-tma|pair|first|next|families|xception-time|r50-tiles-small|r50-tiles-b1|r50-tma-small|r50-small|vit-gemm-b1|vit-split-k|vit-b1|b1-next|r50-module-b1|pdl|gaps|tma3x3|r50-tma3x3|r50-stem"
usage="usage: $0 $steps OUT_DIR (--help: what each step does)"
case "${1:-}" in
    -h|--help)   # the comment block above, without its leading '# '
        sed -n '2,/^set -u$/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
        exit 0 ;;
esac
what=${1:?$usage}
out=${2:?$usage}
case "|$steps|" in
    *"|$what|"*) ;;
    *) echo "$usage" >&2; exit 2 ;;   # before anything is made
esac
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
export PYTHONPATH=${PYTHONPATH:-}:$PWD PYTHONUNBUFFERED=1
# Before any step (PREFLIGHT=0 skips it; a step that runs another passes it on as done): the
# packages the steps need there. The image lacks some and has onnxruntime 1.30, which
# `bundle make` refuses; the forty-sixth session's ViT builds failed on it minutes into a
# call. benchmarks/device_wheels.sh makes the wheel folder a call carries.
if [ "${PREFLIGHT:-1}" != 0 ]; then
  python3 -c '
import importlib, sys
missing = []
for name in ("zstandard", "jsonschema", "onnx_graphsurgeon", "onnxruntime", "msgpack",
             "safetensors"):
    try:
        importlib.import_module(name)
    except ImportError:
        missing.append(name)
if missing:
    sys.exit("missing " + ", ".join(missing))
from runtime_py.engines.onnxruntime import require_build_version
from runtime_py.errors import BundleError
try:
    require_build_version()
except BundleError as exc:
    sys.exit(str(exc))
' || { echo "preflight failed (above): carry the wheels of benchmarks/device_wheels.sh" \
              "(its header says how); PREFLIGHT=0 runs the step anyway" >&2; exit 3; }
  export PREFLIGHT=0
fi
bundles=${PENDING_DIR:-/tmp/pending}   # the bundles the steps build and reuse
mkdir -p "$bundles"
start=$(date +%s)
# A step's `timeout` runs its command in a process group of its own, which a signal to
# this script's group (an outer `timeout`, the device call's limit) does not reach: the step
# ran on into the next device call (twenty-first session). So the script waits on the step
# in the background, where a TERM or INT reaches the trap below at once, and passes it on.
step_pid=
trap '[ -n "$step_pid" ] && kill -TERM "$step_pid" 2>/dev/null; exit 143' TERM INT
step() {   # step NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2 rc
  shift 2
  echo "== $name (+$(( $(date +%s) - start )) s, at most $limit s): $*"
  timeout "$limit" "$@" > >(grep --line-buffered -v '^[EW][0-9]' | tee "$out/$name.log") 2>&1 &
  step_pid=$!
  wait "$step_pid"; rc=$?
  step_pid=
  sleep 0.2   # the log's last lines, through the filter
  echo "== $name: exit $rc"
}
# family_copy_make DIR FAMILY EDIT LOG [ITEM...]: the family's folder copied into
# DIR/families, the Python statement EDIT run on its family.json's torch_aoti section (`a`),
# and the copy's bundles (make_parallel's ITEMs; fp8 when none are given) built into DIR in
# the background (found first through TRT_BUNDLE_FAMILIES_PATH; `$!` is the build, its log
# LOG): a form that differs from the family's by one setting
family_copy_make() {
  local dir=$1 family=$2 edit=$3 log=$4
  shift 4
  local items=("$@")
  [ ${#items[@]} -gt 0 ] || items=("fp8:--precision fp8")
  mkdir -p "$dir/families"
  rm -rf "${dir:?}/families/$family"; cp -r "families/$family" "$dir/families/"
  python3 -c "import json, sys; p = sys.argv[1]; f = json.load(open(p)); a = f['torch_aoti']; \
$edit; json.dump(f, open(p, 'w'), indent=2)" "$dir/families/$family/family.json"
  FAMILY=$family TRT_BUNDLE_FAMILIES_PATH="$dir/families" bash -c '. benchmarks/gpu_common.sh; \
    make_parallel "$0" "$@"' "$dir" "${items[@]}" >"$log" 2>&1 &
}
build_pair() {   # build_pair TIMEOUT_S: the family's uint8 fp16 and fp8 bundles into $bundles
  step build "$1" env INPUTS=uint8 bash -c '. benchmarks/gpu_common.sh; make_parallel "$0" \
    "fp16-uint8:--precision fp16 --input uint8" "fp8-uint8:--precision fp8 --input uint8"' \
    "$bundles"
}
build_vit() {    # build_vit TIMEOUT_S: timm_vit_base's fp16 and fp8 bundles into $bundles/vit
  mkdir -p "$bundles/vit"
  step vit-build "$1" env FAMILY=timm_vit_base bash -c '. benchmarks/gpu_common.sh; \
    make_parallel "$0" "fp16:--precision fp16" "fp8:--precision fp8"' "$bundles/vit"
}
build_beside_tests() {   # build_beside_tests NAME LIMIT_S PYTEST_ARGS...: `build`, with
  # those GPU tests running beside it (their log OUT/NAME.log, its tail printed after)
  local name=$1 limit=$2 tests
  shift 2
  timeout "$limit" python3 -m pytest -q -p no:cacheprovider "$@" > "$out/$name.log" 2>&1 &
  tests=$!
  bash "$here/gpu_pending.sh" build "$out" || { kill "$tests" 2>/dev/null; return 1; }
  wait "$tests"; echo "== $name: exit $?"; tail -6 "$out/$name.log"
}
bundle_tests() {   # bundle_tests LIMIT_S: the two GPU tests that build whole bundles
  step gputest-bundles "$1" python3 -m pytest -q -p no:cacheprovider -rs -m gpu \
    tests/test_torch_aoti.py -k bundle_matches
}
pair_on_h200_else() {   # pair_on_h200_else STEP: on an H200 `pair` (issue 15's figure),
  # on any other card STEP
  local card
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  echo "== card: $card"
  case "$card" in
  *H200*)
    WORKERS=${WORKERS:-16} PROCS=${PROCS:-8} REPEATS=${REPEATS:-3} \
      bash "$here/gpu_pending.sh" pair "$out" || exit 1
    ;;
  *)
    bash "$here/gpu_pending.sh" "$1" "$out" || exit 1
    ;;
  esac
}
case "$what" in
dw)
  step dw-rows 200 python3 benchmarks/dw_conv_bench.py --tiles default,rows \
    --shapes 728x19x19 --budget-s 120 --iters 50
  ;;
dw-gather)   # the gather variants on the tiles ptxas shows without spills, next to the shipped one
  step dw-gather 240 python3 benchmarks/dw_kernel_variants.py --iters 50 \
    --variants shipped,gath1,gath2,gath4,sdot1,sdot2,sdot4,sdotL4,copy \
    --blocks 16x128x4,32x32x4,32x64x4
  ;;
skip)   # timm_xception's 1x1 FP8 layers: cuBLASLt or the Triton kernel per layer, then the model
  step pointwise-layers 240 python3 benchmarks/pointwise_kernel_bench.py --iters 100
  step skip-model 330 python3 benchmarks/inductor_fp8_bench.py --family timm_xception \
    --static --batch-sizes 32 --variants fp16,fp8,fp8-dwskip --iters 100 --budget-s 300
  ;;
cudnn-fp8)   # issue 18: cuDNN's own FP8 convolution (cuDNN frontend) on ResNet-50's layers
  step cudnn-probe 60 python3 -c "import torch, cudnn; print('cuDNN frontend', cudnn.__version__, 'backend', cudnn.backend_version())"
  step cudnn-fp8 260 python3 benchmarks/fp8_conv_bench.py --configs default --compile-kinds '' \
    --budget-s 230 --iters 50
  ;;
fp16-peer)   # issue 18: timm_xception's fp16 bundle against the peer at batch 32, by kernel
  step fp16-build 300 env FAMILY=timm_xception bash -c '. benchmarks/gpu_common.sh; \
    make_parallel "$0" "fp16:--precision fp16"' "$bundles"
  step fp16-peer 240 python3 benchmarks/aoti_static_vs_peer.py \
    "$bundles"/timm_xception-fp16-1.0.0-torch-aoti.bundle --batch-sizes 32 --profile
  ;;
fastacc)   # issue 18: timm_xception fp8 with fast FP8 accumulation, as a bundle, next to the family's
  mkdir -p "$bundles/fastacc"
  python3 -c "
from pathlib import Path
from bundler.make import MakeRequest, make_bundle
make_bundle(MakeRequest(family='timm_xception', precision='fp8', backend='torch-aoti',
    random_weights=True, out_dir=Path('$bundles/fastacc'), calib_count=16, reference_count=4,
    input_dtype='uint8', target_options={'fp8_fast_accum': True}))" \
    >"$out/fastacc-make.log" 2>&1 &
  made=$!
  build_pair 400
  wait "$made"; echo "== fastacc-make: exit $?"; grep -v '^[EW][0-9]' "$out/fastacc-make.log" | tail -3
  fast=$bundles/fastacc/timm_xception-fp8-uint8-1.0.0-torch-aoti.bundle
  step fastacc-verify 90 python3 -m bundler.cli verify --numerics "$fast"
  step fastacc-time 240 python3 benchmarks/aoti_static_vs_peer.py \
    "$bundles"/timm_xception-fp16-uint8-1.0.0-torch-aoti.bundle \
    "$bundles"/timm_xception-fp8-uint8-1.0.0-torch-aoti.bundle "$fast" --batch-sizes 1,32
  ;;
vit-patch)   # issue 18: ViT's patch embedding, one GEMM (PatchGemm) against the convolution
  step vit-patch 330 python3 benchmarks/inductor_fp8_bench.py --family timm_vit_base --static \
    --batch-sizes 1,32 --variants fp16,fp16-patchconv,fp8,fp8-patchconv --iters 200 \
    --profile fp16,fp16-patchconv --rows 8 --budget-s 300
  ;;
vit-peer)   # issue 18: timm_vit_base's bundles with PatchGemm against the peer
  build_vit 330
  step vit-verify 90 python3 -m bundler.cli verify --numerics \
    "$bundles"/vit/timm_vit_base-fp8-1.0.0-torch-aoti.bundle
  step vit-time 200 python3 benchmarks/aoti_static_vs_peer.py \
    "$bundles"/vit/timm_vit_base-fp16-1.0.0-torch-aoti.bundle \
    "$bundles"/vit/timm_vit_base-fp8-1.0.0-torch-aoti.bundle --batch-sizes 1,32
  ;;
build)   # the uint8 pair alone (serve and overhead reuse it while the machine is warm)
  build_pair 330
  ;;
prebuild)   # `build` and vit-peer's two bundles, four builds at once (pair and vit-peer reuse them)
  # each build under its step's timeout; the ViT one in a subshell (its lines interleave)
  ( build_vit "${BUILD_LIMIT:-540}" ) &
  vit=$!
  build_pair "${BUILD_LIMIT:-540}"
  wait "$vit"
  ;;
overhead)   # issue 14's Model.infer / with_copies at batch 1 and 32 (needs `build`)
  for p in fp8 fp16; do
    step "overhead-$p" 120 python3 benchmarks/infer_overhead.py --batch 1,32 \
      --bundle "$bundles/timm_xception-$p-uint8-1.0.0-torch-aoti.bundle" \
      --iterations 1500 --rows 12
  done
  ;;
serve)
  bash "$here/gpu_pending.sh" build "$out" || exit 1
  for pw in ${SERVE:-fp8:8 fp16:8}; do     # SERVE="fp8:8": one bundle, 8 workers
    p=${pw%%:*} w=${pw#*:}
    step "serve-$p" 280 python3 benchmarks/serve_bench.py \
      --bundle "$bundles/timm_xception-$p-uint8-1.0.0-torch-aoti.bundle" --batch 32 \
      --clients 64 --http-clients 64 --http-procs "${PROCS:-8,32}" --workers-list "$w" \
      --paths "${PATHS:-http,grpc,grpc_stream,http_shm}" --grpc-server "${GRPC:-builtin}" \
      --grpc-client "${GRPC_CLIENT:-raw}" --repeats "${REPEATS:-1}" \
      --seconds 3 --warmup 1
  done
  ;;
stage)   # issue 15: rows staged ahead of their dispatch (Batcher stage_ahead), off and on
  # the GPU tests of stage_rows (a tiny package, compiled while the bundles build)
  build_beside_tests stage-gputest 300 -m gpu tests/test_torch_aoti.py \
    -k 'staged or stages or rows_are_copied or held' || exit 1
  for p in ${STAGE_BUNDLES:-fp8}; do
    step "stage-$p" "${STAGE_LIMIT:-200}" python3 benchmarks/serve_bench.py \
      --bundle "$bundles/timm_xception-$p-uint8-1.0.0-torch-aoti.bundle" --batch 32 \
      --clients 64 --http-clients 64 --http-procs "${PROCS:-8}" --workers-list "${WORKERS:-16}" \
      --paths "${PATHS:-grpc,http}" --stage-ahead off,on --repeats "${REPEATS:-1}" \
      --seconds 3 --warmup 1
  done
  ;;
prepare)   # where the fp16 bundle's 73 s of preparation goes, under cuDNN settings
  # the GPU tests of prepare's progress and of the staged rows, beside the build
  build_beside_tests prepare-gputest 300 -m gpu tests/test_torch_aoti.py \
    -k 'prepare or staged or stages or held or graph_sizes' || exit 1
  step prepare "${PREPARE_LIMIT:-420}" python3 benchmarks/prepare_bench.py \
    --bundle "$bundles/timm_xception-fp16-uint8-1.0.0-torch-aoti.bundle" --timeout 200 \
    --replay-batches 1,12,17,32 --variant default --variant v7:TORCH_CUDNN_V8_API_DISABLED=1 \
    --variant heuristicB:TORCH_CUDNN_USE_HEURISTIC_MODE_B=1 \
    --variant buckets:graph_sizes=1+2+4+8+16+24
  ;;
gputest)   # every GPU test; the two that build whole bundles after the rest (GPUTEST_BUNDLES=0: not)
  step gputest "${GPUTEST_LIMIT:-450}" python3 -m pytest -q -p no:cacheprovider -rs -m gpu \
    tests -k 'not bundle_matches'
  [ "${GPUTEST_BUNDLES:-1}" = 0 ] || bundle_tests "${GPUTEST_BUNDLES_LIMIT:-280}"
  ;;
load)   # `build`, then the fp16 bundle's activation by phase, the load check on, off, on
  bash "$here/gpu_pending.sh" build "$out" || exit 1
  sizes=graph_sizes=1+2+4+8+16+24
  step load "${LOAD_LIMIT:-300}" python3 benchmarks/prepare_bench.py \
    --bundle "$bundles/timm_xception-fp16-uint8-1.0.0-torch-aoti.bundle" --timeout 95 \
    --replay-batches 1,32 --variant "check-on:TRT_BUNDLE_AOTI_LOAD_CHECK=1,$sizes" \
    --variant "check-off:TRT_BUNDLE_AOTI_LOAD_CHECK=0,$sizes" \
    --variant "check-on-again:TRT_BUNDLE_AOTI_LOAD_CHECK=1,$sizes"
  ;;
first)   # on any card: the GPU tests but the two whole-bundle ones (the kernels' launches)
  GPUTEST_BUNDLES=0 bash "$here/gpu_pending.sh" gputest "$out" || exit 1
  ;;
gaps)   # issue 18: ViT's and ResNet's fp16 and fp8 bundles as the families have them, built
  # at once; ViT's fp8 verified; each family's two with the peer, timed, and the device
  # timeline of every graph replay (idle time between kernels, by transition).
  # GAPS_FAMILIES="r50" or "vit" for one family (less device time)
  families=" ${GAPS_FAMILIES:-vit r50} "
  made=
  if [[ $families == *" r50 "* ]]; then
    mkdir -p "$bundles/r50-small"
    FAMILY=timm_resnet50 bash -c '. benchmarks/gpu_common.sh; \
      make_parallel "$0" "fp16:--precision fp16" "fp8:--precision fp8"' "$bundles/r50-small" \
      >"$out/gaps-r50-make.log" 2>&1 &
    made=$!
  fi
  if [[ $families == *" vit "* ]]; then
    build_vit "${BUILD_LIMIT:-400}"
  fi
  if [ -n "$made" ]; then
    wait "$made"; echo "== r50 make: exit $?"; tail -6 "$out/gaps-r50-make.log"
  fi
  if [[ $families == *" vit "* ]]; then
    step gaps-vit-verify 90 python3 -m bundler.cli verify --numerics \
      "$bundles"/vit/timm_vit_base-fp8-*-torch-aoti.bundle
    step gaps-vit "${TIME_LIMIT:-200}" python3 benchmarks/aoti_static_vs_peer.py \
      "$bundles"/vit/timm_vit_base-fp16-*-torch-aoti.bundle \
      "$bundles"/vit/timm_vit_base-fp8-*-torch-aoti.bundle \
      --batch-sizes 1,2,32 --timeline --profile-sizes 1,2 --rows 12
  fi
  if [[ $families == *" r50 "* ]]; then
    step gaps-r50 "${TIME_LIMIT:-200}" python3 benchmarks/aoti_static_vs_peer.py \
      "$bundles"/r50-small/timm_resnet50-fp16-*-torch-aoti.bundle \
      "$bundles"/r50-small/timm_resnet50-fp8-*-torch-aoti.bundle \
      --batch-sizes 1,32 --timeline --profile-sizes 1,32 --rows 12
  fi
  ;;
r50-tma-small)   # issue 18: timm_resnet50 fp8 with TMA in its small static graphs too
  mkdir -p "$bundles/r50-tma-small" "$bundles/r50-small"
  FAMILY=timm_resnet50 TRT_BUNDLE_FP8_CONV=triton-fused-tma-small bash -c '. benchmarks/gpu_common.sh; \
    make_parallel "$0" "fp8:--precision fp8"' "$bundles/r50-tma-small" >"$out/r50-tma-small-make.log" 2>&1 &
  made=$!
  step r50-small-build "${BUILD_LIMIT:-330}" env FAMILY=timm_resnet50 bash -c '. benchmarks/gpu_common.sh; \
    make_parallel "$0" "fp16:--precision fp16" "fp8:--precision fp8"' "$bundles/r50-small"
  wait "$made"; echo "== r50-tma-small-make: exit $?"; tail -4 "$out/r50-tma-small-make.log"
  cp "$bundles"/r50-tma-small/make-*.log "$out/" 2>/dev/null
  tma_small=$(ls "$bundles"/r50-tma-small/timm_resnet50-fp8-*-torch-aoti.bundle)
  step r50-tma-small-verify 60 python3 -m bundler.cli verify --numerics "$tma_small"
  step r50-tma-small-time "${TIME_LIMIT:-240}" python3 benchmarks/aoti_static_vs_peer.py \
    "$bundles"/r50-small/timm_resnet50-fp16-*-torch-aoti.bundle \
    "$bundles"/r50-small/timm_resnet50-fp8-*-torch-aoti.bundle "$tma_small" \
    --batch-sizes "${R50_BATCHES:-1,2,4,8,32}" --profile --profile-sizes 1 --rows 25
  ;;
r50-tma3x3)   # issue 18: timm_resnet50 fp8 with its stride-1 3x3 layers on 4-D TMA boxes
  mkdir -p "$bundles/r50-tma3x3" "$bundles/r50-small"
  FAMILY=timm_resnet50 TRT_BUNDLE_FP8_CONV=triton-fused-tma-3x3 bash -c '. benchmarks/gpu_common.sh; \
    make_parallel "$0" "fp8:--precision fp8"' "$bundles/r50-tma3x3" >"$out/r50-tma3x3-make.log" 2>&1 &
  made=$!
  step r50-small-build "${BUILD_LIMIT:-330}" env FAMILY=timm_resnet50 bash -c '. benchmarks/gpu_common.sh; \
    make_parallel "$0" "fp16:--precision fp16" "fp8:--precision fp8"' "$bundles/r50-small"
  wait "$made"; echo "== r50-tma3x3-make: exit $?"; tail -4 "$out/r50-tma3x3-make.log"
  for dir in r50-small r50-tma3x3; do    # whole logs, each under its own name
    for log in "$bundles/$dir"/make-*.log; do
      [ -e "$log" ] && cp "$log" "$out/$dir-$(basename "$log")"
    done
  done
  boxed=("$bundles"/r50-tma3x3/timm_resnet50-fp8-*-torch-aoti.bundle)
  step r50-tma3x3-verify 60 python3 -m bundler.cli verify --numerics "${boxed[@]}"
  step r50-tma3x3-time "${TIME_LIMIT:-200}" python3 benchmarks/aoti_static_vs_peer.py \
    "$bundles"/r50-small/timm_resnet50-fp16-*-torch-aoti.bundle \
    "$bundles"/r50-small/timm_resnet50-fp8-*-torch-aoti.bundle "${boxed[@]}" \
    --batch-sizes "${R50_BATCHES:-1,3,8,32}" --timeline --profile --profile-sizes 32 --rows 16
  ;;
first-conv)   # issue 18: a family's first convolution, as is and padded (first_conv_probe.py)
  step first-conv "${PROBE_LIMIT:-150}" python3 benchmarks/first_conv_probe.py \
    --family "${FAMILY:-timm_xception}"
  step first-conv-pixels "${PROBE_LIMIT:-150}" python3 benchmarks/first_conv_probe.py \
    --family "${FAMILY:-timm_xception}" --pixels
  ;;
r50-stem-bundles)   # issue 18: the fused stem in the family's bundles, against the unfused one
  # (fp8_fuse_stem false in a family copy, as vit-split-k edits its own)
  mkdir -p "$bundles/r50-stem"
  family_copy_make "$bundles/r50-nostem" timm_resnet50 "a['fp8_fuse_stem'] = False" \
    "$out/r50-nostem-make.log"
  made=$!
  step r50-stem-build "${BUILD_LIMIT:-330}" env FAMILY=timm_resnet50 bash -c '. benchmarks/gpu_common.sh; \
    make_parallel "$0" "fp16:--precision fp16" "fp8:--precision fp8"' "$bundles/r50-stem"
  wait "$made"; echo "== r50-nostem-make: exit $?"; tail -4 "$out/r50-nostem-make.log"
  step r50-stem-verify 60 python3 -m bundler.cli verify --numerics \
    "$bundles"/r50-stem/timm_resnet50-fp8-*-torch-aoti.bundle
  step r50-stem-time "${TIME_LIMIT:-200}" python3 benchmarks/aoti_static_vs_peer.py \
    "$bundles"/r50-stem/timm_resnet50-fp16-*-torch-aoti.bundle \
    "$bundles"/r50-nostem/timm_resnet50-fp8-*-torch-aoti.bundle \
    "$bundles"/r50-stem/timm_resnet50-fp8-*-torch-aoti.bundle \
    --batch-sizes "${R50_BATCHES:-1,32}" --profile --profile-sizes 32 --rows 12
  ;;
study)   # issue 18's table: every family's fp16 and fp8 as the families have them, then each
  # pair with the peer (STUDY_FAMILIES narrows it; a second call reuses the builds)
  families=" ${STUDY_FAMILIES:-xception r50 vit} "
  mkdir -p "$bundles/r50-stem" "$bundles/vit"
  # (one step, so that its limit ends all six builds: make_parallel per family, at once)
  step study-build "${BUILD_LIMIT:-540}" bash -c '. benchmarks/gpu_common.sh
    families=$1 bundles=$2 pids=()
    if [[ $families == *" xception "* ]]; then
      FAMILY=timm_xception make_parallel "$bundles" \
        "fp16-uint8:--precision fp16 --input uint8" "fp8-uint8:--precision fp8 --input uint8" &
      pids+=("$!")
    fi
    for fam in r50:timm_resnet50:r50-stem vit:timm_vit_base:vit; do
      IFS=: read -r short name dir <<< "$fam"
      [[ $families == *" $short "* ]] || continue
      FAMILY=$name make_parallel "$bundles/$dir" "fp16:--precision fp16" "fp8:--precision fp8" &
      pids+=("$!")
    done
    failed=0
    for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
    exit "$failed"' study "$families" "$bundles"
  if [[ $families == *" xception "* ]]; then
    step study-xception "${TIME_LIMIT:-150}" python3 benchmarks/aoti_static_vs_peer.py \
      "$bundles"/timm_xception-fp16-uint8-1.0.0-torch-aoti.bundle \
      "$bundles"/timm_xception-fp8-uint8-1.0.0-torch-aoti.bundle --batch-sizes 1,32
  fi
  if [[ $families == *" r50 "* ]]; then
    step study-r50 "${TIME_LIMIT:-150}" python3 benchmarks/aoti_static_vs_peer.py \
      "$bundles"/r50-stem/timm_resnet50-fp16-*-torch-aoti.bundle \
      "$bundles"/r50-stem/timm_resnet50-fp8-*-torch-aoti.bundle --batch-sizes 1,32
  fi
  if [[ $families == *" vit "* ]]; then
    step study-vit "${TIME_LIMIT:-150}" python3 benchmarks/aoti_static_vs_peer.py \
      "$bundles"/vit/timm_vit_base-fp16-*-torch-aoti.bundle \
      "$bundles"/vit/timm_vit_base-fp8-*-torch-aoti.bundle --batch-sizes 1,2,32
  fi
  ;;
prepare-cudnn)   # `build`, then the fp16 bundle prepared with cuDNN timed as it records, none, every size
  bash "$here/gpu_pending.sh" build "$out" || exit 1
  sizes=graph_sizes=1+2+4+8+16+24+32
  step prepare-cudnn "${PREPARE_LIMIT:-300}" python3 benchmarks/prepare_bench.py \
    --bundle "$bundles/timm_xception-fp16-uint8-1.0.0-torch-aoti.bundle" --timeout 90 \
    --replay-batches 1,2,4,8,16,24,32 --variant "bundle:$sizes" \
    --variant "untimed:cudnn_benchmark=off,$sizes" --variant "every-size:cudnn_benchmark=on,$sizes"
  ;;
cudnn-family)   # issue 18: a family's pair with and without cuDNN's algorithms timed by the runtime
  # CUDNN_FAMILY (default timm_xception, which names the setting since the fifty-third
  # session); CUDNN_PRECISIONS (default "fp16 fp8"): "fp16" alone fits a call with less
  # device time left
  family=${CUDNN_FAMILY:-timm_xception} precisions=${CUDNN_PRECISIONS:-fp16 fp8}
  items=()
  for p in $precisions; do items+=("$p-uint8:--precision $p --input uint8"); done
  made=()
  for form in plain timed; do   # two copies that differ in torch_aoti.cudnn_benchmark alone
    value=False; [ "$form" = timed ] && value=True
    family_copy_make "$bundles/$family-$form" "$family" "a['cudnn_benchmark'] = $value" \
      "$out/$form-make.log" "${items[@]}"
    made+=("$!")
  done
  for pid in "${made[@]}"; do wait "$pid"; echo "== a build: exit $?"; done
  tail -n 3 "$out"/plain-make.log "$out"/timed-make.log
  for form in plain timed; do
    files=()   # this form's bundles, in CUDNN_PRECISIONS' order
    for p in $precisions; do
      files+=("$bundles/$family-$form/$family-$p-uint8-"*torch-aoti.bundle)
    done
    step "cudnn-$form" "${TIME_LIMIT:-150}" python3 benchmarks/aoti_static_vs_peer.py \
      "${files[@]}" --batch-sizes 1,32
  done
  ;;
cudnn-bench)   # issue 18: cudnn.benchmark off and on, the fp16 bundles against the peer
  families=" ${CUDNN_FAMILIES:-xception r50} "
  made=()
  for fam in xception r50; do
    [[ $families == *" $fam "* ]] || continue
    case $fam in
      xception) name=timm_xception; item="fp16-uint8:--precision fp16 --input uint8" ;;
      r50) name=timm_resnet50; item="fp16:--precision fp16" ;;
    esac
    mkdir -p "$bundles/fp16-$fam"
    FAMILY=$name bash -c '. benchmarks/gpu_common.sh; make_parallel "$0" "$1"' \
      "$bundles/fp16-$fam" "$item" >"$out/cudnn-$fam-make.log" 2>&1 &
    made+=("$!")
  done
  for pid in "${made[@]}"; do wait "$pid"; echo "== a build: exit $?"; done
  tail -n 3 "$out"/cudnn-*-make.log
  for fam in xception r50; do
    [[ $families == *" $fam "* ]] || continue
    step "cudnn-off-$fam" "${TIME_LIMIT:-120}" python3 benchmarks/aoti_static_vs_peer.py \
      "$bundles"/fp16-$fam/timm_*-fp16-*torch-aoti.bundle --batch-sizes 1,32
    step "cudnn-on-$fam" "${TIME_LIMIT:-120}" python3 benchmarks/aoti_static_vs_peer.py \
      "$bundles"/fp16-$fam/timm_*-fp16-*torch-aoti.bundle --batch-sizes 1,32 \
      --cudnn-benchmark --profile --profile-sizes 32 --rows 8
  done
  ;;
r50-stem)   # issue 18: timm_resnet50's fused stem (bias, ReLU, max pool, e4m3: one kernel), no bundles
  step stem-gputest "${TEST_LIMIT:-200}" python3 -m pytest -q -p no:cacheprovider -rs -m gpu \
    tests/test_fp8_conv_fused.py -k stem
  step stem-layout "${LAYOUT_LIMIT:-200}" python3 benchmarks/stem_layout_probe.py
  step stem-layout-strict "${LAYOUT_LIMIT:-200}" python3 benchmarks/stem_layout_probe.py --strict
  # the module with the stem fused and unfused, compiled side by side (torch.compile)
  step r50-stem-model "${MODEL_LIMIT:-150}" python3 benchmarks/fp8_conv_bench.py --model-only \
    --model-variants fp16,fp8-fused-tma,fp8-fused-tma-stem --batch 32 --budget-s 140 \
    --model-reserve-s 20
  ;;
r50-tiles-b1)   # `r50-tiles-small` at batch 1 (the batch-1 table was picked one call a replay)
  SMALL_BATCHES=1 TILES_LIMIT=${TILES_LIMIT:-300} TILES_BUDGET=${TILES_BUDGET:-260} \
    bash "$here/gpu_pending.sh" r50-tiles-small "$out" || exit 1
  ;;
next)   # by the card: H200 -> `pair` (issue 15); else `xception-time`
  pair_on_h200_else xception-time
  ;;
families)   # issue 18 on whatever card comes: `prebuild` (four builds at once), then `vit-peer`
  BUILD_LIMIT=${BUILD_LIMIT:-330} bash "$here/gpu_pending.sh" prebuild "$out" || exit 1
  bash "$here/gpu_pending.sh" vit-peer "$out" || exit 1
  ;;
xception-time)   # `build`, then timm_xception's uint8 fp16 and fp8 bundles with the peer
  build_pair 400
  step xception-time 240 python3 benchmarks/aoti_static_vs_peer.py \
    "$bundles"/timm_xception-fp16-uint8-1.0.0-torch-aoti.bundle \
    "$bundles"/timm_xception-fp8-uint8-1.0.0-torch-aoti.bundle --batch-sizes 1,32
  ;;
resnet-tma)   # issue 18: timm_resnet50 fp8 with the TMA 1x1 layers, as bundles, against fp8 and fp16
  mkdir -p "$bundles/r50" "$bundles/r50-tma"
  # the family's form (triton-fused-tma since the thirty-seventh session), no override
  FAMILY=timm_resnet50 TRT_BUNDLE_FP8_CONV= bash -c '. benchmarks/gpu_common.sh; \
    make_parallel "$0" "fp8:--precision fp8"' "$bundles/r50-tma" >"$out/r50-tma-make.log" 2>&1 &
  made=$!
  step r50-build "${BUILD_LIMIT:-330}" env FAMILY=timm_resnet50 TRT_BUNDLE_FP8_CONV=triton-fused bash -c '. benchmarks/gpu_common.sh; \
    make_parallel "$0" "fp16:--precision fp16" "fp8:--precision fp8"' "$bundles/r50"
  wait "$made"; echo "== r50-tma-make: exit $?"; tail -5 "$out/r50-tma-make.log"
  cp "$bundles"/r50-tma/make-*.log "$out/" 2>/dev/null   # the whole log, for a failure
  tma_bundle=$(ls "$bundles"/r50-tma/timm_resnet50-fp8-*-torch-aoti.bundle)
  step r50-tma-verify 60 python3 -m bundler.cli verify --numerics "$tma_bundle"
  python3 -m bundler.cli inspect --json "$tma_bundle" 2>/dev/null | python3 -c \
    "import json,sys; m=json.load(sys.stdin); d=m.get('manifest', m)['engine']['details']; \
print('== r50-tma form:', d['compile_options'].get('fp8_conv'), '| GPU', d['compute_capability'])"
  step r50-time "${TIME_LIMIT:-200}" python3 benchmarks/aoti_static_vs_peer.py \
    "$bundles"/r50/timm_resnet50-fp16-*-torch-aoti.bundle \
    "$bundles"/r50/timm_resnet50-fp8-*-torch-aoti.bundle "$tma_bundle" --batch-sizes "${R50_BATCHES:-1,32}"
  ;;
r50-tiles-small)   # timm_resnet50's fused FP8 layers: the best tiles at batch 2 and at 4
  for n in ${SMALL_BATCHES:-2 4}; do
    # (the layers get the budget less twice the model reserve: 420 - 2 x 45 s)
    step "r50-tiles-b$n" "${TILES_LIMIT:-480}" python3 benchmarks/fp8_conv_bench.py \
      --fused-layers --batch "$n" --model-only --model-variants fp16,fp8-fused-tuned,fp8-fused \
      --budget-s "${TILES_BUDGET:-420}" --model-reserve-s 45 --quiet \
      --json "$out/r50-tiles-b$n.json"
  done
  ;;
r50-small)   # issue 18: timm_resnet50 fp8 with graphs for static batch 2 and 4 (their own tiles)
  # against the form before (static batch 1 only: the family folder copied with that one
  # setting changed, found first through TRT_BUNDLE_FAMILIES_PATH) and fp16, one process
  before=$bundles/r50-before
  mkdir -p "$bundles/r50-small"
  family_copy_make "$before" timm_resnet50 "a['static_batches'] = [1]" \
    "$out/r50-before-make.log"
  made=$!
  step r50-small-build "${BUILD_LIMIT:-330}" env FAMILY=timm_resnet50 bash -c '. benchmarks/gpu_common.sh; \
    make_parallel "$0" "fp16:--precision fp16" "fp8:--precision fp8"' "$bundles/r50-small"
  wait "$made"; echo "== r50-before-make: exit $?"; tail -4 "$out/r50-before-make.log"
  cp "$bundles"/r50-small/make-*.log "$out/" 2>/dev/null
  small=$(ls "$bundles"/r50-small/timm_resnet50-fp8-*-torch-aoti.bundle)
  step r50-small-verify 60 python3 -m bundler.cli verify --numerics "$small"
  for b in "$bundles"/r50-small/timm_resnet50-*-torch-aoti.bundle "$before"/timm_resnet50-fp8-*-torch-aoti.bundle; do
    python3 -m bundler.cli inspect --json "$b" 2>/dev/null | python3 -c "import json, sys; \
m = json.load(sys.stdin); e = [x for x in m['members'] if x['name'] == m['engine']['member']][0]; \
print('== size', sys.argv[1].rsplit('/', 1)[-1], 'engine raw', e['raw_size'], 'stored', e['stored_size'])" "$b"
  done
  step r50-small-time "${TIME_LIMIT:-240}" python3 benchmarks/aoti_static_vs_peer.py \
    "$bundles"/r50-small/timm_resnet50-fp16-*-torch-aoti.bundle \
    "$before"/timm_resnet50-fp8-*-torch-aoti.bundle "$small" --batch-sizes "${R50_BATCHES:-1,2,4,8,16,32}"
  ;;
vit-gemm-b1)   # issue 18: ViT-B's Linear shapes at batch 1 and 2, fp16 against FP8 GEMMs
  step vit-gemm-b1 "${VIT_GEMM_LIMIT:-200}" python3 benchmarks/vit_gemm_small_probe.py \
    --budget-s "${VIT_GEMM_BUDGET:-150}" --json "$out/vit-gemm-b1.json"
  ;;
vit-split-k)   # issue 18: timm_vit_base fp8 with proj and fc2 split in two in its batch-1
  # and batch-2 graphs (fp8_pointwise_small_batch triton-split-k, a family copy) against
  # the family's fp8 and fp16, timed with the peer and the replay timeline at 1 and 2
  mkdir -p "$bundles/vit"
  family_copy_make "$bundles/vit-split" timm_vit_base \
    "a['fp8_pointwise_small_batch'] = 'triton-split-k'" "$out/vit-split-make.log"
  made=$!
  base=("$bundles"/vit/timm_vit_base-fp16-*-torch-aoti.bundle
        "$bundles"/vit/timm_vit_base-fp8-*-torch-aoti.bundle)
  if [ "${VIT_SPLIT_BASE:-}" = fp16 ]; then   # less device time: fp16 only, no family fp8
    base=("$bundles"/vit/timm_vit_base-fp16-*-torch-aoti.bundle)
    mkdir -p "$bundles/vit"
    ls "${base[0]}" >/dev/null 2>&1 || step vit-build "${BUILD_LIMIT:-400}" env \
      FAMILY=timm_vit_base bash -c '. benchmarks/gpu_common.sh; \
      make_parallel "$0" "fp16:--precision fp16"' "$bundles/vit"
    base=("$bundles"/vit/timm_vit_base-fp16-*-torch-aoti.bundle)
  elif ls "$bundles"/vit/timm_vit_base-fp8-*-torch-aoti.bundle >/dev/null 2>&1; then
    echo "== vit: fp16 and fp8 already built"
  else
    build_vit "${BUILD_LIMIT:-400}"
    base=("$bundles"/vit/timm_vit_base-fp16-*-torch-aoti.bundle
          "$bundles"/vit/timm_vit_base-fp8-*-torch-aoti.bundle)
  fi
  wait "$made"; echo "== vit-split make: exit $?"; tail -4 "$out/vit-split-make.log"
  step vit-split-verify 90 python3 -m bundler.cli verify --numerics \
    "$bundles"/vit-split/timm_vit_base-fp8-*-torch-aoti.bundle
  step vit-split-time "${TIME_LIMIT:-200}" python3 benchmarks/aoti_static_vs_peer.py "${base[@]}" \
    "$bundles"/vit-split/timm_vit_base-fp8-*-torch-aoti.bundle \
    --batch-sizes 1,2 --timeline --profile-sizes 1 --rows 12
  ;;
vit-b1)   # issue 18: timm_vit_base fp8 as the family has it (Triton graphs for batch 1 and 2),
  # without static graphs, with the batch-1 graph only, and fp16 (the family folder copied
  # with the setting changed, found first through TRT_BUNDLE_FAMILIES_PATH)
  mkdir -p "$bundles/vit"
  made=()
  family_copy_make "$bundles/vit-before" timm_vit_base \
    "[a.pop(k, None) for k in ('static_batches', 'fp8_pointwise_small_batch')]" \
    "$out/vit-before-make.log"
  made+=("$!")
  family_copy_make "$bundles/vit-b1" timm_vit_base "a.update(static_batches={'fp8': [1]})" \
    "$out/vit-b1-make.log"
  made+=("$!")
  build_vit "${BUILD_LIMIT:-400}"
  for pid in "${made[@]}"; do wait "$pid"; echo "== vit make: exit $?"; done
  tail -3 "$out"/vit-before-make.log "$out"/vit-b1-make.log
  cp "$bundles"/vit/make-*.log "$out/" 2>/dev/null
  step vit-b1-verify 90 python3 -m bundler.cli verify --numerics \
    "$bundles"/vit/timm_vit_base-fp8-*-torch-aoti.bundle
  step vit-b1-time "${TIME_LIMIT:-240}" python3 benchmarks/aoti_static_vs_peer.py \
    "$bundles"/vit/timm_vit_base-fp16-*-torch-aoti.bundle \
    "$bundles"/vit-before/timm_vit_base-fp8-*-torch-aoti.bundle \
    "$bundles"/vit-b1/timm_vit_base-fp8-*-torch-aoti.bundle \
    "$bundles"/vit/timm_vit_base-fp8-*-torch-aoti.bundle \
    --batch-sizes "${VIT_BATCHES:-1,2,32}" --profile --profile-sizes 1 --rows 25
  ;;
b1-next)   # issue 18: the PDL probe, then ViT's batch 1 with its kernel profile
  bash "$here/gpu_pending.sh" pdl "$out" || exit 1
  bash "$here/gpu_pending.sh" vit-b1 "$out" || exit 1
  ;;
r50-module-b1)   # issue 18: the fp8 batch-1 module with and without a package's options
  step r50-module-b1 "${MODULE_LIMIT:-300}" python3 benchmarks/fp8_conv_bench.py --model-only \
    --batch 1 --model-variants fp16,fp16+pkg,fp8-fused,fp8-fused+pkg \
    --profile fp8-fused,fp8-fused+pkg --rows 20 --budget-s 280 --model-reserve-s 40 \
    --json "$out/r50-module-b1.json"
  ;;
pdl)   # issue 18: Triton launches in a CUDA graph with and without PDL
  step pdl "${PDL_LIMIT:-120}" python3 benchmarks/pdl_probe.py
  ;;
tma3x3)   # issue 18: timm_resnet50's stride-1 3x3 FP8 convolutions with 4-D TMA boxes
  step tma3x3 "${TMA3X3_LIMIT:-360}" python3 benchmarks/fp8_tma3x3_probe.py --aoti
  ;;
tma)   # issue 18: timm_resnet50's dense 1x1 FP8 convolutions with TMA against the shipped kernel
  step tma "${TMA_LIMIT:-420}" python3 benchmarks/fp8_tma_probe.py --aoti
  ;;
tma-small)   # issue 18: the same at the small static batches, host descriptors, tiles that fit
  for n in ${TMA_BATCHES:-1 4 2}; do
    step "tma-b$n" "${TMA_LIMIT:-200}" python3 benchmarks/fp8_tma_probe.py --batch "$n" --fit \
      --descriptors host --iters 50
  done
  ;;
pair)   # `build`, then fp8 against fp16 at the client, both served in one run
  bash "$here/gpu_pending.sh" build "$out" || exit 1
  graph_sizes=${GRAPH_SIZES-1,2,4,8,16,24}    # set and empty: every size
  sized=(); [ -n "$graph_sizes" ] && sized=(--cuda-graph-sizes "$graph_sizes")
  step pair "${PAIR_LIMIT:-330}" python3 benchmarks/serve_pair_bench.py \
    --bundle "$bundles/timm_xception-fp8-uint8-1.0.0-torch-aoti.bundle" \
    --bundle "$bundles/timm_xception-fp16-uint8-1.0.0-torch-aoti.bundle" --batch 32 \
    --clients 64 --http-procs "${PROCS:-8,32}" --workers "${WORKERS:-8}" \
    --paths "${PATHS:-http,grpc}" --stage-ahead "${STAGE:-off}" \
    "${sized[@]}" \
    --rounds "${REPEATS:-3}" --seconds 3 --warmup 1
  ;;
*) echo "$usage" >&2; exit 2 ;;
esac
echo "== done (+$(( $(date +%s) - start )) s)"
