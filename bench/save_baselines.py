#!/usr/bin/env python3
"""Checkpoint savers side by side (issue 24's save benchmark): bf16 GPU tensors (default 4 GiB,
`--size`) saved as a safetensors file on cuda:0's machine, to tmpfs and to the root disk, by
`gdpath resave` (the CLI: one GPU allocation loaded, saved back through `checkpoint::save`),
`gdpath.safetensors.save_file` (the same tensors as separate torch tensors, where gdpath
imports), `safetensors.torch.save_file`, fastsafetensors' `ParallelSaver` (one file, and its
default 16 shards, where its wheel imports), beside the file system's own sequential write
limit of the same size: `dd` (O_DIRECT where the file system allows it, else buffered) and
`fio` (1 and 8 writers of one file) where installed.

fsync is in every timing: gdpath syncs the file and its directory; after `safetensors` and
`dd` the script syncs the file and directory inside the timed region (`conv=fsync` for dd);
fastsafetensors with `fsync=True`; fio with `end_fsync=1`. GB/s = file bytes / wall time,
1e9 B/s, min / median / max over the runs; the ratios are of medians. Every saver's last file
is verified: each tensor read back (safetensors, on the CPU) equal to the GPU tensor's bytes.

Usage (H200 machine):
    python3 bench/save_baselines.py --gdpath-bin PATH [--size 4GiB] [--runs 3]
        [--disk-runs 2] [--dirs /dev/shm,$PWD] [--only NAME,...]
        [--json OUT.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch


def size_arg(text: str) -> int:
    units = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
             "g": 1 << 30, "gib": 1 << 30, "gb": 10**9, "mb": 10**6}
    t = text.strip().lower()
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    return int(float(num) * units[t[len(num):]])


def make_tensors(total: int):
    """bf16 tensors on cuda:0 totalling about `total` bytes: 256 MiB matrices (the size of a
    Llama MLP weight) plus a few small norms, as a checkpoint has."""
    g = torch.Generator(device="cuda:0").manual_seed(24)
    out = {}
    big = 256 << 20
    n = max(1, total // big)
    for i in range(n):
        out[f"model.layers.{i}.mlp.weight"] = torch.randn(
            big // 2 // 4096, 4096, dtype=torch.bfloat16, device="cuda:0", generator=g)
        out[f"model.layers.{i}.norm.weight"] = torch.randn(
            4096, dtype=torch.bfloat16, device="cuda:0", generator=g)
    torch.cuda.synchronize()
    return out


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    d = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(d)
    finally:
        os.close(d)


def file_bytes(paths) -> int:
    return sum(os.path.getsize(p) for p in paths)


def verify(paths, cpu) -> bool:
    """Every tensor of `cpu` (the GPU tensors' CPU copies) read back from the files
    (safetensors on the CPU) with equal bytes, and no other tensor in them."""
    from safetensors import safe_open

    seen = set()
    for p in paths:
        with safe_open(p, framework="pt", device="cpu") as f:
            for k in f.keys():
                got = f.get_tensor(k)
                want = cpu.get(k)
                if want is None:
                    return False
                if got.dtype != want.dtype or got.shape != want.shape:
                    return False
                if not torch.equal(got.view(torch.int16), want.view(torch.int16)):
                    return False
                seen.add(k)
    return seen == set(cpu)


def remove(paths) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def row(name, where, runs, nbytes, verified, note=None):
    gbps = sorted(nbytes / 1e9 / t for t in runs)
    r = {"saver": name, "dir": where, "bytes": nbytes, "runs": len(runs),
         "gbps_min": gbps[0], "gbps_median": statistics.median(gbps), "gbps_max": gbps[-1],
         "seconds": runs, "verified": verified, "note": note}
    print(f"  {name:<34} {gbps[0]:7.2f} / {statistics.median(gbps):7.2f} / {gbps[-1]:7.2f} GB/s"
          f"  verified {verified}" + (f"  ({note})" if note else ""), flush=True)
    return r


def bench_dir(d, tensors, cpu, nbytes, runs, args, src, rows):
    print(f"### {d} ({runs} runs; min / median / max, fsync included)", flush=True)
    os.makedirs(d, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    want = lambda n: only is None or n in only  # noqa: E731

    target = os.path.join(d, "model.safetensors")
    if want("safetensors"):
        from safetensors.torch import save_file

        ts = []
        for _ in range(runs):
            remove([target])
            t = time.perf_counter()
            save_file(tensors, target, metadata={"format": "pt"})
            fsync_path(target)
            ts.append(time.perf_counter() - t)
        rows.append(row("safetensors.torch.save_file", d, ts, file_bytes([target]),
                        verify([target], cpu)))
        remove([target])

    if want("gdpath-resave") and args.gdpath_bin:
        out = subprocess.run(
            [args.gdpath_bin, "resave", src, target, "--gpu", "0", "--overwrite",
             "--repeat", str(runs), "--json"], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"  gdpath resave failed ({out.returncode}): {out.stderr.strip()[-400:]}")
            rows.append({"saver": "gdpath resave", "dir": d, "verified": False,
                         "note": f"exit {out.returncode}"})
        else:
            doc = json.loads(out.stdout)
            ts = [r["report"]["elapsed"] for r in doc["runs"]]
            note = f"path {','.join(doc['paths'])}; gdpath verified {doc['verified']}"
            f = doc["runs"][-1]["report"]["finding"]
            if f:
                note += f"; finding {f}"
            rows.append(row("gdpath resave (one GPU allocation)", d, ts,
                            doc["runs"][-1]["report"]["file_bytes"],
                            doc["verified"] and verify([target], cpu), note))
        remove([target])

    if want("gdpath-save_file"):
        try:
            import gdpath.safetensors as gst
        except ImportError as e:
            print(f"  gdpath.safetensors.save_file: skipped ({e})")
        else:
            ts, paths = [], set()
            try:
                # The agent and the staged path's buffers set up once, as in a serving process.
                gst.save_file({"w": next(iter(tensors.values()))[:16]}, target)
                for _ in range(runs):
                    t = time.perf_counter()
                    r = gst.save_file(tensors, target, metadata={"format": "pt"})
                    ts.append(time.perf_counter() - t)
                    paths.update(r["paths"])
                note = f"paths {','.join(sorted(paths))}" + (f"; finding {r['finding']}" if r["finding"] else "")
                rows.append(row("gdpath.safetensors.save_file", d, ts, file_bytes([target]),
                                verify([target], cpu), note))
            except Exception as e:
                print(f"  gdpath.safetensors.save_file: failed ({type(e).__name__}: {e})")
                rows.append({"saver": "gdpath.safetensors.save_file", "dir": d, "verified": False,
                             "note": f"failed: {e}"})
            remove([target])

    if want("fastsafetensors"):
        try:
            from fastsafetensors import ParallelSaver
        except Exception as e:  # a wheel that does not import here says why
            print(f"  fastsafetensors: skipped ({type(e).__name__}: {e})")
        else:
            for shards in (1, 16):
                base = os.path.join(d, "fst")
                ts, paths = [], []
                saver = ParallelSaver(num_shards=shards, fsync=True, num_threads=16)
                try:
                    for _ in range(runs):
                        remove(paths)
                        t = time.perf_counter()
                        paths = saver.save(tensors, base, metadata={"format": "pt"})
                        ts.append(time.perf_counter() - t)
                    rows.append(row(f"fastsafetensors ParallelSaver x{shards}", d, ts,
                                    file_bytes(paths), verify(paths, cpu),
                                    f"{shards} file(s)"))
                except Exception as e:  # its failure is a result too, not the end of the run
                    print(f"  fastsafetensors x{shards}: failed ({type(e).__name__}: {e})")
                remove(paths)
                remove([os.path.join(d, n) for n in os.listdir(d) if n.startswith("fst")])

    if want("dd"):
        f = os.path.join(d, "dd.bin")
        count = -(-nbytes // (16 << 20))
        # O_DIRECT where the file system allows it (not tmpfs), else buffered.
        for flags, label in ((["oflag=direct", "conv=fsync"], "O_DIRECT"), (["conv=fsync"], "buffered")):
            ts, ok = [], True
            for _ in range(runs):
                remove([f])
                t = time.perf_counter()
                p = subprocess.run(["dd", "if=/dev/zero", f"of={f}", "bs=16M", f"count={count}", *flags],
                                   capture_output=True, text=True)
                fsync_path(f) if p.returncode == 0 else None
                ts.append(time.perf_counter() - t)
                if p.returncode != 0:
                    ok = False
                    break
            remove([f])
            if ok:
                rows.append(row(f"dd bs=16M {label}", d, ts, count * (16 << 20), None, "zeros, not verified"))
                break
            print(f"  dd {label}: refused here ({p.stderr.strip().splitlines()[-1:]})")

    if want("fio") and shutil.which("fio"):
        f = os.path.join(d, "fio.bin")
        direct_ok = any(r["saver"] == "dd bs=16M O_DIRECT" and r["dir"] == d for r in rows)
        for jobs in (1, 8):
            for direct in ((1,) if direct_ok else (0,)):
                ts, ok = [], True
                for _ in range(runs):
                    remove([f])
                    t = time.perf_counter()
                    p = subprocess.run(
                        ["fio", "--name=w", f"--filename={f}", "--rw=write", "--bs=16M",
                         f"--size={nbytes // jobs}", f"--numjobs={jobs}",
                         f"--offset_increment={nbytes // jobs}", "--ioengine=psync",
                         f"--direct={direct}", "--end_fsync=1", "--group_reporting"],
                        capture_output=True, text=True)
                    ts.append(time.perf_counter() - t)
                    if p.returncode != 0:
                        ok = False
                        break
                if ok:
                    rows.append(row(f"fio {jobs} writer(s) direct={direct}", d, ts, nbytes, None,
                                    "wall time incl. fio start"))
                else:
                    print(f"  fio jobs={jobs} direct={direct}: failed ({p.stderr.strip()[-200:]})")
                remove([f])
    elif want("fio"):
        print("  fio: not installed")


def ratios(rows):
    print("### ratios (medians)")
    by = {}
    for r in rows:
        if "gbps_median" in r:
            by.setdefault(r["dir"], {})[r["saver"]] = r["gbps_median"]
    for d, m in by.items():
        limit = max((v for k, v in m.items() if k.startswith(("dd", "fio"))), default=None)
        st = m.get("safetensors.torch.save_file")
        for k, v in m.items():
            if k.startswith("gdpath"):
                parts = []
                if limit:
                    parts.append(f"{v / limit:.2f}x the write limit ({limit:.2f} GB/s)")
                if st:
                    parts.append(f"{v / st:.2f}x safetensors")
                for o, ov in m.items():
                    if o.startswith("fastsafetensors"):
                        parts.append(f"{v / ov:.2f}x {o}")
                print(f"  {d}: {k}: " + ", ".join(parts))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=size_arg, default=4 << 30, help="bytes of tensors (default 4GiB)")
    ap.add_argument("--runs", type=int, default=3, help="runs per saver on tmpfs")
    ap.add_argument("--disk-runs", type=int, default=2, help="runs per saver on the disk")
    ap.add_argument("--dirs", default=f"/dev/shm,{os.getcwd()}",
                    help="comma-separated, the first on tmpfs: a directory of the script's own "
                         "is made in each and removed after")
    ap.add_argument("--gdpath-bin", default=None, help="the gdpath binary (for gdpath resave)")
    ap.add_argument("--only", default=None,
                    help="savers: safetensors,gdpath-resave,gdpath-save_file,fastsafetensors,dd,fio")
    ap.add_argument("--json", default=None, help="also write the rows here (JSON lines)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device for PyTorch: nothing to measure")
        return 2
    torch.zeros(1, device="cuda:0")
    tensors = make_tensors(args.size)
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    dirs = args.dirs.split(",")
    print(f"{len(tensors)} bf16 tensors, {nbytes / 1e9:.2f} GB on cuda:0; dirs {dirs}", flush=True)
    # The source of `gdpath resave`, on tmpfs so that its load is quick; written once.
    os.makedirs(dirs[0], exist_ok=True)
    src = os.path.join(dirs[0], f"gdpath-save-src-{os.getpid()}.safetensors")
    from safetensors.torch import save_file

    save_file(tensors, src, metadata={"format": "pt"})
    cpu = {k: t.cpu() for k, t in tensors.items()}  # what every file must hold
    rows, work = [], []
    try:
        for i, d in enumerate(dirs):
            # A directory of our own in each one given: only it is removed afterwards.
            os.makedirs(d, exist_ok=True)
            w = tempfile.mkdtemp(prefix="gdpath-save-", dir=d)
            work.append(w)
            runs = args.runs if i == 0 else args.disk_runs
            bench_dir(w, tensors, cpu, nbytes, runs, args, src, rows)
    finally:
        os.unlink(src)
        for w in work:
            shutil.rmtree(w, ignore_errors=True)
    ratios(rows)
    if args.json:
        with open(args.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0 if all(r["verified"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
