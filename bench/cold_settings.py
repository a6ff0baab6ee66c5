#!/usr/bin/env python3
"""Cold root-disk loads of one checkpoint with `gdpath load` settings in turn, beside
fastsafetensors (nogds), to check the storage chooser's setting for cold files against the
alternatives on the same disk (docs/benchmarks.md, "Checkpoint load": the settings sweep row).

Each load starts with the file out of the page cache (`peers.drop_cache`) and 0.5 s of
quiet; `gdpath load` also runs with `--cold`, which drops the file again after its untimed
warm-up read. The settings go in rounds whose order rotates, so that the disk's drift falls on
all alike. GB/s (1e9 B/s): tensor bytes / the CLI's load time (its `gbps`: the process start and
the warm-up excluded), or the file's bytes / fastsafetensors' wall time (its setup included).
Nothing is verified here; `python_load.py` verifies every tensor of the chooser's setting and of
each loader.

Usage (GPU machine, root, fastsafetensors on PYTHONPATH):
    python3 bench/cold_settings.py GDPATH_BIN CKPT [ROUNDS]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import torch

from peers import drop_cache, fastsafetensors_load


def main() -> int:
    gd, path = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    nb = os.path.getsize(path)
    torch.zeros(1, device="cuda:0")
    torch.cuda.synchronize()

    def fast():
        drop_cache(path)
        time.sleep(0.5)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        d = fastsafetensors_load(path)
        torch.cuda.synchronize()
        g = nb / (time.perf_counter() - t0) / 1e9
        del d
        torch.cuda.empty_cache()
        return round(g, 3)

    def cli(*extra):
        def run():
            drop_cache(path)
            time.sleep(0.5)
            cmd = [gd, "load", path, "--cold", "--json", *extra]
            q = subprocess.run(cmd, capture_output=True, text=True)
            try:
                return round(json.loads(q.stdout)["gbps"], 3)
            except (json.JSONDecodeError, KeyError):
                return "error: " + (q.stderr or q.stdout)[-300:]

        return run

    settings = [
        # The chooser's: O_DIRECT, one 16 MiB request per core (16 threads on 16 cores, which
        # is also fastsafetensors 0.5.0's own nogds setting for a local file system).
        ("chosen", cli()),
        ("fastsafetensors nogds", fast),
        # The chooser's before 2026-12-02 evening: buffered readahead, two readers per core.
        ("32 x 4 MiB buffered", cli("--threads", "32", "--buffered", "--chunk", "4MiB")),
        ("32 x 16 MiB buffered", cli("--threads", "32", "--buffered", "--chunk", "16MiB")),
        ("32 x 16 MiB O_DIRECT", cli("--threads", "32", "--direct", "--chunk", "16MiB")),
        ("16 x 4 MiB O_DIRECT", cli("--threads", "16", "--direct", "--chunk", "4MiB")),
    ]
    res = {n: [] for n, _ in settings}
    for r in range(rounds):
        k = r % len(settings)
        for name, fn in settings[k:] + settings[:k]:
            v = fn()
            res[name].append(v)
            print(r, name, v, flush=True)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
