#!/usr/bin/env bash
# The data-path and serving studies of issues 14 and 15 on one GPU host:
#
#   benchmarks/gpu_data_path.sh build OUT_DIR   # timm_xception fp16 + fp8 torch-aoti bundles, in parallel
#   benchmarks/gpu_data_path.sh bench OUT_DIR   # data_path_bench.py on each fp16/fp8 pair
#   benchmarks/gpu_data_path.sh serve OUT_DIR [serve_bench.py options]   # each bundle served
#     (by `bundle serve`'s default HTTP server, the built-in one; add --http-server uvicorn
#     for the former front-end, --http-client stdlib for the former http.client clients)
#
# INPUTS (default "float32 uint8"): which input forms to build and measure (`bundle make
# --input`); uint8 bundles take NHWC pixels and normalize in the engine. --random-weights:
# speed is real, quality is not the point here. Bundles built by an earlier call into the
# same OUT_DIR are reused. Output is line-buffered.
set -eu
what=${1:?usage: $0 build|bench|serve OUT_DIR}
out=${2:?usage: $0 build|bench|serve OUT_DIR}
. "$(dirname "$0")/gpu_common.sh"
mkdir -p "$out"
inputs=${INPUTS:-float32 uint8}
b() { echo "$out/timm_xception-$1-1.0.0-torch-aoti.bundle"; }
tag() { if [ "$2" = float32 ]; then echo "$1"; else echo "$1-$2"; fi; }
case "$what" in
build)
  items=()
  for i in $inputs; do
    items+=("fp16-$i:--precision fp16 --input $i" "fp8-$i:--precision fp8 --input $i")
  done
  make_parallel "$out" "${items[@]}"
  echo "built $(since)"
  for i in $inputs; do
    $BUNDLE verify --numerics "$(b "$(tag fp8 "$i")")" 2>&1 | grep -v '^[EW][0-9]' || true
  done
  echo "verified $(since)"
  ;;
bench)
  for i in $inputs; do
    python3 benchmarks/data_path_bench.py --bundle "$(b "$(tag fp16 "$i")")" \
        --bundle "$(b "$(tag fp8 "$i")")" "${@:3}"
    echo "$i pair $(since)"
  done
  ;;
serve)
  for i in $inputs; do
    for p in fp8 fp16; do
      python3 benchmarks/serve_bench.py --bundle "$(b "$(tag $p "$i")")" "${@:3}"
      echo "served $p $i $(since)"
    done
  done
  ;;
*) echo "usage: $0 build|bench|serve OUT_DIR" >&2; exit 2 ;;
esac
