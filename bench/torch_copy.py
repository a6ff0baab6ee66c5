#!/usr/bin/env python3
"""PyTorch baseline for `gdpath bench p2p|h2d|d2h`: the same copies through `tensor.copy_`.

Prints one JSON row per (kind, size) on stdout with the fields of gdpath's bench rows
(path, src, dst, bytes, gbps_min, gbps_median, gbps_max, verified), GB/s = 1e9 B/s, timed with
CUDA events around each copy after a warm-up. Data is random and checked after the copy.

Usage: torch_copy.py [--sizes 4KiB,64MiB,1GiB] [--iters 20] [--kinds h2d,h2d-pageable,d2h,p2p,p2p-bidir]
"""
import argparse
import json
import statistics
import sys

import torch

from peers import parse_size


def timed(fn, iters, streams):
    """Run fn() iters times; each run timed by events on streams[0] after syncing all streams."""
    samples = []
    for _ in range(iters):
        for s in streams:
            s.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(streams[0])
        for s in streams[1:]:
            s.wait_event(start)
        fn()
        for s in streams[1:]:
            ev = torch.cuda.Event()
            ev.record(s)
            streams[0].wait_event(ev)
        end.record(streams[0])
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return samples


def row(path, src, dst, nbytes, secs, verified):
    gbps = sorted(nbytes / t / 1e9 for t in secs)
    return {
        "tool": "pytorch",
        "path": path,
        "src": src,
        "dst": dst,
        "bytes": nbytes,
        "gbps_min": gbps[0],
        "gbps_median": statistics.median(gbps),
        "gbps_max": gbps[-1],
        "verified": verified,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4KiB,1MiB,64MiB,256MiB,1GiB")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--kinds", default="h2d,h2d-pageable,d2h,d2h-pageable,p2p,p2p-bidir")
    a = ap.parse_args()
    kinds = a.kinds.split(",")
    ngpu = torch.cuda.device_count()
    for size in (parse_size(s) for s in a.sizes.split(",")):
        n = size
        for kind in kinds:
            if kind.startswith("h2d") or kind.startswith("d2h"):
                pinned = not kind.endswith("pageable")
                host = torch.randint(0, 256, (n,), dtype=torch.uint8)
                if pinned:
                    host = host.pin_memory()
                dev = torch.empty(n, dtype=torch.uint8, device="cuda:0")
                s = torch.cuda.Stream(device=0)
                with torch.cuda.stream(s):
                    if kind.startswith("h2d"):
                        fn = lambda: dev.copy_(host, non_blocking=pinned)
                    else:
                        dev.copy_(host)
                        out = torch.empty_like(host)
                        if pinned:
                            out = out.pin_memory()
                        fn = lambda: out.copy_(dev, non_blocking=pinned)
                    fn()
                    secs = timed(fn, a.iters, [s])
                s.synchronize()
                if kind.startswith("h2d"):
                    ok = bool(torch.equal(dev.cpu(), host))
                else:
                    ok = bool(torch.equal(out, host))
                name = ("h2d" if kind.startswith("h2d") else "d2h") + ("-pinned" if pinned else "-pageable")
                src, dst = ("host", "gpu0") if kind.startswith("h2d") else ("gpu0", "host")
                print(json.dumps(row(name, src, dst, n, secs, ok)), flush=True)
            elif kind in ("p2p", "p2p-bidir") and ngpu >= 2:
                a0 = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda:0")
                b1 = torch.empty(n, dtype=torch.uint8, device="cuda:1")
                s0 = torch.cuda.Stream(device=0)
                if kind == "p2p":
                    def fn():
                        with torch.cuda.stream(s0):
                            b1.copy_(a0, non_blocking=True)
                    fn()
                    secs = timed(fn, a.iters, [s0])
                    ok = bool(torch.equal(b1.cpu(), a0.cpu()))
                    print(json.dumps(row("p2p", "gpu0", "gpu1", n, secs, ok)), flush=True)
                else:
                    a1 = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda:1")
                    b0 = torch.empty(n, dtype=torch.uint8, device="cuda:0")
                    s1 = torch.cuda.Stream(device=1)
                    def fn():
                        with torch.cuda.stream(s0):
                            b1.copy_(a0, non_blocking=True)
                        with torch.cuda.stream(s1):
                            b0.copy_(a1, non_blocking=True)
                    fn()
                    secs = timed(fn, a.iters, [s0, s1])
                    ok = bool(torch.equal(b1.cpu(), a0.cpu())) and bool(torch.equal(b0.cpu(), a1.cpu()))
                    # bidirectional: bytes moved in both directions together
                    print(json.dumps(row("p2p-bidir", "gpu0", "gpu1", 2 * n, secs, ok)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
