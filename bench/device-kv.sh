#!/usr/bin/env bash
# Issue 25 on a GPU machine, in one call of under 4 minutes: the KV block GPU tests, then
# `gdpath bench kv` for every target beside PyTorch's (and NIXL's, where its wheel imports)
# baselines of the same shapes, in the same run. Outputs (JSON lines, logs) go to $OUT.
#
# Build here (the binaries run there without cargo):
#   cargo build --release -p gdpath-cli
#   cargo test --release -p gdpath --test gpu_kv --no-run     # prints target/release/deps/gpu_kv-HASH
#   mkdir -p .devbin/kv && strip -o .devbin/kv/gdpath target/release/gdpath \
#     && strip -o .devbin/kv/gpu_kv target/release/deps/gpu_kv-HASH
# Run there (carry .devbin/kv):   bench/device-kv.sh .devbin/kv
#
# Environment: PY (a python with torch; default /opt/torch/.venv/bin/python, else python3),
# GDPATH_UCX_LIB (a CUDA-enabled libucp.so.0; found in the wheel `libucx-cu13` if PY has it,
# needed for exporting GPU memory to another process), SKIP_TESTS=1, SKIP_BASELINES=1.
set -u -o pipefail
dir=${1:?usage: device-kv.sh DIR-with-gdpath-and-gpu_kv}
out=${OUT:-.}
g="$dir/gdpath"
PY=${PY:-$( [ -x /opt/torch/.venv/bin/python ] && echo /opt/torch/.venv/bin/python || command -v python3 )}
here=$(cd "$(dirname "$0")" && pwd)
start=$(date +%s)
elapsed() { echo "[$(( $(date +%s) - start )) s] $*"; }

date -u
nvidia-smi -L
ngpu=$(nvidia-smi -L | grep -c '^GPU')
if [ -z "${GDPATH_UCX_LIB:-}" ] && [ -n "$PY" ]; then
    lib=$("$PY" -c 'import libucx,os;print(os.path.dirname(libucx.__file__)+"/lib/libucp.so.0")' 2>/dev/null)
    if [ -n "$lib" ] && [ -e "$lib" ]; then export GDPATH_UCX_LIB=$lib; fi
fi
echo "GDPATH_UCX_LIB=${GDPATH_UCX_LIB:-<unset: system UCX; GPU exports need a CUDA-enabled one>}"

fail=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    elapsed "### GPU tests (gpu_kv)"
    timeout 150 "$dir/gpu_kv" --ignored --test-threads=1 --nocapture 2>&1 | tee "$out/gpu_kv.log" | grep -E '^(test |SKIP|GPU|pinned|layered|reload|offload|[0-9]+ pairs|test result)' || fail=1
fi

bench() {
    local name=$1; shift
    elapsed "### bench kv $name: $*"
    timeout 60 "$g" bench kv "$@" --json > "$out/kv-$name.json" 2> "$out/kv-$name.err"
    local rc=$?
    [ $rc -eq 0 ] || { echo "bench kv $name: exit $rc"; tail -3 "$out/kv-$name.err"; fail=1; }
    "$PY" - "$out/kv-$name.json" <<'EOF' 2>/dev/null || cat "$out/kv-$name.json"
import json, sys
d = json.load(open(sys.argv[1]))
b, c = d["rows"]
print(f'  {b["src"]} -> {b["dst"]}: blocks {b["gbps_median"]:.1f} GB/s ({b["method"]} on {b["path"]}, '
      f'{b["descriptors"]} -> {b["coalesced"]} descriptors), contiguous {c["gbps_median"]:.1f} GB/s, '
      f'ratio {b["ratio"]:.3f}, posting {b["post_ns_per_descriptor"]:.1f} ns/descriptor, '
      f'verified {b["verified"] and c["verified"]}' + ''.join(f'\n  note: {n}' for n in d.get("notes", []) + d.get("findings", [])))
EOF
}

# Targets (issue 25): >= 0.9x contiguous D2H / H2D for 100,000 x 16 KiB; >= 0.5x contiguous
# D2D for 40,000 x 64 KiB, in process and between processes; <= 0.2 us posting per descriptor.
bench d2h   --src gpu:0 --dst host  --blocks 100000 --block-size 16KiB --runs 5
bench h2d   --src host  --dst gpu:0 --blocks 100000 --block-size 16KiB --runs 5
bench d2d   --src gpu:0 --dst gpu:0 --blocks 40000  --block-size 64KiB --runs 5
bench d2h-runs --src gpu:0 --dst host --blocks 100000 --block-size 16KiB --layout runs --run-len 16 --runs 3
bench h2h   --src host  --dst host  --blocks 100000 --block-size 16KiB --runs 3
if [ "$ngpu" -ge 2 ]; then
    bench peer-gpu --src gpu:0 --dst gpu:1 --blocks 40000 --block-size 64KiB --runs 5
fi
# Between two processes on GPU 0: a `gdpath serve` exporting GPU memory, reached through CUDA
# IPC handed over by the agent protocol.
elapsed "### gdpath serve (another process) exporting gpu:0:2700MB"
"$g" serve --listen 127.0.0.1:18625 --export gpu:0:2700MB --duration 90 > "$out/serve.log" 2>&1 &
spid=$!
for _ in $(seq 50); do grep -qi listen "$out/serve.log" 2>/dev/null && break; sleep 0.2; done
bench ipc-d2d --src gpu:0 --dst peer --peer 127.0.0.1:18625 --blocks 40000 --block-size 64KiB --runs 5
kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
tail -2 "$out/serve.log"
# GPU -> host memory of another process (KV offload to a CPU tier served by its own process): a
# `gdpath serve` exporting shared host memory, mapped and page-locked by the bench's process;
# beside it the same blocks through UCX (fewer: one UCX operation per block) and the CPU tier.
elapsed "### gdpath serve (another process) exporting host:1700MB (shared memory)"
"$g" serve --listen 127.0.0.1:18626 --export host:1700MB --duration 120 > "$out/serve-host.log" 2>&1 &
spid=$!
for _ in $(seq 50); do grep -qi listen "$out/serve-host.log" 2>/dev/null && break; sleep 0.2; done
bench shm-d2h --src gpu:0 --dst peer-host --peer 127.0.0.1:18626 --blocks 100000 --block-size 16KiB --runs 5
bench shm-h2h --src host  --dst peer-host --peer 127.0.0.1:18626 --blocks 100000 --block-size 16KiB --runs 3
bench ucx-d2h --src gpu:0 --dst peer-host --peer 127.0.0.1:18626 --blocks 10000 --block-size 16KiB --runs 3 --no-shared-memory
kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
tail -2 "$out/serve-host.log"

if [ "${SKIP_BASELINES:-0}" != 1 ] && [ -n "$PY" ]; then
    elapsed "### baselines (bench/kv_blocks.py, $PY)"
    timeout 60 "$PY" "$here/kv_blocks.py" --src gpu:0 --dst host --blocks 100000 --block-size 16KiB --runs 3 | tee "$out/baseline-d2h.jsonl"
    timeout 50 "$PY" "$here/kv_blocks.py" --src gpu:0 --dst gpu:0 --blocks 40000 --block-size 64KiB --runs 3 | tee "$out/baseline-d2d.jsonl"
fi
elapsed "done"
[ $fail -eq 0 ] && echo "device-kv: all ran and verified" || echo "device-kv: FAILURES above" >&2
exit $fail
