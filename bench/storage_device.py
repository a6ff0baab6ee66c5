#!/usr/bin/env python3
"""Baselines of bench/device-storage.sh (issue 24), one JSON object per line on stdout, each
with `part`, `method`, `gbps_min` / `gbps_median` / `gbps_max` (1e9 B/s, over the runs),
`runs` and `verified` (the bytes that arrived equal the file's; a row that could not run has
`error` or `skipped` instead).

Subcommands:
  kvikio FILE [--threads 16,32] [--tasks 4,16] [--runs 3] [--cold]
      KvikIO CuFile.read of the whole FILE into one GPU buffer in POSIX (compat) mode, one child
      process per (threads, task MiB) since KvikIO reads KVIKIO_* at import; verified once per
      configuration against the file read with numpy.
  pinned BYTES [--runs 5]
      torch pinned host -> GPU copy of BYTES (the link's limit in this run), verified.
  make PATH
      a Llama-shaped bf16 safetensors checkpoint (9.08 GB, python_load.py's shapes).
  loaders CKPT [--runs 2] [--cold]
      Run:ai Model Streamer, InstantTensor (default and BUFFERED), fastsafetensors (nogds) and
      KvikIO (32 threads x 16 MiB) loading CKPT onto cuda:0, each verified tensor by tensor
      (torch.equal) against safetensors' load of the same file; --cold drops the page cache
      before every run (drop_caches as root, else posix_fadvise DONTNEED).
  dd FILE [--cold]
      dd if=FILE of=/dev/null bs=16M iflag=direct, and fio (when installed) of the same file.
  fresh GDPATH FILE [--runs 3]
      wall time of a fresh `gdpath load FILE` process (start included), then one --verify run.
  summary JSONL
      the ratios the issue's targets name, from the rows of a run.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import peers
from peers import drop_cache, kvikio_compat_mode, kvikio_env, kvikio_read

GB = 1e9


def stats(g):
    if not g:
        return {"gbps_min": None, "gbps_median": None, "gbps_max": None}
    return {"gbps_min": round(min(g), 3), "gbps_median": round(statistics.median(g), 3),
            "gbps_max": round(max(g), 3)}


def emit(part, method, runs, verified, **extra):
    print(json.dumps({"part": part, "method": method, **stats(runs),
                      "runs": [round(x, 3) for x in runs], "verified": verified, **extra}),
          flush=True)


# --- (a) KvikIO POSIX and pinned H2D --------------------------------------------------------

def kvikio_child(path, runs, cold, threads, task):
    import cupy
    import numpy as np

    size = os.path.getsize(path)
    buf = cupy.empty(size, dtype=cupy.uint8)
    g = []
    for i in range(runs + 1):
        if cold:
            drop_cache(path)
        t = time.perf_counter()
        n = kvikio_read(path, buf)
        dt = time.perf_counter() - t
        assert n == size, (n, size)
        if i > 0:  # the first run is a warm-up (KvikIO's thread pool, bounce buffers)
            g.append(size / dt / GB)
    ref = cupy.asarray(np.fromfile(path, dtype=np.uint8))
    ok = bool(cupy.array_equal(ref, buf))
    compat = kvikio_compat_mode()
    emit("a" if not cold else "b", f"kvikio-posix-t{threads}-{task}MiB", g, ok, file=path,
         bytes=size, threads=threads, task_bytes=task << 20, compat_mode=compat, cold=cold)


def kvikio(a):
    for t in [int(x) for x in a.threads.split(",")]:
        for task in [int(x) for x in a.tasks.split(",")]:
            env = kvikio_env(t, task << 20)
            args = [sys.executable, __file__, "kvikio-child", a.file, "--runs", str(a.runs),
                    "--threads", str(t), "--tasks", str(task)] + (["--cold"] if a.cold else [])
            p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
            sys.stdout.write(p.stdout)
            if p.returncode != 0:
                part, m = "a" if not a.cold else "b", f"kvikio-posix-t{t}-{task}MiB"
                if "ModuleNotFoundError" in p.stderr:
                    print(json.dumps({"part": part, "method": m, "skipped": "kvikio or cupy does not import"}), flush=True)
                else:
                    emit(part, m, [], False, error=p.stderr.strip()[-400:])


def pinned(a):
    import torch

    n = a.bytes
    # A random MiB repeated with a per-MiB offset: position-dependent data without generating
    # gigabytes of random numbers on one core.
    mib = 1 << 20
    rows = n // mib
    src = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    v = src[: rows * mib].view(rows, mib)
    v.copy_(torch.randint(0, 256, (1, mib), dtype=torch.uint8).expand(rows, mib))
    v.add_((torch.arange(rows) % 256).to(torch.uint8).unsqueeze(1))
    src[rows * mib:] = 1
    dst = torch.empty(n, dtype=torch.uint8, device="cuda:0")
    g = []
    for i in range(a.runs + 1):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        if i > 0:
            g.append(n / (time.perf_counter() - t) / GB)
    ok = bool(torch.equal(dst.cpu(), src))
    emit("a", "torch-pinned-h2d", g, ok, bytes=n)


# --- (b) checkpoint loaders, cold from the disk ---------------------------------------------

# KvikIO reads 32 threads x 16 MiB here: device-storage.sh sets KVIKIO_* for this process.
LOADERS = [
    ("runai-model-streamer", lambda p: peers.runai_load(p, clone=True)),
    ("instanttensor-default", peers.instanttensor_load),
    ("instanttensor-buffered", peers.instanttensor_buffered_load),
    ("fastsafetensors-nogds", peers.fastsafetensors_load),
    ("kvikio-posix-t32-16MiB", peers.kvikio_load),
]


def loaders(a):
    import torch

    torch.zeros(1, device="cuda:0")
    nb = os.path.getsize(a.ckpt)
    ref = peers.safetensors_load(a.ckpt)
    os.environ.setdefault("KVIKIO_COMPAT_MODE", "ON")

    def same(d):
        return set(d) == set(ref) and all(
            d[k].dtype == ref[k].dtype and tuple(d[k].shape) == tuple(ref[k].shape)
            and torch.equal(d[k], ref[k]) for k in ref)

    for name, fn in LOADERS:
        if a.only and name not in a.only.split(","):
            continue
        try:
            g, ok, how = [], True, None
            for _ in range(a.runs):
                if a.cold:
                    how = drop_cache(a.ckpt)
                torch.cuda.synchronize()
                t = time.perf_counter()
                d = fn(a.ckpt)
                torch.cuda.synchronize()
                g.append(nb / (time.perf_counter() - t) / GB)
                ok = ok and same(d)
                del d
                torch.cuda.empty_cache()
            emit("b" if a.cold else "b-warm", name, g, ok, bytes=nb, cache=how)
        except ImportError as e:  # its wheel is not there: said, not a failure
            print(json.dumps({"part": "b", "method": name, "skipped": f"does not import: {e}"}),
                  flush=True)
        except Exception as e:  # a loader missing or failing is a row, not the end
            emit("b" if a.cold else "b-warm", name, [], False, error=repr(e)[:300])


def dd(a):
    size = os.path.getsize(a.file)
    how = drop_cache(a.file) if a.cold else None
    t = time.perf_counter()
    r = subprocess.run(["dd", f"if={a.file}", "of=/dev/null", "bs=16M", "iflag=direct"],
                       capture_output=True, text=True)
    dt = time.perf_counter() - t
    # dd reads bytes without a destination to compare: the file is its own reference.
    if r.returncode != 0:
        emit("b", "dd-direct-16M", [], False, error=r.stderr.strip()[-300:])
    else:
        emit("b", "dd-direct-16M", [size / dt / GB], True, bytes=size, cache=how,
             note="reads to /dev/null: nothing to compare; the limit the targets name")
    if shutil.which("fio") is None:
        print(json.dumps({"part": "b", "method": "fio", "skipped": "fio is not installed"}), flush=True)
        return
    how = drop_cache(a.file) if a.cold else None
    r = subprocess.run(["fio", "--name=seq", f"--filename={a.file}", "--rw=read", "--bs=16M",
                        "--direct=1", "--ioengine=io_uring", "--iodepth=16", "--numjobs=1",
                        "--output-format=json"], capture_output=True, text=True)
    try:
        job = json.loads(r.stdout)["jobs"][0]["read"]
        emit("b", "fio-io_uring-qd16-16M", [job["bw_bytes"] / GB], True, bytes=job["io_bytes"],
             cache=how, note="reads to no buffer compared: the limit the targets name")
    except (json.JSONDecodeError, KeyError, IndexError):
        emit("b", "fio-io_uring-qd16-16M", [], False, error=(r.stderr or r.stdout)[-300:])


# --- (c) a fresh `gdpath load` process -------------------------------------------------------

def fresh(a):
    nb = os.path.getsize(a.file)
    g, start, transfer, chosen = [], [], [], None
    for _ in range(a.runs):
        t = time.perf_counter()
        q = subprocess.run([a.gdpath, "load", a.file, "--json"], capture_output=True, text=True)
        dt = time.perf_counter() - t
        if q.returncode != 0:
            emit("c", "gdpath-load-fresh-process", [], False, error=q.stderr[-300:])
            return
        doc = json.loads(q.stdout)
        g.append(doc["tensor_bytes"] / dt / GB)
        start.append(doc["start_s"])
        transfer.append(doc["transfer_s"])
        chosen = doc.get("chosen_text")
    q = subprocess.run([a.gdpath, "load", a.file, "--verify", "--json"], capture_output=True, text=True)
    ok = q.returncode == 0 and json.loads(q.stdout).get("verified") is True
    emit("c", "gdpath-load-fresh-process", g, ok, bytes=nb, start_s=start, transfer_s=transfer,
         chosen=chosen, note="wall of the whole process (exec, CUDA context, load); verified by "
         "one more --verify run")


# --- summary ----------------------------------------------------------------------------------

def summary(a):
    rows = []
    for line in open(a.jsonl):
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass

    def med(r):
        return r.get("gbps_median") or 0.0

    def best(part, pred):
        c = [r for r in rows if r.get("part") == part and pred(r["method"]) and med(r) > 0]
        return max(c, key=med) if c else None

    def ratio(what, ours, theirs, target):
        if ours is None or theirs is None or med(theirs) == 0:
            print(f"{what}: not measured (ours {ours and ours['method']}, theirs "
                  f"{theirs and theirs['method']})")
            return
        x = med(ours) / med(theirs)
        mark = "meets" if x >= target else "BELOW"
        print(f"{what}: {med(ours):.2f} / {med(theirs):.2f} GB/s ({theirs['method']}) = {x:.3f}x "
              f"({mark} the {target}x target)")

    ours_a = best("a", lambda m: m.startswith("gdpath"))
    ratio("(a) tmpfs -> GPU, no flags, vs KvikIO's best", ours_a,
          best("a", lambda m: m.startswith("kvikio")), 1.0)
    ratio("(a) tmpfs -> GPU, no flags, vs pinned H2D", ours_a,
          best("a", lambda m: m == "torch-pinned-h2d"), 0.9)
    ours_b = best("b", lambda m: m.startswith("gdpath"))
    ratio("(b) cold checkpoint vs the best of Run:ai / InstantTensor / KvikIO", ours_b,
          best("b", lambda m: m.startswith(("runai", "instanttensor", "kvikio"))), 1.0)
    ratio("(b) cold checkpoint vs dd/fio", ours_b,
          best("b", lambda m: m.startswith(("dd", "fio"))), 0.95)
    c = best("c", lambda m: True)
    if c:
        mark = "meets" if med(c) >= 25 else "BELOW"
        print(f"(c) fresh-process gdpath load from tmpfs: {med(c):.2f} GB/s wall ({mark} the 25 "
              f"GB/s target); start {c.get('start_s')} s, transfer {c.get('transfer_s')} s")
    for size in ("1MiB", "16MiB", "256MiB"):
        ours = best("d", lambda m, s=size: m == f"gdpath-pageable-h2d-{s}")
        theirs = best("d", lambda m, s=size: m == f"torch-pageable-h2d-{s}")
        ratio(f"(d) pageable H2D {size}: gdpath vs torch", ours, theirs, 1.0)
    bad = [r["method"] for r in rows if r.get("verified") is False]
    print("unverified or failed rows:", ", ".join(bad) if bad else "none")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("kvikio", "kvikio-child"):
        k = sub.add_parser(name)
        k.add_argument("file")
        k.add_argument("--threads", default="16,32")
        k.add_argument("--tasks", default="4,16")
        k.add_argument("--runs", type=int, default=3)
        k.add_argument("--cold", action="store_true")
    p = sub.add_parser("pinned")
    p.add_argument("bytes", type=int)
    p.add_argument("--runs", type=int, default=5)
    m = sub.add_parser("make")
    m.add_argument("path")
    lo = sub.add_parser("loaders")
    lo.add_argument("ckpt")
    lo.add_argument("--runs", type=int, default=2)
    lo.add_argument("--cold", action="store_true")
    lo.add_argument("--only", default="")
    d = sub.add_parser("dd")
    d.add_argument("file")
    d.add_argument("--cold", action="store_true")
    f = sub.add_parser("fresh")
    f.add_argument("gdpath")
    f.add_argument("file")
    f.add_argument("--runs", type=int, default=3)
    s = sub.add_parser("summary")
    s.add_argument("jsonl")
    a = ap.parse_args()
    if a.cmd == "kvikio-child":
        return kvikio_child(a.file, a.runs, a.cold, int(a.threads), int(a.tasks))
    if a.cmd == "make":
        from python_load import make  # beside this script, as peers is

        os.makedirs(os.path.dirname(os.path.abspath(a.path)), exist_ok=True)
        t = time.perf_counter()
        make(a.path, False)
        fd = os.open(a.path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        print(json.dumps({"made": a.path, "bytes": os.path.getsize(a.path),
                          "seconds": round(time.perf_counter() - t, 1)}), flush=True)
        return 0
    return {"kvikio": kvikio, "pinned": pinned, "loaders": loaders, "dd": dd, "fresh": fresh,
            "summary": summary}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main() or 0)
