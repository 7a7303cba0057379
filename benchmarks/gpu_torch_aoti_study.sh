#!/usr/bin/env bash
# `bundle study` of timm_xception's torch-aoti bundles on one GPU host, in one go (issue 8).
#
#   benchmarks/gpu_torch_aoti_study.sh OUT_DIR
#
# Builds the four bundles the study needs (fp32 reference, fp16, fp8, fp8-depthwise) in
# parallel processes with the study's own --random-weights settings, so that the study
# reuses them instead of building them one after the other (about 2.5 minutes instead of
# 5 on an H200), then checks the fp8 bundle against its ONNX Runtime reference outputs
# (`bundle verify --numerics`) and runs the study: engine-only and with-copies times at
# batch 1 and 32, sizes, quality on 32 held-out synthetic pictures. Output is line-buffered
# (a device call that ends early still shows how far it got). BUNDLE overrides the
# command (benchmarks/gpu_common.sh).
set -eu
out=${1:?usage: $0 OUT_DIR}
. "$(dirname "$0")/gpu_common.sh"
mkdir -p "$out"
make_parallel "$out" "fp32:--precision fp32" "fp16:--precision fp16" "fp8:--precision fp8" \
    "fp8-depthwise:--precision fp8 --variant fp8-depthwise"
echo "built $(since)"

for b in "$out"/timm_xception-fp8-[0-9]*-torch-aoti.bundle; do
  $BUNDLE verify --numerics "$b" 2>&1 | grep --line-buffered -v '^[EW][0-9]' || true
done
echo "verified $(since)"

$BUNDLE study timm_xception --random-weights --backend torch-aoti --variants fp8-depthwise \
    --out "$out" 2>&1 | grep --line-buffered -v '^[EW][0-9]' || true
echo "studied $(since)"
