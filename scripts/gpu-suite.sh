#!/usr/bin/env bash
# GPU suite: runs every GPU test binary in DIR (executables named gpu_*, as copied from
# `cargo test --release --no-run` output) with --ignored, first with every GPU visible, then
# with one GPU visible (CUDA_VISIBLE_DEVICES=0), so two-GPU and one-GPU machines are both covered.
# On a machine with one GPU the second pass would repeat the first, so it runs once.
#
# Build here:  scripts/build-gpu-suite.sh DIR (every GPU test binary, named gpu_*, and gdpath)
# Run there:   GDPATH_BIN=DIR/gdpath scripts/gpu-suite.sh DIR   (GDPATH_BIN for the CLI tests)
# Last, scripts/gpu-nccl-log.sh (a one-rank PyTorch NCCL log through `gdpath nccl`; skips aloud
# without torch). Exit status: 0 when every binary passed in every configuration.
set -u -o pipefail
dir=${1:?usage: gpu-suite.sh DIR-with-test-binaries}
shopt -s nullglob
bins=("$dir"/gpu_*)
if [ ${#bins[@]} -eq 0 ]; then
    echo "gpu-suite: no gpu_* test binaries in $dir" >&2
    exit 2
fi
# Test binaries built elsewhere look for the repository's fixtures/ where they were built: point
# them at DIR/fixtures, or at ./fixtures when run from a checkout (the device's working tree).
if [ -z "${GDPATH_FIXTURES:-}" ]; then
    if [ -d "$dir/fixtures" ]; then
        export GDPATH_FIXTURES="$dir/fixtures"
    elif [ -d fixtures ]; then
        export GDPATH_FIXTURES="$PWD/fixtures"
    fi
fi
passes="all 0"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$gpus" -eq 1 ]; then passes=all; fi
echo "gpu-suite: nvidia-smi lists ${gpus} GPU(s): passes with GPUs visible: ${passes}"
fail=0
for visible in $passes; do
    for b in "${bins[@]}"; do
        [ -x "$b" ] && [ -f "$b" ] || continue
        case "$b" in *.sh) continue ;; esac
        echo "=== $(basename "$b") (GPUs visible: $visible) ==="
        if [ "$visible" = all ]; then
            "$b" --ignored --test-threads=1 || fail=1
        else
            CUDA_VISIBLE_DEVICES=$visible "$b" --ignored --test-threads=1 || fail=1
        fi
    done
done
# Last: a real NCCL log from PyTorch read by `gdpath nccl` (skips aloud without torch or CUDA).
nccl_log=$(dirname "$0")/gpu-nccl-log.sh
[ -f "$nccl_log" ] || nccl_log=$dir/gpu-nccl-log.sh
if [ -f "$nccl_log" ]; then
    echo "=== gpu-nccl-log.sh ==="
    GDPATH_BIN=${GDPATH_BIN:-$dir/gdpath} bash "$nccl_log" || fail=1
else
    echo "gpu-suite: SKIP gpu-nccl-log.sh: not beside this script nor in $dir"
fi
if [ $fail -ne 0 ]; then echo "gpu-suite: FAILED" >&2; else echo "gpu-suite: all passed"; fi
exit $fail
