#!/usr/bin/env python3
"""Cold checkpoint loads into host memory from Python, side by side (no GPU needed): a
safetensors file of float32 tensors on a disk, the page cache dropped before every load
(root: /proc/sys/vm/drop_caches), loaded by `gdpath.safetensors.load_file(framework="numpy")`
with the storage chooser's settings (no agent given), by the same with `gdpath.Agent()`'s
default settings (what `load_file` used before it took the chooser's), and by
`safetensors.numpy.load_file`; rounds interleaved, every load compared with the first one's
bytes (a SHA-256 per tensor). GB/s = tensor bytes / wall time, 1e9 B/s; min / median / max.

Usage: python3 bench/cpu_cold_load.py DIR [--gib 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time

import numpy as np
import safetensors.numpy

import gdpath
import gdpath.safetensors as gst


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def digest(d):
    return {k: hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest() for k, v in d.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    path = os.path.join(a.dir, "cold.safetensors")
    n = int(a.gib * (1 << 30) / 4 / 16)
    if not os.path.exists(path):
        rng = np.random.default_rng(1)
        safetensors.numpy.save_file(
            {f"t{i}": rng.standard_normal(n, dtype=np.float32) for i in range(16)}, path
        )
    tensor_bytes = 16 * n * 4
    default = gdpath.Agent()
    loaders = {
        "gdpath load_file (chooser)": lambda: gst.load_file(path, framework="numpy"),
        "gdpath load_file (Agent() defaults)": lambda: gst.load_file(path, framework="numpy", agent=default),
        "safetensors.numpy.load_file": lambda: safetensors.numpy.load_file(path),
    }
    want = None
    rates = {k: [] for k in loaders}
    for r in range(a.rounds):
        for name, load in loaders.items():
            drop_caches()
            t = time.perf_counter()
            d = load()
            dt = time.perf_counter() - t
            got = digest(d)
            if want is None:
                want = got
            assert got == want, f"{name}: bytes differ"
            rates[name].append(tensor_bytes / dt / 1e9)
            del d
    chosen = gdpath._native.Checkpoint([path])
    drop_caches()
    print(f"file {path}: {tensor_bytes / 1e9:.2f} GB of tensors, {a.rounds} cold rounds, verified")
    print(f"chooser: {chosen.load(gpu=None).chosen}")
    for name, v in rates.items():
        print(f"{name:38s} {min(v):6.3f} / {statistics.median(v):6.3f} / {max(v):6.3f} GB/s")


if __name__ == "__main__":
    main()
