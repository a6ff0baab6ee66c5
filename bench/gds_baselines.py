#!/usr/bin/env python3
"""File -> GPU baselines for gdpath's GDS paths (issue 5), one JSON object per line.

Methods (GB/s = 1e9 B/s, GPU 0, the whole file):
  torch-read-cuda      f.read() into bytes, torch.frombuffer(...).cuda()
  torch-readinto-pinned f.readinto() a pinned uint8 tensor (allocated before timing), then
                        .copy_(non_blocking) to a preallocated GPU tensor, synchronized
  kvikio-posix-tN      KvikIO CuFile.read in POSIX (compat) mode, N threads, 4 MiB tasks
                        (each N in its own process: KvikIO reads KVIKIO_* at import)
  pinned-h2d           1 GiB pinned -> GPU copy (cudaMemcpyAsync), best of runs
  safetensors-load     safetensors.torch.load_file(path, device="cuda:0")
  dd-direct            dd if=FILE of=/dev/null bs=4M iflag=direct (the disk's O_DIRECT limit)
fio is not on the device image; it is skipped there and said so.

Usage:
  gds_baselines.py gen PATH SIZE            write a safetensors file of SIZE bytes (F16 tensors)
  gds_baselines.py run PATH [--runs N] [--cold] [--methods a,b] [--threads 1,8,16]
--cold drops the file's pages (posix_fadvise DONTNEED) before every run.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import time

import peers

GB = 1e9


def drop(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def emit(method, path, size, runs, **extra):
    med = sorted(runs)[len(runs) // 2] if runs else None
    print(json.dumps({"method": method, "file": path, "bytes": size, "gbps_runs": runs,
                      "gbps_median": med, "gbps_max": max(runs) if runs else None, **extra}),
          flush=True)


def gen(path, size):
    """F16 tensors of 16 MiB ([8192, 1024]); the header padded to 8 bytes as writers do."""
    tensor = 16 << 20
    n = max(1, size // tensor)
    header = {"__metadata__": {"format": "pt", "generator": "gdpath gds_baselines.py"}}
    for i in range(n):
        header[f"layer.{i}.weight"] = {"dtype": "F16", "shape": [8192, 1024],
                                       "data_offsets": [i * tensor, (i + 1) * tensor]}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    block = os.urandom(tensor)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for i in range(n):
            # Distinct tensors: the index in the first 8 bytes.
            f.write(struct.pack("<Q", i) + block[8:])
        f.flush()
        os.fsync(f.fileno())
    print(json.dumps({"generated": path, "tensors": n, "bytes": os.path.getsize(path)}), flush=True)


def timed(fn, runs, path, cold):
    out = []
    for _ in range(runs):
        if cold:
            drop(path)
        t = time.perf_counter()
        fn()
        out.append(os.path.getsize(path) / (time.perf_counter() - t) / GB)
    return out


def run_torch(path, runs, cold, methods):
    import torch
    size = os.path.getsize(path)
    dev = torch.device("cuda:0")
    torch.cuda.init()
    if "torch-read-cuda" in methods:
        def f():
            with open(path, "rb") as fh:
                b = fh.read()
            torch.frombuffer(bytearray(b), dtype=torch.uint8).to(dev)
            torch.cuda.synchronize()
        emit("torch-read-cuda", path, size, timed(f, max(1, runs // 3), path, cold))
    if "torch-readinto-pinned" in methods:
        pinned = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        gpu = torch.empty(size, dtype=torch.uint8, device=dev)
        mv = memoryview(pinned.numpy())

        def f():
            with open(path, "rb", buffering=0) as fh:
                fh.readinto(mv)
            gpu.copy_(pinned, non_blocking=True)
            torch.cuda.synchronize()
        emit("torch-readinto-pinned", path, size, timed(f, runs, path, cold),
             note="pinned and GPU buffers allocated before timing")
        del pinned, gpu
    if "pinned-h2d" in methods:
        n = 1 << 30
        h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        g = torch.empty(n, dtype=torch.uint8, device=dev)
        g.copy_(h, non_blocking=True)
        torch.cuda.synchronize()
        out = []
        for _ in range(max(3, runs)):
            t = time.perf_counter()
            g.copy_(h, non_blocking=True)
            torch.cuda.synchronize()
            out.append(n / (time.perf_counter() - t) / GB)
        emit("pinned-h2d", None, n, out)
        del h, g
    if "safetensors-load" in methods:
        def f():
            t = peers.safetensors_load(path)
            torch.cuda.synchronize()
            del t
        emit("safetensors-load", path, size, timed(f, runs, path, cold))


def run_kvikio_child(path, runs, cold, threads):
    import cupy
    size = os.path.getsize(path)
    buf = cupy.empty(size, dtype=cupy.uint8)
    compat = peers.kvikio_compat_mode()

    def f():
        n = peers.kvikio_read(path, buf)
        assert n == size, (n, size)
    emit(f"kvikio-posix-t{threads}", path, size, timed(f, runs, path, cold),
         threads=threads, task_size=4 << 20, compat_mode=compat)


def run_dd(path, cold):
    if cold:
        drop(path)
    size = os.path.getsize(path)
    t = time.perf_counter()
    r = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=4M", "iflag=direct"],
                       capture_output=True, text=True)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        emit("dd-direct", path, size, [], error=r.stderr.strip()[-300:])
    else:
        emit("dd-direct", path, size, [size / dt / GB], dd=r.stderr.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("path")
    g.add_argument("size", type=int)
    r = sub.add_parser("run")
    r.add_argument("path")
    r.add_argument("--runs", type=int, default=3)
    r.add_argument("--cold", action="store_true")
    r.add_argument("--methods", default="torch-read-cuda,torch-readinto-pinned,kvikio,pinned-h2d,safetensors-load,dd-direct")
    r.add_argument("--threads", default="1,8,16")
    r.add_argument("--kvikio-child", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.cmd == "gen":
        return gen(a.path, a.size)
    if a.kvikio_child:
        return run_kvikio_child(a.path, a.runs, a.cold, a.kvikio_child)
    methods = set(a.methods.split(","))
    if methods & {"torch-read-cuda", "torch-readinto-pinned", "pinned-h2d", "safetensors-load"}:
        run_torch(a.path, a.runs, a.cold, methods)
    if "kvikio" in methods:
        for t in [int(x) for x in a.threads.split(",")]:
            env = peers.kvikio_env(t, 4 << 20)
            args = [sys.executable, __file__, "run", a.path, "--runs", str(a.runs),
                    "--kvikio-child", str(t)] + (["--cold"] if a.cold else [])
            p = subprocess.run(args, env=env, capture_output=True, text=True)
            sys.stdout.write(p.stdout)
            if p.returncode != 0:
                emit(f"kvikio-posix-t{t}", a.path, os.path.getsize(a.path), [],
                     error=p.stderr.strip()[-500:])
    if "dd-direct" in methods:
        run_dd(a.path, a.cold)
    if "fio" in methods or shutil.which("fio") is None:
        print(json.dumps({"method": "fio", "skipped": "fio is not installed on this machine"}), flush=True)


if __name__ == "__main__":
    main()
