#!/usr/bin/env bash
# The data-path study of issue 14 on one GPU host:
#
#   benchmarks/gpu_data_path.sh build OUT_DIR   # four torch-aoti bundles in parallel (~4 min on an H200)
#   benchmarks/gpu_data_path.sh bench OUT_DIR   # data_path_bench.py: float32 pair, then uint8 pair
#
# Bundles: timm_xception fp16 and fp8, float32 and uint8 input (--random-weights: speed is
# real, quality is not the point here). Output is line-buffered.
set -eu
what=${1:?usage: $0 build|bench OUT_DIR}
out=${2:?usage: $0 build|bench OUT_DIR}
. "$(dirname "$0")/gpu_common.sh"
mkdir -p "$out"
if [ "$what" = build ]; then
  make_parallel "$out" "fp16-float32:--precision fp16 --input float32" \
      "fp8-float32:--precision fp8 --input float32" "fp16-uint8:--precision fp16 --input uint8" \
      "fp8-uint8:--precision fp8 --input uint8"
  echo "built $(since)"
  $BUNDLE verify --numerics "$out"/timm_xception-fp8-uint8-1.0.0-torch-aoti.bundle 2>&1 | grep -v '^[EW][0-9]' || true
  echo "verified $(since)"
else
  b() { echo "$out/timm_xception-$1-1.0.0-torch-aoti.bundle"; }
  python3 benchmarks/data_path_bench.py --bundle "$(b fp16)" --bundle "$(b fp8)" "${@:3}"
  echo "float32 pair $(since)"
  python3 benchmarks/data_path_bench.py --bundle "$(b fp16-uint8)" --bundle "$(b fp8-uint8)" "${@:3}"
  echo "uint8 pair $(since)"
fi
