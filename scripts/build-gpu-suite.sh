#!/usr/bin/env bash
# Builds every GPU test binary and the `gdpath` binary in release, stripped, into DIR (git-ignored
# when under .devbin/), named as scripts/gpu-suite.sh runs them (gpu_*), so that a
# machine without cargo runs the whole suite from DIR:
#
#   scripts/build-gpu-suite.sh .devbin/suite           # here
#   GDPATH_BIN=.devbin/suite/gdpath scripts/gpu-suite.sh .devbin/suite   # on the GPU machine
#
# The list of GPU test targets is kept here, in one place: add a new GPU test binary below.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: build-gpu-suite.sh DIR}
# crate, test target, name in DIR
tests=(
  "gdpath gpu_paths gpu_paths" "gdpath gds_gpu gpu_gds" "gdpath gpu_kv gpu_kv"
  "gdpath-checkpoint gpu_checkpoint gpu_checkpoint"
  "gdpath-doctor gpu_doctor gpu_doctor"
  "gdpath-cuda gpu gpu_cuda"
  "gdpath-cli gpu_net gpu_net" "gdpath-cli gpu_load gpu_load" "gdpath-cli gpu_report gpu_report"
  "gdpath-metrics gpu_metrics gpu_metrics"
)
mkdir -p "$dir"
cargo build --release --locked -p gdpath-cli
strip -o "$dir/gdpath" "${CARGO_TARGET_DIR:-target}/release/gdpath"
for t in "${tests[@]}"; do
  set -- $t
  # The test binary's path is the executable cargo prints for that target.
  exe=$(cargo test --release --locked -p "$1" --test "$2" --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"]==["test"]:
        print(m["executable"])')
  [ -n "$exe" ] || { echo "build-gpu-suite: no executable for $1 --test $2" >&2; exit 1; }
  strip -o "$dir/$3" "$exe"
  echo "$dir/$3"
done
du -sh "$dir"
