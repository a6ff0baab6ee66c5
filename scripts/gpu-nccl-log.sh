#!/usr/bin/env bash
# GPU machine: a real NCCL log from PyTorch (one rank, nccl backend, one all_reduce) read by
# `gdpath nccl`. Needs python3 with torch ($PYTHON, default python3) and a `gdpath` binary
# ($GDPATH_BIN, as gpu-suite.sh, which runs this last; default: on PATH). No network: the one
# rank's rendezvous is on 127.0.0.1. Runs from any folder (the suite folder has no checkout).
# Writes $OUT/nccl/nccl.<host>.<pid>.log, $OUT/nccl/explain.json and explain.txt; exits non-zero
# when the log has no NCCL version or init line, or the parser fails.
set -euo pipefail
out="${OUT:-/tmp}/nccl"
mkdir -p "$out"
rm -f "$out"/nccl.*.log
gdpath="${GDPATH_BIN:-gdpath}"
py="${PYTHON:-python3}"
if ! command -v "$gdpath" >/dev/null; then
    echo "gpu-nccl-log: no gdpath binary at '$gdpath' (set GDPATH_BIN)" >&2
    exit 2
fi
if ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu-nccl-log: SKIP: no torch with CUDA in $py" >&2
    exit 0
fi
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,NET,P2P,SHM,ENV NCCL_DEBUG_FILE="$out/nccl.%h.%p.log" \
MASTER_ADDR=127.0.0.1 MASTER_PORT=29577 "$py" - <<'PY'
import torch, torch.distributed as dist
dist.init_process_group("nccl", rank=0, world_size=1)
t = torch.ones(1 << 20, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
assert t[0].item() == 1.0
dist.destroy_process_group()
PY
logs=("$out"/nccl.*.log)
grep -q "NCCL version" "${logs[@]}"
"$gdpath" nccl "${logs[@]}" --json > "$out/explain.json"
"$gdpath" nccl "${logs[@]}" --verbose > "$out/explain.txt"
"$py" - "$out/explain.json" <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))
assert e["schema"] == "gdpath.nccl/2"
assert e["job"]["version"], "the parser found no NCCL version"
assert 0 in {int(r) for r in e["job"]["ranks"]}, "rank 0's init line was not read"
print("ok:", e["job"]["version"], "findings:", [f["id"] for f in e["findings"]])
PY
