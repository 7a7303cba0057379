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
# (a device call that ends early still shows how far it got).
#
# BUNDLE overrides the command (default: `bundle`, or `python3 -m bundler.cli` when the
# package is on PYTHONPATH but not installed, as on the lent GPU machines).
set -eu
out=${1:?usage: $0 OUT_DIR}
if [ -z "${BUNDLE:-}" ]; then
  if command -v bundle >/dev/null 2>&1; then BUNDLE=bundle; else BUNDLE="python3 -m bundler.cli"; fi
fi
export PYTHONUNBUFFERED=1
mkdir -p "$out"
start=$(date +%s)
since() { echo "+$(( $(date +%s) - start )) s"; }
common=(timm_xception --random-weights --calib-count 16 --reference-count 4 --backend torch-aoti --out "$out")

pids=()
for spec in fp32 fp16 fp8 fp8:fp8-depthwise; do   # PRECISION[:VARIANT]
  precision=${spec%%:*} variant=${spec#*:}
  args=(--precision "$precision")
  [ "$variant" = "$spec" ] || args+=(--variant "$variant")
  $BUNDLE make "${common[@]}" "${args[@]}" >"$out/make-${spec#*:}.log" 2>&1 &
  pids+=("$!")
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
for log in "$out"/make-*.log; do echo "== $log"; grep -v '^[EW][0-9]' "$log" | tail -3; done
[ "$failed" = 0 ] || { echo "a build failed (logs above)"; exit 1; }
echo "built $(since)"

for b in "$out"/timm_xception-fp8-[0-9]*-torch-aoti.bundle; do
  $BUNDLE verify --numerics "$b" 2>&1 | grep --line-buffered -v '^[EW][0-9]' || true
done
echo "verified $(since)"

$BUNDLE study timm_xception --random-weights --backend torch-aoti --variants fp8-depthwise \
    --out "$out" 2>&1 | grep --line-buffered -v '^[EW][0-9]' || true
echo "studied $(since)"
