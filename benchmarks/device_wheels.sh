#!/usr/bin/env bash
# The Python packages a lent GPU machine lacks, or has too old, for the GPU scripts
# (gpu_pending.sh and the studies), as cp312 x86-64 wheels in one folder that a device
# call carries (the folder is in .gitignore):
#
#   bash benchmarks/device_wheels.sh [DIR]    # DIR: .whl (default), ~40 MB
#
# and each device call names DIR in `carry` and starts with
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD
#
# The image (KINDS.md, Python 3.12, torch 2.11) has onnxruntime 1.30, under the 1.32 that
# `bundle make` needs (timm_vit_base's fp8 graph): the forty-sixth session carried the rest
# and not it, and its ViT builds failed. The other packages are the bundler's and the
# servers' (zstandard, jsonschema, onnx-graphsurgeon, starlette, uvicorn) and tritonclient's
# HTTP client for the serving benchmarks. gpu_pending.sh checks them first
# (`preflight`) and stops before any step when one is missing.
set -euo pipefail
dir=${1:-.whl}
mkdir -p "$dir"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
# One version of each (two of one package stop the whole install there): the folder is
# emptied of wheels first.
rm -f "$dir"/*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d "$dir" \
  'onnxruntime>=1.32' zstandard jsonschema jsonschema-specifications referencing rpds-py \
  onnx-graphsurgeon starlette uvicorn tritonclient python-rapidjson geventhttpclient gevent \
  greenlet zope.event zope.interface brotli 2> >(grep -v '^WARNING: Location' >&2)
ls "$dir"/*.whl | sed 's|.*/||'
du -sh "$dir"
