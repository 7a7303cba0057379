#!/usr/bin/env bash
# What the ninth session of 2026-12-02 left for the H200: one device call, building the
# bundles it needs into /tmp/pending (reused while the machine stays warm; $OUT is fresh
# per call, and the bundles are too large to bring back):
#
#   benchmarks/gpu_pending.sh serve OUT_DIR   # ~460 s: the uint8-input fp16 and fp8
#       bundles (no verify: the ninth session verified the same build), then
#       serve_bench.py: fp8 with 16 front-end workers, fp16 with 8 and 16, as that
#       session's call 4 ran them (HTTP fp8 0.87, fp16 0.92 / 0.86 of the batcher; gRPC
#       0.72-0.73), now with the engine loop's per-request changes made after it (cached
#       metric children, a one-syscall readable check, serving_gc): does the cohort's
#       round trip ("back" 3.1-3.3 ms) shrink? The engine's threads are named in each CPU
#       line (the loop was 0.47-0.64 cores there).
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
  step build 240 env INPUTS=uint8 bash -c '. benchmarks/gpu_common.sh; make_parallel "$0" \
    "fp16-uint8:--precision fp16 --input uint8" "fp8-uint8:--precision fp8 --input uint8"' \
    "$bundles"
  for pw in fp8:16 fp16:8,16; do
    p=${pw%%:*} w=${pw#*:}
    step "serve-$p" 250 python3 benchmarks/serve_bench.py \
      --bundle "$bundles/timm_xception-$p-uint8-1.0.0-torch-aoti.bundle" --batch 32 \
      --clients 64 --http-clients 64 --http-procs 8 --workers-list "$w" \
      --paths http,grpc,http_shm --seconds 3 --warmup 1
  done
  ;;
*) echo "usage: $0 serve OUT_DIR" >&2; exit 2 ;;
esac
echo "== done (+$(( $(date +%s) - start )) s)"
