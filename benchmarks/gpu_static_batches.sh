#!/usr/bin/env bash
# Static-batch graphs on the H200, in one run: a family's fp16 torch-aoti bundle as shipped
# (one dynamic-batch graph) and the same bundle with graphs for SIZES (family.json
# torch_aoti.static_batches), against the torch.compile peer:
#
#   benchmarks/gpu_static_batches.sh FAMILY OUT_DIR [SIZES (default 1,32)] [PRECISION (fp16)]
#
# Builds both bundles at once (`make_parallel` of gpu_common.sh, --random-weights): the
# shipped family into OUT_DIR/dynamic, a copy of it listing SIZES (OUT_DIR/families, found
# first through $TRT_BUNDLE_FAMILIES_PATH) into OUT_DIR/static; then, in one process,
# benchmarks/aoti_static_vs_peer.py times both and the peer at batch 1 and 32 and checks the
# static graphs' outputs against the dynamic bundle's. Only the family's fp16 is built (no
# fp32 reference, no fp8): 1 + 1 + len(SIZES) AOTInductor compiles. Bundles built by an
# earlier call into OUT_DIR are reused. STEP=build or STEP=measure runs one half (e.g. the
# builds in the background while the GPU times something else, then the measurement).
set -eu
step=${STEP:-all}
family=${1:?usage: $0 FAMILY OUT_DIR [SIZES] [PRECISION]}
out=${2:?usage: $0 FAMILY OUT_DIR [SIZES] [PRECISION]}
sizes=${3:-1,32}
precision=${4:-fp16}
export FAMILY=$family
here=$(cd "$(dirname "$0")" && pwd)
. "$here/gpu_common.sh"
mkdir -p "$out/dynamic" "$out/static" "$out/families"
rm -rf "${out:?}/families/$family"
cp -r "$here/../families/$family" "$out/families/$family"
python3 - "$out/families/$family/family.json" "$sizes" <<'EOF'
import json, sys
path, sizes = sys.argv[1], [int(n) for n in sys.argv[2].split(",")]
spec = json.load(open(path))
spec.setdefault("torch_aoti", {})["static_batches"] = sizes
json.dump(spec, open(path, "w"), indent=2)
EOF
if [ "$step" != measure ]; then
make_parallel "$out/dynamic" "$precision:--precision $precision" &
dynamic=$!
TRT_BUNDLE_FAMILIES_PATH="$out/families" make_parallel "$out/static" "$precision:--precision $precision" &
static=$!
failed=0
wait "$dynamic" || failed=1
wait "$static" || failed=1
[ "$failed" = 0 ] || { echo "a build failed (logs above)"; exit 1; }
echo "built $(since)"
fi
[ "$step" != build ] || exit 0
# the packages were just built on this host: no child-process test load (saves ~15 s each)
TRT_BUNDLE_AOTI_LOAD_CHECK=0 python3 "$here/aoti_static_vs_peer.py" \
    "$out"/dynamic/"$family-$precision"-[0-9]*-torch-aoti.bundle \
    "$out"/static/"$family-$precision"-[0-9]*-torch-aoti.bundle \
    --batch-sizes 1,32 --json "$out/static_vs_peer.json" 2>&1 | grep --line-buffered -v '^[EW][0-9]' || true
echo "measured $(since)"
