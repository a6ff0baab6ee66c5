#!/usr/bin/env bash
# Issue 24's checkpoint save on a GPU machine, in one call of about 150 s at the default size:
# the save GPU tests (Rust and Python), then bench/save_baselines.py: GPU tensors
# (SIZE, default 4GiB) saved to tmpfs and to the root disk by `gdpath resave`,
# `gdpath.safetensors.save_file`, `safetensors.torch.save_file` and fastsafetensors'
# ParallelSaver, beside `dd` / `fio` writes of the same size; fsync in every timing; every
# file verified. Outputs (JSON lines, logs) go to $OUT.
#
# Build here (the binaries run there without cargo):
#   cargo build --release -p gdpath-cli
#   cargo test --release -p gdpath-checkpoint --test gpu_checkpoint --no-run # prints target/release/deps/gpu_checkpoint-HASH
#   cargo test --release -p gdpath-cli --test gpu_load --no-run # prints target/release/deps/gpu_load-HASH
#   PATH="$PWD/.venv/bin:$PATH" .venv/bin/maturin build --release --zig \
#     --compatibility manylinux_2_28 -m crates/gdpath-py/Cargo.toml --out target/wheels
#   mkdir -p .devbin/save && strip -o .devbin/save/gdpath target/release/gdpath \
#     && strip -o .devbin/save/gpu_checkpoint target/release/deps/gpu_checkpoint-HASH \
#     && strip -o .devbin/save/gpu_gpu_load target/release/deps/gpu_load-HASH \
#     && cp target/wheels/gdpath-*.whl .devbin/save/
# Run there (carry .devbin/save and .whl):   bench/device-save.sh .devbin/save [.whl]
#
# Environment: PY (a python with torch and safetensors; default /opt/torch/.venv/bin/python,
# else python3), SIZE (default 4GiB), RUNS (tmpfs, default 3), DISK_RUNS (default 2),
# DIRS (default /dev/shm,$PWD: tmpfs first), SKIP_TESTS=1.
set -u -o pipefail
dir=${1:?usage: device-save.sh DIR-with-gdpath [WHEEL-DIR]}
wheels=${2:-.whl}
out=${OUT:-.}
PY=${PY:-$( [ -x /opt/torch/.venv/bin/python ] && echo /opt/torch/.venv/bin/python || command -v python3 )}
here=$(cd "$(dirname "$0")" && pwd)
start=$(date +%s)
elapsed() { echo "[$(( $(date +%s) - start )) s] $*"; }

date -u
nvidia-smi -L
df -h /dev/shm "$PWD" | sed 's/^/  /'

# gdpath's wheel (abi3) and fastsafetensors' go into a directory of their own on PYTHONPATH,
# without their dependencies (the machine's torch, numpy and safetensors are used).
pylib=$(mktemp -d)
trap 'rm -rf "$pylib"' EXIT
for w in "$dir"/gdpath-*.whl "$wheels"/fastsafetensors-*.whl "$wheels"/pytest/*.whl; do
    [ -e "$w" ] || continue
    "$PY" -m pip install --quiet --no-deps --no-index --target "$pylib" "$w" >/dev/null 2>&1 \
        || echo "pip install $(basename "$w") failed (its saver is skipped)"
done
export PYTHONPATH="$pylib${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c 'import gdpath; print("gdpath", gdpath.__version__, "from", gdpath.__file__)' 2>&1 | tail -1
"$PY" -c 'import fastsafetensors as f; print("fastsafetensors from", f.__file__)' 2>&1 | tail -1

fail=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    if [ -x "$dir/gpu_checkpoint" ]; then
        elapsed "### GPU test: gpu_checkpoint gpu_tensors_save_byte_exact"
        timeout 60 "$dir/gpu_checkpoint" --ignored --exact gpu_tensors_save_byte_exact --nocapture \
            2>&1 | tee "$out/gpu_save.log" | grep -E '^(test |/|test result)' || fail=1
        grep -q "test result: ok. 1 passed" "$out/gpu_save.log" || fail=1
    fi
    if [ -x "$dir/gpu_gpu_load" ]; then
        elapsed "### GPU test: gpu_load resave_from_the_gpu_is_verified_and_reports_its_path"
        GDPATH_BIN="$dir/gdpath" timeout 60 "$dir/gpu_gpu_load" --ignored --exact \
            resave_from_the_gpu_is_verified_and_reports_its_path --nocapture 2>&1 \
            | tee "$out/gpu_resave.log" | grep -E '^(test |gdpath resave|test result)'
        grep -q "test result: ok. 1 passed" "$out/gpu_resave.log" || fail=1
    fi
    if "$PY" -c 'import pytest, gdpath' 2>/dev/null; then
        elapsed "### Python tests: test_save_gpu.py (GPU), test_save.py (torch on the CPU)"
        (cd "$here/../crates/gdpath-py/tests" && timeout 60 "$PY" -m pytest -q -rs -p no:cacheprovider \
            test_save_gpu.py test_save.py 2>&1) | tee "$out/pytest_save_gpu.log" | tail -5
        grep -qE "[0-9]+ passed" "$out/pytest_save_gpu.log" && ! grep -q failed "$out/pytest_save_gpu.log" || fail=1
    fi
fi

elapsed "### savers (bench/save_baselines.py, SIZE=${SIZE:-4GiB})"
timeout 400 "$PY" "$here/save_baselines.py" --gdpath-bin "$dir/gdpath" \
    --size "${SIZE:-4GiB}" --runs "${RUNS:-3}" --disk-runs "${DISK_RUNS:-2}" \
    --dirs "${DIRS:-/dev/shm,$PWD}" --json "$out/save.jsonl" 2>&1 | tee "$out/save.log" || fail=1
elapsed "done"
[ $fail -eq 0 ] && echo "device-save: all ran and verified" || echo "device-save: FAILURES above" >&2
exit $fail
