# Sourced by the GPU study scripts (gpu_torch_aoti_study.sh, gpu_data_path.sh,
# gpu_family_study.sh): the bundle command, line-buffered output, elapsed time, and parallel
# builds of a family's torch-aoti bundles (FAMILY, default timm_xception) with the studies'
# --random-weights settings.
#
# BUNDLE overrides the command (default: `bundle`, or `python3 -m bundler.cli` when the
# package is on PYTHONPATH but not installed, as on the lent GPU machines).
if [ -z "${BUNDLE:-}" ]; then
  if command -v bundle >/dev/null 2>&1; then BUNDLE=bundle; else BUNDLE="python3 -m bundler.cli"; fi
fi
export PYTHONUNBUFFERED=1
start=$(date +%s)
since() { echo "+$(( $(date +%s) - start )) s"; }

FAMILY=${FAMILY:-timm_xception}

# make_parallel OUT NAME:ARGS...: one `bundle make $FAMILY` per item, all at once (ARGS are
# words without spaces, e.g. "fp8-depthwise:--precision fp8 --variant fp8-depthwise"); logs
# appended to OUT/make-$FAMILY-NAME.log, their tails printed; fails when any build failed.
# Each make runs with --reuse: a bundle already in OUT made from the same inputs (an earlier
# call's, or one copied in from another folder) is kept, not compiled again; one made from
# other inputs (another family setting, torch version, ...) is refused with what differs.
make_parallel() {
  local out=$1 item pid log name failed=0
  shift
  local pids=()
  for item in "$@"; do
    name="$FAMILY-${item%%:*}"
    # shellcheck disable=SC2086  # ARGS are meant to split into words
    $BUNDLE make "$FAMILY" --reuse --random-weights --calib-count 16 --reference-count 4 \
      --backend torch-aoti --out "$out" ${item#*:} >>"$out/make-$name.log" 2>&1 &
    pids+=("$!")
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  for log in "$out"/make-"$FAMILY"-*.log; do
    [ -e "$log" ] || continue
    echo "== $log"; grep -v '^[EW][0-9]' "$log" | tail -3
    # a failed build's error lines too (forty-fifth session: a C++ compile error showed
    # only its last three lines, and the device's copy of the log was gone with it)
    if [ "$failed" != 0 ] && ! tail -1 "$log" | grep -q '^[0-9a-f]\{64\}$'; then
      grep -iE 'error|exception|failed' "$log" | grep -v '^[EW][0-9]' | tail -20
    fi
  done
  [ "$failed" = 0 ] || { echo "a build failed (logs above)"; return 1; }
}
