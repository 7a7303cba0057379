#!/usr/bin/env bash
# What the tenth session of 2026-12-03 leaves for the H200: device calls that build the
# bundles they need into /tmp/pending (reused while the machine stays warm; $OUT is fresh
# per call, and the bundles are too large to bring back):
#
#   benchmarks/gpu_pending.sh serve OUT_DIR   # ~480 s: the uint8-input fp16 and fp8
#       bundles (no verify: the ninth session verified the same build), then
#       serve_bench.py over HTTP and gRPC, fp8 with 16 front-end workers and fp16 with 8
#       (the ninth session's best settings: HTTP fp8 0.87, fp16 0.92 of the batcher), each
#       path under both of the runner's event_sync modes side by side: "spin" (the
#       completion thread spinning in cudaEventSynchronize, 0.6-1.0 cores there) and
#       "block" (blocking-sync events: that core left to workers and clients). Also the
#       first H200 run of the engine loop's per-request changes (cached metric children,
#       one-syscall readable check, serving_gc).
#
# Logs: OUT_DIR/<step>.log. Each step prints as it goes and has its own timeout.
set -u
what=${1:?usage: $0 serve OUT_DIR}
out=${2:?usage: $0 serve OUT_DIR}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
export PYTHONPATH=${PYTHONPATH:-}:$PWD PYTHONUNBUFFERED=1
bundles=/tmp/pending
mkdir -p "$bundles"
start=$(date +%s)
step() {   # step NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "== $name (+$(( $(date +%s) - start )) s, at most $limit s): $*"
  timeout "$limit" "$@" 2>&1 | grep --line-buffered -v '^[EW][0-9]' | tee "$out/$name.log"
  echo "== $name: exit ${PIPESTATUS[0]}"
}
case "$what" in
serve)
  step build 330 env INPUTS=uint8 bash -c '. benchmarks/gpu_common.sh; make_parallel "$0" \
    "fp16-uint8:--precision fp16 --input uint8" "fp8-uint8:--precision fp8 --input uint8"' \
    "$bundles"
  for pw in fp8:16 fp16:8; do
    p=${pw%%:*} w=${pw#*:}
    step "serve-$p" 230 python3 benchmarks/serve_bench.py \
      --bundle "$bundles/timm_xception-$p-uint8-1.0.0-torch-aoti.bundle" --batch 32 \
      --clients 64 --http-clients 64 --http-procs 8 --workers-list "$w" \
      --paths http,grpc --event-sync spin,block --seconds 3 --warmup 1
  done
  ;;
*) echo "usage: $0 serve OUT_DIR" >&2; exit 2 ;;
esac
echo "== done (+$(( $(date +%s) - start )) s)"
