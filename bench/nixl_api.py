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

--host runs the same cases on host memory only (NumPy buffers registered as DRAM on both
sides, no torch, no GPU): it checks the bench's logic anywhere, its rates mean nothing.
--blocks-scale shrinks the block counts (a dry run: --host --blocks-scale 0.01).

A child that stops is reported with its exit status and stderr, never a JSONDecodeError;
every wait on the child is bounded (--child-timeout seconds). A UCX without CUDA (the
engine's finding gdr.ucx-no-cuda) exits with status 2 and the remedy: GDPATH_UCX_LIB pointing
at a CUDA-enabled libucp.so.0 (docs/nixl.md). Children inherit the environment, with the
imported gdpath's directory prepended to PYTHONPATH.

Usage: nixl_api.py [--cases gpu-read,host-write] [--runs 5] [--blocks-scale 1.0] [--host]
                   [--child-timeout 120]
"""
import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

CASES = {
    "gpu-read": dict(blocks=40_000, bs=64 << 10, op="READ", peer="vram"),
    "host-write": dict(blocks=100_000, bs=16 << 10, op="WRITE", peer="pinned"),
}
UCX_NO_CUDA = "gdr.ucx-no-cuda"
REMEDY = ("set GDPATH_UCX_LIB to a CUDA-enabled libucp.so.0 (e.g. the libucx-cu13 wheel's "
          "libucx/lib/libucp.so.0); docs/nixl.md, 'Running on the GPU machine'")


class ChildFailed(SystemExit):
    """The peer process stopped or fell silent; the message has its status and stderr."""


def source(n, seed):
    """The bytes a buffer filled from ``seed`` holds (NumPy, the same on every run), cached:
    regenerating gigabytes per verification would dominate the bench's time."""
    key = (n, seed)
    if key not in _SOURCES:
        _SOURCES[key] = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    return _SOURCES[key]


_SOURCES: dict = {}


class Buf:
    """One buffer: a torch tensor on cuda:0 ("vram"), a pinned torch CPU tensor ("pinned"),
    or a NumPy array ("host", the --host dry run); filled from ``seed`` or zeros."""

    def __init__(self, where, n, seed=None):
        self.where, self.n = where, n
        data = source(n, seed) if seed is not None else None
        if where == "host":
            self.t = data.copy() if data is not None else np.zeros(n, dtype=np.uint8)
            self.ptr = self.t.ctypes.data
        else:
            import torch

            cpu = torch.from_numpy(data) if data is not None else torch.zeros(n, dtype=torch.uint8)
            self.t = cpu.to("cuda:0") if where == "vram" else cpu.pin_memory()
            torch.cuda.synchronize()
            self.ptr = self.t.data_ptr()

    @property
    def nixl_type(self):
        return "VRAM" if self.where == "vram" else "DRAM"

    def register(self, agent):
        if self.where == "host":
            agent.register_memory([(self.ptr, self.n, 0, "")], "DRAM")
        else:
            agent.register_memory(self.t)

    def zero(self):
        if self.where == "host":
            self.t[:] = 0
        else:
            import torch

            self.t.zero_()
            torch.cuda.synchronize()

    def blocks(self, ids, bs):
        """Blocks ``ids`` of size ``bs`` as a NumPy (len(ids), bs) array (only these are copied
        off the GPU)."""
        if self.where == "host":
            return self.t.reshape(-1, bs)[ids]
        import torch

        idx = torch.from_numpy(np.asarray(ids, dtype=np.int64)).to(self.t.device)
        return self.t.view(-1, bs)[idx].cpu().numpy()


def sample_ok(buf, bs, seed, s_ids, d_ids):
    """Whether 2,000 sampled destination blocks of ``buf`` hold their source blocks (the
    source regenerated from ``seed``)."""
    blocks = buf.n // bs
    sample = np.random.default_rng(0).choice(blocks, min(blocks, 2000), replace=False)
    src = source(buf.n, seed).reshape(blocks, bs)
    return bool(np.array_equal(buf.blocks(d_ids[sample], bs), src[s_ids[sample]]))


def ids(n, seed):
    rng = np.random.default_rng(seed)
    return rng.permutation(n).astype(np.int64), rng.permutation(n).astype(np.int64)


def child_env():
    """The environment inherited, with the imported gdpath's directory prepended to
    PYTHONPATH (the child runs the same gdpath; GDPATH_UCX_LIB and UCX_* pass through)."""
    import gdpath

    env = dict(os.environ)
    site = os.path.dirname(os.path.dirname(os.path.abspath(gdpath.__file__)))
    env["PYTHONPATH"] = site + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def ucx_no_cuda_exit(e):
    """Exits with status 2 and the remedy when ``e`` is the engine's gdr.ucx-no-cuda."""
    if getattr(e, "finding", None) == UCX_NO_CUDA:
        print(f"nixl_api.py: {e}\nThe loaded UCX cannot export GPU memory: {REMEDY}", file=sys.stderr)
        raise SystemExit(2)


def peer_main(name, where, blocks, bs, seed):
    import gdpath.nixl as nixl

    agent = nixl.nixl_agent(name, nixl.nixl_agent_config(enable_listen_thread=True))
    try:
        pool = Buf(where, blocks * bs, seed)
        pool.register(agent)
    except nixl.nixlError as e:
        # On stdout, so the parent reports the engine's finding rather than a silent death.
        print(json.dumps({"error": str(e), "kind": e.kind, "finding": e.finding}), flush=True)
        agent.close()
        return 3
    print(json.dumps({"metadata": agent.get_agent_metadata().hex(), "base": pool.ptr}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[:1] == ["verify"]:  # verify SRC_SEED IDS_SEED: the blocks the last WRITE put here
            s, d = ids(blocks, int(cmd[2]))
            print(json.dumps(sample_ok(pool, bs, int(cmd[1]), s, d)), flush=True)
        elif cmd[:1] == ["clear"]:
            pool.zero()
            print("ok", flush=True)
        elif cmd[:1] == ["quit"]:
            break
    agent.close()
    return 0


class Child:
    """The peer process: bounded line reads; its stderr kept in a file for the report."""

    def __init__(self, args, timeout):
        self.timeout = timeout
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--peer", *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
                                     text=True, env=child_env())

    def fail(self, why):
        try:
            code = self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        self.err.seek(0)
        raise ChildFailed(f"nixl_api.py: the peer process {why} (exit status {code}); its stderr:\n"
                          f"{self.err.read()[-8000:]}")

    def line(self):
        r, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        if not r:
            self.proc.kill()
            self.fail(f"said nothing within {self.timeout} s and was killed")
        got = self.proc.stdout.readline()
        if not got:
            self.fail("exited")
        return got.strip()

    def ask(self, cmd):
        try:
            self.proc.stdin.write(cmd + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.fail("exited")
        return self.line()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)
        self.err.close()


def run_case(case, runs, scale, host, timeout):
    import gdpath
    import gdpath.nixl as nixl

    c = CASES[case]
    blocks, bs, op = max(2, int(c["blocks"] * scale)), c["bs"], c["op"]
    mine_where, peer_where = ("host", "host") if host else ("vram", c["peer"])
    peer_seed, my_seed, ids_seed = 1, 2, 3
    child = Child([peer_where, str(blocks), str(bs), str(peer_seed)], timeout)
    me = None
    try:
        hello = json.loads(child.line())
        if "error" in hello:
            if hello.get("finding") == UCX_NO_CUDA:
                child.proc.wait(10)
                print(f"nixl_api.py: the peer process: {hello['error']}\n{REMEDY}", file=sys.stderr)
                raise SystemExit(2)
            child.fail(f"could not register its memory: {hello['error']}")
        me = nixl.nixl_agent(f"bench-{case}", nixl.nixl_agent_config(timeout=float(timeout)))
        mine = Buf(mine_where, blocks * bs, my_seed if op == "WRITE" else None)
        try:
            mine.register(me)
        except nixl.nixlError as e:
            ucx_no_cuda_exit(e)
            raise
        remote_name = me.add_remote_agent(bytes.fromhex(hello["metadata"]))
        base, rbase = mine.ptr, hello["base"]
        ltype, rtype = mine.nixl_type, "VRAM" if peer_where == "vram" else "DRAM"
        local = me.prep_xfer_dlist("NIXL_INIT_AGENT", [(base + i * bs, bs, 0) for i in range(blocks)], ltype)
        remote = me.prep_xfer_dlist(remote_name, [(rbase + i * bs, bs, 0) for i in range(blocks)], rtype)
        local1 = me.prep_xfer_dlist("NIXL_INIT_AGENT", [(base, blocks * bs, 0)], ltype)
        remote1 = me.prep_xfer_dlist(remote_name, [(rbase, blocks * bs, 0)], rtype)
        s_ids, d_ids = ids(blocks, ids_seed)
        # READ: remote block s -> local slot d; WRITE: local block s -> remote slot d.
        li, ri = (d_ids, s_ids) if op == "READ" else (s_ids, d_ids)

        def clear():
            if op == "READ":
                mine.zero()
            elif child.ask("clear") != "ok":
                child.fail("did not clear its memory")

        def verify(contiguous):
            if contiguous:
                return None  # the reference moves other bytes; its rate is what counts
            if op == "WRITE":
                return json.loads(child.ask(f"verify {my_seed} {ids_seed}"))
            return sample_ok(mine, bs, peer_seed, s_ids, d_ids)

        def via_nixl(lh, rh, lidx, ridx):
            t0 = time.perf_counter()
            h = me.make_prepped_xfer(op, lh, lidx, rh, ridx)
            state = me.transfer(h)
            t1 = time.perf_counter()
            # Bounded by the agent's per-transfer deadline (timeout=): "ERR" past it.
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
            rep = t.wait(timeout=float(timeout))
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
                "memory": "host" if host else f"vram->{c['peer']}" if op == "WRITE" else f"{c['peer']}->vram",
                "gbps_min": g[0], "gbps_median": statistics.median(g), "gbps_max": g[-1],
                "post_us_per_desc_median": statistics.median(posts) * 1e6 / (1 if name == "contiguous" else blocks),
                "verified": ok, "paths": paths,
            }
        for r in rows.values():
            r["ratio_to_contiguous"] = r["gbps_median"] / rows["contiguous"]["gbps_median"]
            r["ratio_to_native"] = r["gbps_median"] / rows["native"]["gbps_median"]
            print(json.dumps(r), flush=True)
        return all(r["verified"] for r in rows.values())
    finally:
        child.close()
        if me is not None:
            me.close()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--peer":
        _, _, where, blocks, bs, seed = sys.argv
        return peer_main("bench-peer", where, int(blocks), int(bs), int(seed))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="gpu-read,host-write")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--blocks-scale", type=float, default=1.0)
    ap.add_argument("--host", action="store_true", help="host memory only, no GPU (a dry run)")
    ap.add_argument("--child-timeout", type=float, default=120.0,
                    help="seconds to wait for the peer's answer and for one transfer")
    args = ap.parse_args()
    ok = True
    for case in args.cases.split(","):
        ok = run_case(case, args.runs, args.blocks_scale, args.host, args.child_timeout) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
