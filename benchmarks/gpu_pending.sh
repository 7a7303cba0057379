#!/usr/bin/env bash
# What the eighth session of 2026-12-02 left for the H200: two device calls, each
# building the bundles it needs into /tmp/pending (reused while the machine stays warm;
# $OUT is fresh per call, and the bundles are too large to bring back):
#
#   benchmarks/gpu_pending.sh study OUT_DIR   # ~400 s: timm_xception's bundles with the
#       fixed depthwise kernel (family.json fp8_depthwise: triton; the eighth session timed
#       a build whose kernel failed torch's mutation analysis), `bundle study` against the
#       torch.compile peer; then dw_conv_bench.py with the three tiles of 8 warps added
#       (and what a tile per layer shape would give: the kernel is 1.70 ms over the 39
#       layers in the engine, cuDNN's depthwise kernel alone was 1.10)
#   benchmarks/gpu_pending.sh serve OUT_DIR   # ~550 s: the uint8-input fp16 and fp8
#       bundles, then serve_bench.py on each (batcher vs raw: issue 14's fp8/fp16 >= 1.15
#       through the batcher; HTTP, gRPC, shared memory vs the batcher and fp8/fp16 at the
#       client: issue 15's targets), with the faster fp8 bundle
#
# Logs: OUT_DIR/<step>.log. Each step prints as it goes and has its own timeout.
set -u
what=${1:?usage: $0 study|serve OUT_DIR}
out=${2:?usage: $0 study|serve OUT_DIR}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
export PYTHONPATH=${PYTHONPATH:-}:$PWD PYTHONUNBUFFERED=1
bundles=/tmp/pending
start=$(date +%s)
step() {   # step NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "== $name (+$(( $(date +%s) - start )) s, at most $limit s): $*"
  timeout "$limit" "$@" 2>&1 | grep --line-buffered -v '^[EW][0-9]' | tee "$out/$name.log"
  echo "== $name: exit ${PIPESTATUS[0]}"
}
case "$what" in
study)
  step study 450 bash benchmarks/gpu_family_study.sh timm_xception "$bundles"
  cp "$bundles"/study.md "$bundles"/study.json "$bundles"/make-*.log "$out"/ 2>/dev/null
  step dw-tiles 100 python3 benchmarks/dw_conv_bench.py --budget-s 85
  ;;
serve)
  # issue 14's uint8 fp8/fp16 through the batcher and issue 15's paths, as the fifth
  # session ran them (docs/measurements/h200-2026-12-02-e), now with the depthwise kernel
  step build 280 env INPUTS=uint8 bash benchmarks/gpu_data_path.sh build "$bundles"
  for p in fp8 fp16; do
    step "serve-$p" 140 python3 benchmarks/serve_bench.py \
      --bundle "$bundles/timm_xception-$p-uint8-1.0.0-torch-aoti.bundle" --batch 32 \
      --clients 64 --http-clients 64 --http-procs 8 --workers-list 8 \
      --paths http,grpc,http_shm --seconds 3 --warmup 1
  done
  ;;
*) echo "usage: $0 study|serve OUT_DIR" >&2; exit 2 ;;
esac
echo "== done (+$(( $(date +%s) - start )) s)"
