#!/usr/bin/env bash
# Issue 18's H200 study of one family's torch-aoti bundles against the peer, in one run:
#
#   [VARIANTS=v1,v2] benchmarks/gpu_family_study.sh FAMILY OUT_DIR [extra `bundle study` options]
#
# Builds fp32 (the reference), fp16 and fp8 in parallel processes (--random-weights: speed
# is real, quality only says the precisions track fp32), checks the fp8 bundle against its
# ONNX Runtime reference outputs, then `bundle study --peer torch-compile`: engine-only
# (CUDA graph replay) and with-copies times at batch 1 and 32 of the three bundles and of
# the timm model in fp16 + channels_last + torch.compile (default mode) + CUDA graph, in one
# process; quality vs fp32 on 32 held-out synthetic pictures. VARIANTS: the family's fp8
# recipe variants to build and study too. Bundles already built into OUT_DIR by an earlier
# call are reused.
set -eu
family=${1:?usage: $0 FAMILY OUT_DIR}
out=${2:?usage: $0 FAMILY OUT_DIR}
export FAMILY=$family
. "$(dirname "$0")/gpu_common.sh"
mkdir -p "$out"
items=("fp32:--precision fp32" "fp16:--precision fp16" "fp8:--precision fp8")
variants=${VARIANTS:-}
for v in ${variants//,/ }; do items+=("$v:--precision fp8 --variant $v"); done
make_parallel "$out" "${items[@]}"
echo "built $(since)"
for b in "$out"/"$family"-fp8-[0-9]*-torch-aoti.bundle; do
  $BUNDLE verify --numerics "$b" 2>&1 | grep --line-buffered -v '^[EW][0-9]' || true
done
echo "verified $(since)"
$BUNDLE study "$family" --random-weights --backend torch-aoti --peer torch-compile \
    ${variants:+--variants "$variants"} --out "$out" "${@:3}" 2>&1 | grep --line-buffered -v '^[EW][0-9]' || true
echo "studied $(since)"
