#!/usr/bin/env python3
"""Checkpoint loaders side by side from Python (issue 23's benchmark): a Llama-shaped bf16
checkpoint (9.08 GB, 147 tensors; `--quick` for a small one) loaded into torch tensors on cuda:0
by `gdpath.safetensors.load_file`, `safetensors.torch.load_file`, fastsafetensors (nogds), Run:ai
Model Streamer and InstantTensor (default and buffered backends), from tmpfs and from the root
disk with the page cache dropped before each run, beside the pinned H2D rate of the same run and
`gdpath load` (the CLI, into one allocation) on the same file for the Python layer's cost.

Every run is verified: each tensor equal (torch.equal, on the GPU) to the reference that
safetensors loaded, names, dtypes and shapes included. GB/s = file bytes / wall time of the
call, 1e9 B/s, with `torch.cuda.synchronize()` on both sides; min / median / max over the runs,
which go in rounds (each loader once per round, in turn) so that drift falls on all alike.
CUDA is started in this process before any timing (no loader pays for the context), and each
loader's one-time setup that a serving process pays once is paid before the rounds: `--warmup`
(default 1) untimed loads of every loader at each place, their seconds reported with its row
(`warmup_s`), as `gdpath load` warms up before timing.

Each timed load starts `--settle` seconds (default 1) after the previous loader's tensors were
freed: the driver keeps working on a freed multi-GB allocation for a while, and a copy to the GPU
started meanwhile runs about 10 % slower (docs/benchmarks.md, "Measurements behind the
defaults"), a cost of the previous loader's clean-up, not of the next load.

Usage (H200 machine; the loaders' wheels carried, see docs/python.md):
    python3 bench/python_load.py [--quick] [--runs-tmpfs 3] [--runs-disk 2]
        [--gdpath-bin PATH] [--only NAME,...] [--warmup N] [--settle S] [--json OUT.json]
Files: /dev/shm/gdpath-ckpt/model.safetensors and $GDPATH_CKPT_DIR (default /root/gdpath-ckpt).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import torch

import peers
from peers import drop_cache

H, I, KV, V, LAYERS = 4096, 14336, 1024, 128256, 16  # 147 tensors, 9.08 GB in bf16


def shapes(quick: bool):
    """Name → shape of the Llama-shaped checkpoint (or a 1/8-width one with --quick)."""
    return peers.llama_shapes(*((H, I, KV, V, LAYERS) if not quick else (512, 1792, 128, 16032, 4)))


def make(path: str, quick: bool) -> None:
    from safetensors.torch import save_file

    g = torch.Generator(device="cuda:0").manual_seed(23)
    t = {k: torch.randn(*s, dtype=torch.bfloat16, device="cuda:0", generator=g).cpu()
         for k, s in shapes(quick).items()}
    save_file(t, path, metadata={"format": "pt"})


# The loaders, each returning {name: tensor on cuda:0} (bench/peers.py).
LOADERS = [
    ("gdpath.safetensors.load_file", peers.gdpath_load),
    ("safetensors.load_file", peers.safetensors_load),
    ("fastsafetensors nogds", peers.fastsafetensors_load),
    ("runai-model-streamer", peers.runai_load),
    ("instanttensor default", peers.instanttensor_load),
    ("instanttensor BUFFERED", peers.instanttensor_buffered_load),
]


def stats(gbps):
    g = sorted(gbps)
    return {"min": round(g[0], 2), "median": round(statistics.median(g), 2), "max": round(g[-1], 2)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a 1/8-width checkpoint (smoke test)")
    ap.add_argument("--runs-tmpfs", type=int, default=3)
    ap.add_argument("--runs-disk", type=int, default=2)
    ap.add_argument("--gdpath-bin", default=os.environ.get("GDPATH"), help="the gdpath CLI, for `gdpath load`")
    ap.add_argument("--only", default="", help="comma-separated loader names (substrings)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed loads of each loader at each place before the timed rounds")
    ap.add_argument("--settle", type=float, default=1.0,
                    help="seconds between freeing one load's tensors and timing the next")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    torch.zeros(1, device="cuda:0")
    torch.cuda.synchronize()
    tag = "quick" if a.quick else "llama"
    shm = f"/dev/shm/gdpath-ckpt/{tag}.safetensors"
    disk = os.path.join(os.environ.get("GDPATH_CKPT_DIR", "/root/gdpath-ckpt"), f"{tag}.safetensors")
    for p in (shm, disk):
        os.makedirs(os.path.dirname(p), exist_ok=True)
    if not os.path.exists(disk):
        t0 = time.perf_counter()
        make(disk, a.quick)
        print(f"wrote {disk} in {time.perf_counter() - t0:.1f} s", flush=True)
    if not os.path.exists(shm) or os.path.getsize(shm) != os.path.getsize(disk):
        shutil.copy(disk, shm)
    nb = os.path.getsize(disk)

    ref = peers.safetensors_load(shm)
    print(f"checkpoint: {nb} bytes, {len(ref)} tensors (reference loaded by safetensors)", flush=True)

    def verified(d) -> bool:
        if set(d) != set(ref):
            return False
        return all(d[k].dtype == ref[k].dtype and d[k].shape == ref[k].shape
                   and d[k].device == ref[k].device and torch.equal(d[k], ref[k]) for k in ref)

    res = {"bytes": nb, "tensors": len(ref), "torch": torch.__version__, "settle_s": a.settle,
           "rows": {}}

    # The pinned H2D rate of this run: 4 GiB (or the checkpoint, if smaller) pinned → GPU.
    n = min(4 << 30, nb)
    src = torch.empty(n, dtype=torch.uint8).pin_memory()
    dst = torch.empty(n, dtype=torch.uint8, device="cuda:0")
    g = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        g.append(n / (time.perf_counter() - t0) / 1e9)
    res["pinned_h2d_gbps"] = stats(g[1:])
    del src, dst
    print("pinned H2D", res["pinned_h2d_gbps"], "GB/s", flush=True)

    if not a.only or "gdpath" in a.only:
        import gdpath

        res["gdpath_backends"] = gdpath.default_agent().backends
        print(f"gdpath backends {res['gdpath_backends']}", flush=True)

    for path, cold, runs in ((shm, False, a.runs_tmpfs), (disk, True, a.runs_disk)):
        where = "disk cold" if cold else "tmpfs"
        if runs <= 0:  # --runs-disk 0: that place is skipped
            continue
        # Rounds: every loader once per round, in turn, so that the machine's drift (other
        # tenants, the page cache's state) falls on all of them alike; the order rotates.
        chosen = [(n, fn) for n, fn in LOADERS if not a.only or any(o in n for o in a.only.split(","))]
        acc = {n: {"gbps": [], "ok": True, "how": None, "error": None} for n, _ in chosen}
        if not chosen:  # --only matched no loader
            continue
        # One-time setup a serving process pays once (gdpath's agent and its pinned slabs or
        # bounce buffers, the other loaders' thread pools and buffers): untimed loads of each
        # loader at this place before the rounds.
        for name, fn in chosen:
            for _ in range(a.warmup):
                try:
                    # Cold, as its timed runs will meet the file (gdpath's chooser then
                    # makes the agent of its cold settings).
                    if cold:
                        drop_cache(path)
                    t0 = time.perf_counter()
                    d = fn(path)
                    torch.cuda.synchronize()
                    acc[name].setdefault("warmup_s", []).append(round(time.perf_counter() - t0, 3))
                    del d
                except Exception as e:  # reported with the loader's row
                    acc[name]["error"] = repr(e)[:300]
                torch.cuda.empty_cache()
        for rnd in range(runs):
            # Each round starts one loader later: none is always first after a cache drop.
            k = rnd % len(chosen)
            for name, fn in chosen[k:] + chosen[:k]:
                r = acc[name]
                if r["error"]:
                    continue
                d = None
                try:
                    if cold:
                        r["how"] = drop_cache(path)
                    torch.cuda.synchronize()
                    time.sleep(a.settle)
                    t0 = time.perf_counter()
                    d = fn(path)
                    torch.cuda.synchronize()
                    r["gbps"].append(nb / (time.perf_counter() - t0) / 1e9)
                    r["ok"] = r["ok"] and verified(d)
                except Exception as e:  # a loader missing or failing is reported, not fatal
                    r["error"] = repr(e)[:300]
                finally:
                    # The next loader starts from the same (empty) allocator cache either way.
                    del d
                    torch.cuda.empty_cache()
        for name, _ in chosen:
            r, key = acc[name], f"{where} | {name}"
            row = {}
            if r["gbps"]:  # rounds before a failure still count, beside the error
                row = {**stats(r["gbps"]), "runs": [round(x, 2) for x in r["gbps"]],
                       "verified": r["ok"], **({"cache": r["how"]} if r["how"] else {})}
            if r.get("warmup_s"):
                row["warmup_s"] = r["warmup_s"]
            if r["error"]:
                row["error"] = r["error"]
            res["rows"][key] = row
            print(key, res["rows"][key], flush=True)
        if a.gdpath_bin:
            cmd = [a.gdpath_bin, "load", path, "--repeat", str(max(runs, 2)), "--json"] + (["--cold"] if cold else [])
            q = subprocess.run(cmd, capture_output=True, text=True)
            try:
                doc = json.loads(q.stdout)
                res["rows"][f"{where} | gdpath load (CLI, last of {max(runs, 2)})"] = {
                    "gbps": round(doc["gbps"], 2), "path": doc["path"], "finding": doc["finding"]}
            except (json.JSONDecodeError, KeyError):
                res["rows"][f"{where} | gdpath load (CLI)"] = {"error": (q.stderr or q.stdout)[-300:]}
            print(f"{where} | gdpath load", res["rows"].get(f"{where} | gdpath load (CLI, last of {max(runs, 2)})")
                  or res["rows"].get(f"{where} | gdpath load (CLI)"), flush=True)

    text = json.dumps(res, indent=1)
    print(text)
    out = a.json or (os.path.join(os.environ["OUT"], "python_load.json") if os.environ.get("OUT") else None)
    if out:
        with open(out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
