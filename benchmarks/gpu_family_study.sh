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
# call are reused. INPUT=uint8: every bundle and the peer take uint8 NHWC pixels
# (`bundle study --input uint8`; the bundles are named ...-uint8-...).
set -eu
family=${1:?usage: $0 FAMILY OUT_DIR}
out=${2:?usage: $0 FAMILY OUT_DIR}
export FAMILY=$family
. "$(dirname "$0")/gpu_common.sh"
mkdir -p "$out"
input=${INPUT:-float32}
tag=${input/float32/}   # the log names of the uint8 builds end in -uint8
items=("fp32${tag:+-$tag}:--precision fp32 --input $input"
       "fp16${tag:+-$tag}:--precision fp16 --input $input"
       "fp8${tag:+-$tag}:--precision fp8 --input $input")
variants=${VARIANTS:-}
for v in ${variants//,/ }; do items+=("$v${tag:+-$tag}:--precision fp8 --variant $v --input $input"); done
make_parallel "$out" "${items[@]}"
echo "built $(since)"
for b in "$out"/"$family"-fp8-${tag:+$tag-}[0-9]*-torch-aoti.bundle; do
  $BUNDLE verify --numerics "$b" 2>&1 | grep --line-buffered -v '^[EW][0-9]' || true
done
echo "verified $(since)"
$BUNDLE study "$family" --random-weights --backend torch-aoti --peer torch-compile \
    ${variants:+--variants "$variants"} --input "$input" --out "$out" "${@:3}" 2>&1 | grep --line-buffered -v '^[EW][0-9]' || true
echo "studied $(since)"
