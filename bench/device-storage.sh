#!/usr/bin/env bash
# Issue 24's storage defaults on a GPU machine, in one call of under 200 s: every row verifies its
# bytes and prints min/median/max GB/s (1e9 B/s); the ratios the targets name are printed last.
#   (a) tmpfs -> GPU: `gdpath bench storage --gpu 0` with NO flags (the chooser) beside KvikIO's
#       POSIX mode (threads 16/32 x task 4/16 MiB) and torch's pinned H2D of the same size.
#   (b) a 9.08 GB safetensors checkpoint on the root disk, page cache dropped before each run:
#       `gdpath load --cold --verify` beside Run:ai Model Streamer, InstantTensor, fastsafetensors,
#       KvikIO (whichever import) and dd / fio (O_DIRECT, 16 MiB) of the same file.
#   (c) a fresh `gdpath load` process of the checkpoint from tmpfs: wall time, start included.
#   (d) pageable H2D at 1 / 16 / 256 MiB: `gdpath bench h2d` (gdpath and the bare driver) beside
#       torch's pageable copy.
# Outputs: $OUT/storage.jsonl (one row per line), the commands' JSON and logs.
#
# Build here (the binaries run there without cargo):
#   cargo build --release -p gdpath-cli
#   cargo test --release -p gdpath-cli --test gpu_load --no-run   # prints target/release/deps/gpu_load-HASH
#   mkdir -p .devbin/storage && strip -o .devbin/storage/gdpath target/release/gdpath \
#     && strip -o .devbin/storage/gpu_load target/release/deps/gpu_load-HASH   (optional: its tests run first)
# Wheels (optional, for the baselines that do not come with the image): put them in a folder
# carried too (e.g. .devbin/wheels: runai_model_streamer, instanttensor, fastsafetensors, and for
# KvikIO kvikio_cu13, libkvikio_cu13 and rapids_logger, without which libkvikio.so does not load);
# they are installed with `pip install --no-deps --target` into a temporary folder on PYTHONPATH.
# Run there (carry .devbin):   bench/device-storage.sh .devbin/storage [.devbin/wheels]
#
# Environment: PY (python with torch, cupy, safetensors; default /opt/torch/.venv/bin/python,
# else python3), CKPT (default /root/gdpath-ckpt/llama.safetensors, made when missing, ~15 s),
# SKIP=tests,a,b,c,d (parts to skip), RUNS_COLD (default 2).
set -u -o pipefail
dir=${1:?usage: device-storage.sh DIR-with-gdpath [WHEELS-DIR]}
wheels=${2:-}
out=${OUT:-.}
g="$dir/gdpath"
PY=${PY:-$( [ -x /opt/torch/.venv/bin/python ] && echo /opt/torch/.venv/bin/python || command -v python3 )}
here=$(cd "$(dirname "$0")" && pwd)
base="$here/storage_device.py"
CKPT=${CKPT:-/root/gdpath-ckpt/llama.safetensors}
RUNS_COLD=${RUNS_COLD:-2}
SKIP=${SKIP:-}
jl="$out/storage.jsonl"
: > "$jl"
start=$(date +%s)
elapsed() { echo "[$(( $(date +%s) - start )) s] $*"; }
skip() { case ",$SKIP," in *,"$1",*) return 0;; esac; return 1; }
fail=0

date -u
nvidia-smi -L
echo "root disk: $(stat -f -c %T "$(dirname "$CKPT")" 2>/dev/null || stat -f -c %T /) ; /dev/shm: $(stat -f -c %T /dev/shm)"
if [ -n "$wheels" ] && ls "$wheels"/*.whl >/dev/null 2>&1; then
    site=$(mktemp -d)
    "$PY" -m pip install -q --no-deps --no-index --target "$site" "$wheels"/*.whl 2>&1 | tail -2
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    echo "wheels from $wheels on PYTHONPATH ($site)"
fi

# Rows of gdpath's own JSON as storage.jsonl rows: `rows2jsonl PART PREFIX FILE`.
rows2jsonl() {
    "$PY" - "$1" "$2" "$3" >> "$jl" <<'EOF'
import json, sys
part, prefix, path = sys.argv[1:]
d = json.load(open(path))
for r in d.get("rows", []):
    size = r["bytes"]
    sz = f"{size >> 20}MiB" if size >= 1 << 20 else f"{size}B"
    if part == "d":
        who = {"h2d-pageable": "gdpath", "h2d-pageable-driver": "driver"}.get(r["path"])
        if who is None:
            continue
        method = f"{who}-pageable-h2d-{sz}"
    else:
        method = f"{prefix}-{r['path']}-t{r['qd']}-{r['block'] >> 20}MiB"
    print(json.dumps({"part": part, "method": method, "gbps_min": r["gbps_min"],
                      "gbps_median": r["gbps_median"], "gbps_max": r["gbps_max"],
                      "verified": r["verified"], "bytes": size,
                      "chosen": d.get("chosen_text")}))
EOF
}
show() {
    tail -n "${1:-100}" "$jl" | "$PY" -c "$(cat <<'EOF'
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    f = lambda k: "-" if r.get(k) is None else f"{r[k]:.2f}"
    extra = r.get("error") or r.get("skipped") or r.get("chosen") or ""
    line = (f"  ({r['part']}) {r['method']:<40} min {f('gbps_min')} median {f('gbps_median')} "
            f"max {f('gbps_max')} GB/s verified {r.get('verified')} {extra}")
    print(line[:300])
EOF
)"
}

if [ -x "$dir/gpu_load" ] && ! skip tests; then
    elapsed "### GPU tests (gpu_load: the chooser, --verify, bench storage without flags)"
    GDPATH_BIN="$g" timeout 90 "$dir/gpu_load" --ignored --test-threads=1 --nocapture 2>&1 \
        | tee "$out/gpu_load.log" | grep -E '^(test |gdpath load|bench storage|tmpfs half|test result)' || fail=1
    grep -q 'test result: ok' "$out/gpu_load.log" || fail=1
fi

if ! skip a; then
    elapsed "### (a) tmpfs -> GPU, 4 GiB: gdpath bench storage --gpu 0 with no flags"
    n0=$(wc -l < "$jl")
    rm -f /dev/shm/f4g
    timeout 60 "$g" bench storage --gpu 0 --file /dev/shm/f4g --size 4GiB --json \
        > "$out/a-gdpath.json" 2> "$out/a-gdpath.err" || { echo "gdpath bench: exit $?"; tail -3 "$out/a-gdpath.err"; fail=1; }
    rows2jsonl a gdpath "$out/a-gdpath.json"
    "$PY" -c 'import json,sys; print("  chosen:", json.load(open(sys.argv[1])).get("chosen_text"))' "$out/a-gdpath.json" 2>/dev/null
    elapsed "### (a) KvikIO POSIX sweep and pinned H2D"
    timeout 70 "$PY" "$base" kvikio /dev/shm/f4g --threads 16,32 --tasks 4,16 --runs 3 >> "$jl" 2> "$out/a-kvikio.err" || echo "kvikio: exit $? (see a-kvikio.err)"
    timeout 60 "$PY" "$base" pinned $((4 << 30)) --runs 5 >> "$jl" 2> "$out/a-pinned.err" || echo "pinned: exit $?"
    show $(( $(wc -l < "$jl") - n0 ))
    rm -f /dev/shm/f4g
fi

if ! skip b || ! skip c; then
    if [ ! -s "$CKPT" ]; then
        elapsed "### making $CKPT"
        timeout 90 "$PY" "$base" make "$CKPT" || { echo "make: exit $?"; fail=1; }
    fi
fi

if ! skip b; then
    elapsed "### (b) cold checkpoint from the root disk: gdpath load --cold --verify x$RUNS_COLD"
    n0=$(wc -l < "$jl")
    for i in $(seq "$RUNS_COLD"); do
        timeout 60 "$g" load "$CKPT" --cold --verify --json > "$out/b-gdpath-$i.json" 2> "$out/b-gdpath-$i.err" \
            || { echo "gdpath load --cold: exit $?"; tail -3 "$out/b-gdpath-$i.err"; fail=1; }
    done
    "$PY" - "$out" "$RUNS_COLD" >> "$jl" <<'EOF'
import json, statistics, sys
out, n = sys.argv[1], int(sys.argv[2])
docs = []
for i in range(1, n + 1):
    try:
        docs.append(json.load(open(f"{out}/b-gdpath-{i}.json")))
    except (OSError, json.JSONDecodeError):
        pass
g = [d["gbps"] for d in docs]
print(json.dumps({"part": "b", "method": "gdpath-load-cold", "gbps_min": min(g) if g else None,
                  "gbps_median": statistics.median(g) if g else None, "gbps_max": max(g) if g else None,
                  "runs": g, "verified": bool(docs) and all(d.get("verified") is True for d in docs),
                  "path": docs[-1]["path"] if docs else None,
                  "chosen": docs[-1].get("chosen_text") if docs else None}))
EOF
    elapsed "### (b) the loaders, cold (x$RUNS_COLD each)"
    KVIKIO_NTHREADS=32 KVIKIO_TASK_SIZE=$((16 << 20)) KVIKIO_COMPAT_MODE=ON \
        timeout 150 "$PY" "$base" loaders "$CKPT" --cold --runs "$RUNS_COLD" >> "$jl" 2> "$out/b-loaders.err" || echo "loaders: exit $? (see b-loaders.err)"
    timeout 30 "$PY" "$base" dd "$CKPT" --cold >> "$jl" 2> "$out/b-dd.err" || echo "dd: exit $?"
    show $(( $(wc -l < "$jl") - n0 ))
fi

if ! skip c; then
    elapsed "### (c) a fresh gdpath load process from tmpfs"
    n0=$(wc -l < "$jl")
    shm=/dev/shm/gdpath-ckpt/$(basename "$CKPT")
    mkdir -p "$(dirname "$shm")"
    [ "$(stat -c %s "$shm" 2>/dev/null)" = "$(stat -c %s "$CKPT")" ] || cp "$CKPT" "$shm"
    timeout 60 "$PY" "$base" fresh "$g" "$shm" --runs 3 >> "$jl" 2> "$out/c.err" || echo "fresh: exit $?"
    show $(( $(wc -l < "$jl") - n0 ))
    rm -f "$shm"
fi

if ! skip d; then
    elapsed "### (d) pageable H2D 1 / 16 / 256 MiB: gdpath, the driver, torch"
    n0=$(wc -l < "$jl")
    timeout 40 "$g" bench h2d --gpus 0 --sizes 1MiB,16MiB,256MiB --runs 20 --json > "$out/d-gdpath.json" 2> "$out/d-gdpath.err" \
        || { echo "bench h2d: exit $?"; fail=1; }
    rows2jsonl d gdpath "$out/d-gdpath.json"
    timeout 40 "$PY" "$here/torch_copy.py" --kinds h2d-pageable --sizes 1MiB,16MiB,256MiB --iters 20 2> "$out/d-torch.err" \
        | "$PY" -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    n = r["bytes"]
    print(json.dumps({"part": "d", "method": f"torch-pageable-h2d-{n >> 20}MiB", "gbps_min": r["gbps_min"],
                      "gbps_median": r["gbps_median"], "gbps_max": r["gbps_max"], "verified": r["verified"], "bytes": n}))
' >> "$jl"
    show $(( $(wc -l < "$jl") - n0 ))
fi

elapsed "### summary (targets of issue 24)"
"$PY" "$base" summary "$jl" | tee "$out/summary.txt"
grep -q '"verified": false' "$jl" && fail=1
elapsed "done"
[ $fail -eq 0 ] && echo "device-storage: all ran and verified" || echo "device-storage: FAILURES above" >&2
exit $fail
