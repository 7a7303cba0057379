#!/usr/bin/env bash
# What the seventh session of 2026-12-02 built on the CPU and left for the H200, in one
# device call (at most 570 s of commands; each step prints as it goes and has its own timeout, so
# a step that fails or runs long does not cost the ones after it):
#
#   benchmarks/gpu_pending.sh OUT_DIR
#
# 1. benchmarks/dw_conv_bench.py: timm_xception's 39 depthwise layers, what the fp8 engine
#    runs around each today (the pass before it, cuDNN, the quantize) against the Triton
#    kernel that writes the FP8 GEMM's e4m3 rows (kernels/dw_conv.py), per tile.
# 2. pytest -m gpu tests/test_dw_conv_kernel.py: an AOTInductor package of the Triton form
#    against the cuDNN form; the kernel on CUDA against the CPU codes.
# 3. inductor_fp8_bench.py, timm_xception at batch 32 and 1: fp16-cl, fp8-cl (the shipped
#    fp8 form) and fp8-dwtriton (family.json torch_aoti.fp8_depthwise: triton), with its
#    kernel profile.
# 4. inductor_fp8_bench.py, timm_vit_base at batch 1: fp16, fp8-fp16out (the shipped fp8
#    form) and fp8-fp16out-sbdequant (its Linear layers dequantized in small static graphs).
#
# Logs: OUT_DIR/<step>.log (and .jsonl for the benchmarks). What each result decides:
# families/timm_xception/README.md ("Next: the depthwise half writing e4m3") and
# families/timm_vit_base/README.md ("Batch 1: the dequantized small-batch form").
set -u
out=${1:?usage: $0 OUT_DIR}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
export PYTHONPATH=${PYTHONPATH:-}:$PWD PYTHONUNBUFFERED=1
start=$(date +%s)
step() {   # step NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "== $name (+$(( $(date +%s) - start )) s, at most $limit s): $*"
  timeout "$limit" "$@" 2>&1 | grep --line-buffered -v '^[EW][0-9]' | tee "$out/$name.log"
  echo "== $name: exit ${PIPESTATUS[0]}"
}
step dw-layers 90 python3 benchmarks/dw_conv_bench.py --budget-s 75
step dw-gputest 120 python3 -m pytest -q -m gpu tests/test_dw_conv_kernel.py
step xception 220 python3 benchmarks/inductor_fp8_bench.py --family timm_xception --static \
  --batch-sizes 32,1 --variants fp16-cl,fp8-cl,fp8-dwtriton --profile fp8-dwtriton \
  --budget-s 190 --json "$out/xception.jsonl"
step vit-b1 140 python3 benchmarks/inductor_fp8_bench.py --family timm_vit_base --static \
  --batch-sizes 1 --variants fp16,fp8-fp16out,fp8-fp16out-sbdequant --budget-s 110 \
  --json "$out/vit-b1.jsonl"
echo "== done (+$(( $(date +%s) - start )) s)"
