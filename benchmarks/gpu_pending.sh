#!/usr/bin/env bash
# What the eighth session of 2026-12-02 left for the H200: two device calls, the second on
# the machine the first leaves warm (bundles kept in /tmp/pending, not in $OUT, which is
# fresh per call):
#
#   benchmarks/gpu_pending.sh study OUT_DIR   # ~400 s: timm_xception's bundles with the
#       fixed depthwise kernel (family.json fp8_depthwise: triton; the eighth session timed
#       a build whose kernel failed torch's mutation analysis), `bundle study` against the
#       torch.compile peer; then inductor_fp8_bench fp8-cl against fp8-cl-dwcudnn
#   benchmarks/gpu_pending.sh serve OUT_DIR   # issue 15's client-side fp8/fp16 (target
#       >= 1.15x over HTTP and gRPC) with the faster fp8 bundle: serve_bench.py on each
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
  step dwcudnn 110 python3 benchmarks/inductor_fp8_bench.py --family timm_xception --static \
    --batch-sizes 32 --variants fp8-cl,fp8-cl-dwcudnn --budget-s 90 --json "$out/dwcudnn.jsonl"
  ;;
serve)
  for p in fp8 fp16; do
    step "serve-$p" 250 python3 benchmarks/serve_bench.py \
      --bundle "$bundles/timm_xception-$p-1.0.0-torch-aoti.bundle" --batch 32 --clients 64 \
      --http-clients 64 --http-procs 8 --workers-list 4 --paths http,grpc --seconds 4
  done
  ;;
*) echo "usage: $0 study|serve OUT_DIR" >&2; exit 2 ;;
esac
echo "== done (+$(( $(date +%s) - start )) s)"
