#!/usr/bin/env python3
"""Baselines for `gdpath bench kv`: the same scattered KV blocks moved by PyTorch and NIXL.

The shape is gdpath's: two pools of --blocks slots of --block-size bytes; block i goes from
source slot P1[i] to destination slot P2[i], two fixed random permutations (--layout random),
or the same for runs of --run-len consecutive blocks (--layout runs). Methods, each timed from
the first call to the last completion (wall clock around a CUDA synchronize, after a warm-up):

  contiguous     one copy_ of all the bytes (the reference the ratios are taken against)
  copy-loop      one tensor.copy_(non_blocking=True) per block
  foreach-copy   torch._foreach_copy_ over the block views
  index-copy     gather the source blocks with index_select, one contiguous copy, then
                 index_copy_ into the destination (twice the memory: the staging tensor)
  nixl           NIXL (nixl or nixl_cu13 wheel, UCX backend) from a second process, one request
                 of all the descriptors, when the wheel imports (GPU destinations and pinned host)

Prints one JSON line per method: {tool, method, src, dst, blocks, block_size, bytes, gbps_min,
gbps_median, gbps_max, ratio (to contiguous), verified}; GB/s = 1e9 B/s. Every method's
destination is cleared before it and checked after it (sampled blocks, byte for byte).

Usage: kv_blocks.py [--blocks 100000] [--block-size 16KiB] [--src gpu:0] [--dst host]
                    [--layout random|runs] [--run-len 16] [--runs 5] [--methods a,b,...]
"""
import argparse
import json
import statistics
import sys
import time

from peers import parse_size


def alloc(torch, where, n):
    if where == "host":
        return torch.zeros(n, dtype=torch.uint8).pin_memory()
    return torch.zeros(n, dtype=torch.uint8, device=where.replace("gpu:", "cuda:"))


def placement(torch, n, layout, run_len, seed):
    g = torch.Generator().manual_seed(seed)
    if layout == "random":
        return torch.randperm(n, generator=g)
    runs = torch.randperm(n // run_len, generator=g)
    return (runs.repeat_interleave(run_len) * run_len + torch.arange(n) % run_len)


def timed(torch, fn, runs):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return out


def check(torch, dst, src, sidx, didx, bs, chunk=8192):
    """Every destination block against its source block, in chunks gathered on their devices."""
    n = sidx.numel()
    dv, sv = dst.view(n, bs), src.view(-1, bs)
    for i in range(0, n, chunk):
        d = dv.index_select(0, didx[i:i + chunk].to(dv.device)).cpu()
        s = sv.index_select(0, sidx[i:i + chunk].to(sv.device)).cpu()
        if not torch.equal(d, s):
            return False
    return True


def row(args, method, nbytes, secs, verified, ref=None):
    gbps = sorted(nbytes / t / 1e9 for t in secs)
    med = statistics.median(gbps)
    return {
        "tool": "nixl" if method == "nixl" else "pytorch",
        "method": method,
        "src": args.src,
        "dst": args.dst,
        "layout": args.layout,
        "blocks": args.blocks,
        "block_size": args.block_size,
        "bytes": nbytes,
        "gbps_min": gbps[0],
        "gbps_median": med,
        "gbps_max": gbps[-1],
        "ratio": med / ref if ref else 1.0,
        "verified": verified,
    }


def nixl_target(conn, dst_kind, nbytes):
    import torch
    try:
        from nixl_cu13 import nixl_agent, nixl_agent_config
    except ImportError:
        from nixl._api import nixl_agent, nixl_agent_config
    ag = nixl_agent("T", nixl_agent_config(backends=["UCX"]))
    buf = alloc(torch, dst_kind, nbytes)
    ag.register_memory(buf)
    conn.send((ag.get_agent_metadata(), buf.data_ptr()))
    ag.add_remote_agent(conn.recv())
    conn.recv()  # the initiator is done: ship back what arrived for checking
    conn.send(buf.cpu().numpy().tobytes())
    conn.recv()


def nixl_initiator(conn, out, args, src_kind, dst_kind, sidx, didx):
    import torch
    try:
        from nixl_cu13 import nixl_agent, nixl_agent_config
    except ImportError:
        from nixl._api import nixl_agent, nixl_agent_config
    n, bs = args.blocks, args.block_size
    torch.manual_seed(0)
    src = torch.randint(0, 255, (n * bs,), dtype=torch.uint8)
    src = src.pin_memory() if src_kind == "host" else src.to(src_kind.replace("gpu:", "cuda:"))
    ag = nixl_agent("I", nixl_agent_config(backends=["UCX"]))
    ag.register_memory(src)
    tmeta, taddr = conn.recv()
    name = ag.add_remote_agent(tmeta)
    conn.send(ag.get_agent_metadata())
    seg = "DRAM" if dst_kind == "host" else "VRAM"
    src_seg = "DRAM" if src_kind == "host" else "VRAM"
    local = ag.get_xfer_descs([(src.data_ptr() + int(s) * bs, bs, 0) for s in sidx], src_seg)
    remote = ag.get_xfer_descs([(taddr + int(d) * bs, bs, 0) for d in didx], seg)
    h = ag.initialize_xfer("WRITE", local, remote, name, b"kv")
    secs = []
    for i in range(args.runs + 1):
        t = time.perf_counter()
        st = ag.transfer(h)
        while st == "PROC":
            st = ag.check_xfer_state(h)
        if st != "DONE":
            out.put({"error": f"nixl transfer state {st}"})
            conn.send("done")
            return
        if i:
            secs.append(time.perf_counter() - t)
    conn.send("done")
    got = torch.frombuffer(bytearray(conn.recv()), dtype=torch.uint8)
    conn.send("bye")
    ok = check(torch, got, src.cpu(), sidx, didx, bs)
    out.put({"secs": secs, "verified": ok})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=100_000)
    ap.add_argument("--block-size", type=parse_size, default=16 << 10)
    ap.add_argument("--src", default="gpu:0")
    ap.add_argument("--dst", default="host")
    ap.add_argument("--layout", default="random", choices=["random", "runs"])
    ap.add_argument("--run-len", type=int, default=16)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--methods", default="contiguous,copy-loop,foreach-copy,index-copy,nixl")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"tool": "pytorch", "error": "no CUDA device"}))
        return 2
    n, bs = args.blocks, args.block_size
    nbytes = n * bs
    methods = args.methods.split(",")
    torch.manual_seed(0)
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8).to(
        "cpu" if args.src == "host" else args.src.replace("gpu:", "cuda:"))
    if args.src == "host":
        src = src.pin_memory()
    dst = alloc(torch, args.dst, nbytes)
    sidx = placement(torch, n, args.layout, args.run_len, 1)
    didx = placement(torch, n, args.layout, args.run_len, 2)
    sv, dv = src.view(n, bs), dst.view(n, bs)
    ref = None
    for m in methods:
        if m == "nixl":
            continue
        dst.zero_()
        torch.cuda.synchronize()
        if m == "contiguous":
            secs = timed(torch, lambda: dst.copy_(src, non_blocking=True), args.runs)
            ok = torch.equal(dst[:4096].cpu(), src[:4096].cpu()) and torch.equal(dst[-4096:].cpu(), src[-4096:].cpu())
            ref = statistics.median(nbytes / t / 1e9 for t in secs)
            print(json.dumps(row(args, m, nbytes, secs, ok)), flush=True)
            continue
        if m == "copy-loop":
            pairs = list(zip(sidx.tolist(), didx.tolist()))

            def fn():
                for s, d in pairs:
                    dv[d].copy_(sv[s], non_blocking=True)
        elif m == "foreach-copy":
            srcs = [sv[s] for s in sidx.tolist()]
            dsts = [dv[d] for d in didx.tolist()]

            def fn():
                torch._foreach_copy_(dsts, srcs, non_blocking=True)
        elif m == "index-copy":
            # Gather on the source's device, one contiguous copy, scatter on the destination's.
            si = sidx.to(sv.device) if sv.is_cuda else sidx
            di = didx.to(dv.device) if dv.is_cuda else didx
            dev = sv.device if sv.is_cuda else dv.device
            stage = torch.empty((n, bs), dtype=torch.uint8, device=dev)
            order = torch.empty_like(stage) if sv.is_cuda and not dv.is_cuda else None

            def fn():
                if sv.is_cuda:
                    torch.index_select(sv, 0, si, out=stage)
                    if dv.is_cuda:
                        dv.index_copy_(0, di, stage.to(dv.device, non_blocking=True))
                    else:
                        # Host destination: scatter the staged blocks in destination order on
                        # the GPU first, then one contiguous D2H.
                        order.index_copy_(0, di.to(dev), stage)
                        dst.copy_(order.view(-1), non_blocking=True)
                else:
                    stage.view(-1).copy_(src, non_blocking=True)
                    g = torch.index_select(stage, 0, si.to(dev))
                    dv.index_copy_(0, di.to(dev), g)
        else:
            print(json.dumps({"tool": "pytorch", "method": m, "error": "unknown method"}))
            continue
        secs = timed(torch, fn, args.runs)
        ok = check(torch, dst, src, sidx, didx, bs)
        print(json.dumps(row(args, m, nbytes, secs, ok, ref)), flush=True)
    if "nixl" in methods:
        try:
            try:
                import nixl_cu13  # noqa: F401
            except ImportError:
                import nixl  # noqa: F401
        except ImportError as e:
            print(json.dumps({"tool": "nixl", "method": "nixl", "skipped": f"no NIXL wheel ({e})"}))
            return 0
        import multiprocessing as mp
        mp.set_start_method("spawn", force=True)
        a, b = mp.Pipe()
        q = mp.Queue()
        pt = mp.Process(target=nixl_target, args=(b, args.dst, nbytes))
        pi = mp.Process(target=nixl_initiator, args=(a, q, args, args.src, args.dst, sidx, didx))
        pt.start()
        pi.start()
        pi.join(300)
        pt.join(60)
        r = q.get(timeout=5) if not q.empty() else {"error": f"exit codes {pi.exitcode}, {pt.exitcode}"}
        if "secs" in r:
            print(json.dumps(row(args, "nixl", nbytes, r["secs"], r["verified"], ref)), flush=True)
        else:
            print(json.dumps({"tool": "nixl", "method": "nixl", **r}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
