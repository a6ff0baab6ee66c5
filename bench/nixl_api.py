#!/usr/bin/env python3
"""vLLM's KV pattern through gdpath.nixl (NIXL's API on gdpath), on the GPU machine.

Two processes on one GPU. Cases (each one make_prepped_xfer of all the blocks, posted by
transfer(), completion polled with check_xfer_state as vLLM does):

  gpu-read    40,000 x 64 KiB scattered blocks READ from the other process's GPU memory into
              this process's GPU memory (CUDA IPC)
  host-write  100,000 x 16 KiB scattered blocks WRITE from this process's GPU memory into the
              other process's pinned host memory

Methods per case, in the same processes on the same memory:

  nixl        gdpath.nixl: make_prepped_xfer + transfer + poll (posting = those two calls)
  native      gdpath's block transfer on the same layout (agent.prepare_blocks once, then
              PreparedBlocks.transfer(ids) and wait)
  contiguous  one descriptor of all the bytes through gdpath.nixl (the reference)

Each run is verified (sampled blocks byte for byte against the source, regenerated from its
seed). Prints one JSON line per case and method: {case, method, blocks, block_size, bytes,
gbps_min, gbps_median, gbps_max, post_us_per_desc_median, ratio_to_contiguous,
ratio_to_native, verified, paths}; GB/s = 1e9 B/s, µs per descriptor.

Usage: nixl_api.py [--cases gpu-read,host-write] [--runs 5] [--blocks-scale 1.0]
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np

CASES = {
    "gpu-read": dict(blocks=40_000, bs=64 << 10, op="READ", peer="vram"),
    "host-write": dict(blocks=100_000, bs=16 << 10, op="WRITE", peer="pinned"),
}


def fill(torch, n, seed, device):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).to(device)


def ids(n, seed):
    rng = np.random.default_rng(seed)
    return rng.permutation(n).astype(np.int64), rng.permutation(n).astype(np.int64)


def peer_main(name, where, blocks, bs, seed):
    import torch

    import gdpath.nixl as nixl

    agent = nixl.nixl_agent(name, nixl.nixl_agent_config(enable_listen_thread=True))
    if where == "vram":
        pool = fill(torch, blocks * bs, seed, "cuda:0")
    else:
        pool = fill(torch, blocks * bs, seed, "cpu").pin_memory()
    torch.cuda.synchronize()
    agent.register_memory(pool)
    print(json.dumps({"metadata": agent.get_agent_metadata().hex(), "base": pool.data_ptr()}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[:1] == ["verify"]:  # verify SRC_SEED IDS_SEED: the blocks the last WRITE put here
            src = fill(torch, blocks * bs, int(cmd[1]), "cpu").view(blocks, bs)
            s, d = ids(blocks, int(cmd[2]))
            sample = np.random.default_rng(0).choice(blocks, min(blocks, 2000), replace=False)
            got = pool.cpu().view(blocks, bs)[torch.from_numpy(d[sample])]
            print(json.dumps(bool(torch.equal(got, src[torch.from_numpy(s[sample])]))), flush=True)
        elif cmd[:1] == ["clear"]:
            pool.zero_()
            torch.cuda.synchronize()
            print("ok", flush=True)
        elif cmd[:1] == ["quit"]:
            break
    agent.close()


def run_case(case, runs):
    import torch

    import gdpath
    import gdpath.nixl as nixl

    c = CASES[case]
    blocks, bs, op = c["blocks"], c["bs"], c["op"]
    peer_seed, my_seed, ids_seed = 1, 2, 3
    child = subprocess.Popen(
        [sys.executable, __file__, "--peer", c["peer"], str(blocks), str(bs), str(peer_seed)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    hello = json.loads(child.stdout.readline())
    me = nixl.nixl_agent(f"bench-{case}", nixl.nixl_agent_config(timeout=600.0))
    mine = fill(torch, blocks * bs, my_seed, "cuda:0") if op == "WRITE" else torch.zeros(blocks * bs, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    me.register_memory(mine)
    remote_name = me.add_remote_agent(bytes.fromhex(hello["metadata"]))
    base, rbase = mine.data_ptr(), hello["base"]
    rtype = "VRAM" if c["peer"] == "vram" else "DRAM"
    local = me.prep_xfer_dlist("NIXL_INIT_AGENT", [(base + i * bs, bs, 0) for i in range(blocks)], "VRAM")
    remote = me.prep_xfer_dlist(remote_name, [(rbase + i * bs, bs, 0) for i in range(blocks)], rtype)
    local1 = me.prep_xfer_dlist("NIXL_INIT_AGENT", [(base, blocks * bs, 0)], "VRAM")
    remote1 = me.prep_xfer_dlist(remote_name, [(rbase, blocks * bs, 0)], rtype)
    s_ids, d_ids = ids(blocks, ids_seed)
    # READ: remote block s -> local slot d; WRITE: local block s -> remote slot d.
    li, ri = (d_ids, s_ids) if op == "READ" else (s_ids, d_ids)

    def ask(cmd):
        child.stdin.write(cmd + "\n")
        child.stdin.flush()
        return child.stdout.readline().strip()

    def clear():
        if op == "READ":
            mine.zero_()
            torch.cuda.synchronize()
        else:
            assert ask("clear") == "ok"

    def verify(contiguous):
        if contiguous:
            return None  # the reference moves other bytes; its rate is what counts
        if op == "WRITE":
            return json.loads(ask(f"verify {my_seed} {ids_seed}"))
        src = fill(torch, blocks * bs, peer_seed, "cpu").view(blocks, bs)
        sample = np.random.default_rng(0).choice(blocks, min(blocks, 2000), replace=False)
        got = mine.cpu().view(blocks, bs)[torch.from_numpy(d_ids[sample])]
        return bool(torch.equal(got, src[torch.from_numpy(s_ids[sample])]))

    def via_nixl(lh, rh, lidx, ridx):
        t0 = time.perf_counter()
        h = me.make_prepped_xfer(op, lh, lidx, rh, ridx)
        state = me.transfer(h)
        t1 = time.perf_counter()
        while state == "PROC":
            state = me.check_xfer_state(h)
        t2 = time.perf_counter()
        assert state == "DONE", h.error
        paths = sorted({p for t in h.transfers for p in t.report.paths})
        me.release_xfer_handle(h)
        return t2 - t0, t1 - t0, paths

    # gdpath's own block transfer on the same layout and memory, for the within-10 % target.
    ag = me.gdpath_agent
    rview = me._remotes[remote_name].view(me._remotes[remote_name].regions[0][4])
    lreg = next(m.region for m in me._mems)
    lk, rk = gdpath.KvLayout(lreg, bs, blocks), gdpath.KvLayout(rview, bs, blocks)
    native = ag.prepare_blocks(rk, lk) if op == "READ" else ag.prepare_blocks(lk, rk)

    def via_native():
        t0 = time.perf_counter()
        t = native.transfer(s_ids, d_ids)
        t1 = time.perf_counter()
        rep = t.wait()
        return time.perf_counter() - t0, t1 - t0, rep.paths

    methods = {
        "contiguous": lambda: via_nixl(local1, remote1, [0], [0]),
        "nixl": lambda: via_nixl(local, remote, li, ri),
        "native": via_native,
    }
    rows = {}
    for name, fn in methods.items():
        fn()  # warm-up: first-use setup (IPC mappings, prepared block transfers)
        secs, posts, ok, paths = [], [], True, []
        for _ in range(runs):
            clear()
            s, p, paths = fn()
            secs.append(s)
            posts.append(p)
            v = verify(name == "contiguous")
            ok = ok and v is not False
        nbytes = blocks * bs
        g = sorted(nbytes / s / 1e9 for s in secs)
        rows[name] = {
            "case": case, "method": name, "blocks": blocks, "block_size": bs, "bytes": nbytes,
            "gbps_min": g[0], "gbps_median": statistics.median(g), "gbps_max": g[-1],
            "post_us_per_desc_median": statistics.median(posts) * 1e6 / (1 if name == "contiguous" else blocks),
            "verified": ok, "paths": paths,
        }
    for r in rows.values():
        r["ratio_to_contiguous"] = r["gbps_median"] / rows["contiguous"]["gbps_median"]
        r["ratio_to_native"] = r["gbps_median"] / rows["native"]["gbps_median"]
        print(json.dumps(r), flush=True)
    ask("quit")
    child.wait(30)
    me.close()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--peer":
        _, _, where, blocks, bs, seed = sys.argv
        return peer_main("bench-peer", where, int(blocks), int(bs), int(seed))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="gpu-read,host-write")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    for case in args.cases.split(","):
        run_case(case, args.runs)


if __name__ == "__main__":
    main()
