"""gdpath.nixl (NIXL's Python API on gdpath) between two processes over loopback, host memory:
metadata exchange, prepared lists on both sides, make_prepped_xfer READ and WRITE of 10,000
scattered blocks with notifications, polling and await, NIXL's errors for bad input, a peer
killed or frozen mid-transfer giving "ERR" within the deadline, the side channel, vLLM's
NixlConnector call sequence, and install()/uninstall().

This file is also the other process: ``python test_nixl.py peer NAME BLOCKS BLOCK_BYTES
SEED [LAYERS]`` registers a pool (per layer, as vLLM registers its KV caches) and answers
commands on stdin.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve()


def _cfg(nixl, **kw):
    return nixl.nixl_agent_config(net_devices="lo", **kw)


# -- the other process ----------------------------------------------------------------------


def _peer_main(name: str, blocks: int, block_bytes: int, seed: int, layers: int, where: str = "numpy") -> None:
    """The other process. ``where``: "numpy" (NumPy pools registered by address), "vram"
    (torch CUDA tensors on cuda:0 registered directly), "pinned" (pinned torch CPU tensors)."""
    import gdpath.nixl as nixl

    try:
        agent, pools, bases = _peer_setup(nixl, name, blocks, block_bytes, seed, layers, where)
    except nixl.nixlError as e:
        # Said on stdout so the test sees the engine's finding (e.g. gdr.ucx-no-cuda) and can
        # skip with it, rather than a bare "peer exited".
        sys.stdout.write(json.dumps({"error": str(e), "kind": e.kind, "finding": e.finding}) + "\n")
        sys.stdout.flush()
        sys.exit(3)
    _peer_serve(agent, pools, bases)


def _peer_setup(nixl, name: str, blocks: int, block_bytes: int, seed: int, layers: int, where: str):
    """The peer's agent and its registered pools (NumPy arrays or torch tensors) and their base
    addresses."""
    agent = nixl.nixl_agent(name, _cfg(nixl, enable_listen_thread=True))
    rng = np.random.default_rng(seed)
    pools = [rng.integers(0, 256, blocks * block_bytes, dtype=np.uint8) for _ in range(layers)]
    if where == "numpy":
        # vLLM's registration: one (base_addr, region_len, device_id, "") per KV cache.
        descs = agent.get_reg_descs([(p.ctypes.data, p.nbytes, 0, "") for p in pools], "DRAM")
        agent.register_memory(descs)
        bases = [p.ctypes.data for p in pools]
    else:
        import torch

        tensors = [torch.from_numpy(p).to("cuda:0") if where == "vram" else torch.from_numpy(p).pin_memory() for p in pools]
        torch.cuda.synchronize()
        agent.register_memory(tensors)
        bases = [t.data_ptr() for t in tensors]
        # Dumps read the tensors' memory (the GPU's copied back).
        pools = tensors  # type: ignore[assignment]
    return agent, pools, bases


def _peer_serve(agent, pools: list, bases: list) -> None:
    """Says the peer's metadata, then answers commands on stdin until "quit"."""
    out = sys.stdout
    out.write(json.dumps({"metadata": agent.get_agent_metadata().hex(), "address": agent.address,
                          "bases": bases}) + "\n")
    out.flush()
    seen: dict = {}
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "notifs":  # notifs COUNT SECONDS: wait for COUNT notifications
            want, end = int(cmd[1]), time.monotonic() + float(cmd[2])
            while sum(len(v) for v in seen.values()) < want and time.monotonic() < end:
                for k, v in agent.get_new_notifs().items():
                    seen.setdefault(k, []).extend(m.hex() for m in v)
                time.sleep(0.005)
            out.write(json.dumps(seen) + "\n")
            seen = {}
        elif cmd[0] == "watch":  # watch SECONDS PATH scribble|keep: act on the first notification
            # The moment a notification is seen, copy the pools (what a consumer would read
            # then) before anything else; "scribble" then overwrites them with 0xFF, as a
            # producer reusing its blocks once told a READ is done would.
            end, got = time.monotonic() + float(cmd[1]), {}
            while not got and time.monotonic() < end:
                got = agent.get_new_notifs()
            snap = [p.cpu().numpy().copy() if hasattr(p, "cpu") else p.copy() for p in pools]
            if got and cmd[3] == "scribble":
                for p in pools:
                    p.fill_(0xFF) if hasattr(p, "fill_") else p.fill(0xFF)
            with open(cmd[2], "wb") as f:
                for p in snap:
                    f.write(p.tobytes())
            out.write(json.dumps({k: [m.hex() for m in v] for k, v in got.items()}) + "\n")
        elif cmd[0] == "dump":  # dump PATH: the pools' bytes, layer after layer
            with open(cmd[1], "wb") as f:
                for p in pools:
                    f.write(p.cpu().numpy().tobytes() if hasattr(p, "cpu") else p.tobytes())
            out.write("ok\n")
        elif cmd[0] == "remotes":  # remotes NAME: whether NAME's metadata was added
            out.write(json.dumps(agent.check_remote_metadata(cmd[1])) + "\n")
        elif cmd[0] == "quit":
            break
        out.flush()
    agent.close()


def child_env() -> dict:
    """This process's environment for a child: everything inherited (GDPATH_UCX_LIB, UCX_*,
    CUDA_VISIBLE_DEVICES), with the directory of the gdpath package this process imported
    prepended to PYTHONPATH, so the child runs the same gdpath (a wheel unpacked on
    PYTHONPATH, a venv) and keeps whatever PYTHONPATH already named."""
    import gdpath

    env = dict(os.environ)
    site = str(Path(gdpath.__file__).resolve().parent.parent)
    rest = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = site + (os.pathsep + rest if rest else "")
    return env


class PeerFailed(AssertionError):
    """The peer process stopped before it said its metadata: ``finding`` and ``kind`` are the
    engine's when the peer's gdpath raised (else None), ``stderr`` its last output,
    ``returncode`` its exit status."""

    def __init__(self, name: str, returncode, stderr: str, error: dict | None = None):
        error = error or {}
        self.returncode, self.stderr = returncode, stderr
        self.finding, self.kind = error.get("finding"), error.get("kind")
        said = error.get("error") or "no error line"
        super().__init__(f"peer {name} exited ({returncode}): {said}\n--- its stderr ---\n{stderr[-4000:]}")


class Peer:
    """The other process: its metadata, address and pools' base addresses; ``pools(rng)``
    gives the bytes it started with (the same generator). Raises :class:`PeerFailed` when the
    process stops before saying its metadata."""

    def __init__(self, name: str, blocks: int, block_bytes: int, seed: int = 1, layers: int = 1, script: Path = HERE, mode: str = "peer"):
        import tempfile

        self.name, self.blocks, self.block_bytes, self.seed, self.layers = name, blocks, block_bytes, seed, layers
        # stderr goes to a file, not a pipe: nobody reads it while the peer runs, and a full
        # pipe would block the peer.
        self._err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), mode, name, str(blocks), str(block_bytes), str(seed), str(layers)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True, env=child_env(),
        )
        hello = json.loads(self._line(60))
        if "error" in hello:
            raise self._failed(hello)
        self.metadata = bytes.fromhex(hello["metadata"])
        self.address = hello["address"]
        self.bases = hello["bases"]

    def _failed(self, error: dict | None = None) -> PeerFailed:
        try:
            code = self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        self._err.seek(0)
        return PeerFailed(self.name, code, self._err.read(), error)

    def _line(self, seconds: float) -> str:
        import select

        r, _, _ = select.select([self.proc.stdout], [], [], seconds)
        assert r, f"peer {self.name} said nothing within {seconds} s"
        line = self.proc.stdout.readline()
        if not line:
            raise self._failed()
        return line

    def ask(self, cmd: str, seconds: float = 60) -> str:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self._line(seconds)

    def initial(self) -> list:
        rng = np.random.default_rng(self.seed)
        return [rng.integers(0, 256, self.blocks * self.block_bytes, dtype=np.uint8) for _ in range(self.layers)]

    def dump(self, tmp: Path) -> np.ndarray:
        p = tmp / f"{self.name}.bin"
        assert self.ask(f"dump {p}").strip() == "ok"
        return np.fromfile(p, dtype=np.uint8).reshape(self.layers, -1)

    def watch(self, path: Path, scribble: bool, seconds: float = 60) -> None:
        """Asks the peer to snapshot its pools into ``path`` the moment it sees a notification
        (then overwrite them with 0xFF if ``scribble``); :meth:`watched` reads its answer."""
        self.proc.stdin.write(f"watch {seconds} {path} {'scribble' if scribble else 'keep'}\n")
        self.proc.stdin.flush()
        self._watch = (path, seconds)

    def watched(self) -> tuple:
        """The notifications the watch saw and the pools' bytes at that moment."""
        path, seconds = self._watch
        got = json.loads(self._line(seconds + 30))
        snap = np.fromfile(path, dtype=np.uint8).reshape(self.layers, -1)
        return {k: [bytes.fromhex(m) for m in v] for k, v in got.items()}, snap

    def notifs(self, count: int, seconds: float = 30) -> dict:
        got = json.loads(self.ask(f"notifs {count} {seconds}", seconds + 30))
        return {k: [bytes.fromhex(m) for m in v] for k, v in got.items()}

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)
        self._err.close()


def blocks_of(base: int, blocks: int, block_bytes: int) -> list:
    return [(base + i * block_bytes, block_bytes, 0) for i in range(blocks)]


def wait_state(agent, handle, seconds: float) -> str:
    end = time.monotonic() + seconds
    while True:
        s = agent.check_xfer_state(handle)
        if s != "PROC" or time.monotonic() > end:
            return s
        time.sleep(0.001)


# -- tests ----------------------------------------------------------------------------------

BLOCKS, BS, MOVED = 16384, 1024, 10_000


@pytest.fixture
def two(tmp_path):
    import gdpath.nixl as nixl

    peer = Peer("target", BLOCKS, BS, seed=3)
    me = nixl.nixl_agent("initiator", _cfg(nixl))
    mine = np.zeros(BLOCKS * BS, dtype=np.uint8)
    me.register_memory(me.get_reg_descs([(mine.ctypes.data, mine.nbytes, 0, "")], "DRAM"))
    assert me.add_remote_agent(peer.metadata) == "target"
    local = me.prep_xfer_dlist("NIXL_INIT_AGENT", blocks_of(mine.ctypes.data, BLOCKS, BS), "DRAM")
    remote = me.prep_xfer_dlist("target", blocks_of(peer.bases[0], BLOCKS, BS), "DRAM")
    yield nixl, me, mine, peer, local, remote
    me.close()
    peer.close()


def test_read_and_write_10000_scattered_blocks_with_notifications(two, tmp_path):
    nixl, me, mine, peer, local, remote = two
    rng = np.random.default_rng(5)
    src_ids = rng.choice(BLOCKS, MOVED, replace=False)
    dst_ids = rng.choice(BLOCKS, MOVED, replace=False)
    h = me.make_prepped_xfer("READ", local, dst_ids, remote, src_ids, notif_msg=b"read-done")
    assert isinstance(h, int)
    assert me.transfer(h) in ("DONE", "PROC")
    assert wait_state(me, h, 60) == "DONE", h.error
    theirs = peer.initial()[0].reshape(BLOCKS, BS)
    got = mine.reshape(BLOCKS, BS)
    assert np.array_equal(got[dst_ids], theirs[src_ids])
    untouched = np.setdiff1d(np.arange(BLOCKS), dst_ids)
    assert not got[untouched].any()
    # The notification is there once the data is: the target sees it under our name.
    assert peer.notifs(1) == {"initiator": [b"read-done"]}
    me.release_xfer_handle(h)

    # WRITE: our blocks into other slots of theirs, awaited instead of polled.
    mine[:] = np.random.default_rng(9).integers(0, 256, mine.size, dtype=np.uint8)
    w_src = rng.choice(BLOCKS, MOVED, replace=False)
    w_dst = rng.choice(BLOCKS, MOVED, replace=False)
    h = me.make_prepped_xfer("WRITE", local, w_src, remote, w_dst, notif_msg="write-done")
    assert me.transfer(h) in ("DONE", "PROC")
    assert asyncio.run(_await(h)) == "DONE"
    assert me.check_xfer_state(h) == "DONE"
    assert peer.notifs(1) == {"initiator": [b"write-done"]}
    after = peer.dump(tmp_path)[0].reshape(BLOCKS, BS)
    expect = theirs.copy()
    expect[w_dst] = mine.reshape(BLOCKS, BS)[w_src]
    assert np.array_equal(after, expect)
    # A done handle is posted again (NIXL allows a repost once complete).
    assert me.transfer(h) in ("DONE", "PROC")
    assert wait_state(me, h, 60) == "DONE"
    me.release_xfer_handle(h)


async def _await(h):
    return await h


def test_the_peer_sees_the_bytes_the_moment_it_sees_the_notification(two, tmp_path):
    """NIXL's promise, checked where it matters: the target acts on the notification at once.
    WRITE: the target's snapshot taken the instant get_new_notifs returns it already holds
    every written block. READ: the target overwrites its blocks the instant it is told, and
    the initiator still got the original bytes (the READ was over before the notification)."""
    nixl, me, mine, peer, local, remote = two
    rng = np.random.default_rng(21)
    theirs = peer.initial()[0].reshape(BLOCKS, BS)

    def post_watched(op, scribble, msg):
        """Posts ``op`` of MOVED random blocks while the peer watches; (handle, local ids,
        remote ids, the peer's snapshot at the notification)."""
        lids, rids = rng.choice(BLOCKS, MOVED, replace=False), rng.choice(BLOCKS, MOVED, replace=False)
        peer.watch(tmp_path / f"{op}.bin", scribble=scribble)
        h = me.make_prepped_xfer(op, local, lids, remote, rids, notif_msg=msg)
        me.transfer(h)
        seen, snap = peer.watched()
        assert seen == {"initiator": [msg]}
        return h, lids, rids, snap[0].reshape(BLOCKS, BS)

    mine[:] = np.random.default_rng(22).integers(0, 256, mine.size, dtype=np.uint8)
    h, w_src, w_dst, snap = post_watched("WRITE", False, b"w-now")
    expect = theirs.copy()
    expect[w_dst] = mine.reshape(BLOCKS, BS)[w_src]
    assert np.array_equal(snap, expect)
    assert wait_state(me, h, 60) == "DONE", h.error
    me.release_xfer_handle(h)

    mine[:] = 0
    h, r_dst, r_src, _ = post_watched("READ", True, b"r-now")
    assert wait_state(me, h, 60) == "DONE", h.error
    assert np.array_equal(mine.reshape(BLOCKS, BS)[r_dst], expect[r_src])
    assert (peer.dump(tmp_path)[0] == 0xFF).all()  # the scribble did land, after the READ
    me.release_xfer_handle(h)


def test_a_peer_that_fails_to_start_says_why():
    """A peer whose registration fails reports the engine's error, kind and exit status
    instead of "said nothing" (the GPU suite skips on such a finding, e.g. gdr.ucx-no-cuda)."""
    with pytest.raises(PeerFailed) as e:
        Peer("broken", 0, 4096, seed=1)
    assert e.value.returncode == 3
    assert e.value.kind is not None
    assert "length 0" in str(e.value) or "empty" in str(e.value), str(e.value)


def test_nixl_errors_for_bad_indices_agents_and_handles(two):
    nixl, me, mine, peer, local, remote = two
    with pytest.raises(nixl.nixlInvalidParamError) as e:
        me.make_prepped_xfer("READ", local, [0, BLOCKS], remote, [0, 1])
    assert "position 1" in str(e.value)
    with pytest.raises(nixl.nixlInvalidParamError):
        me.make_prepped_xfer("READ", local, [-1], remote, [0])
    with pytest.raises(nixl.nixlInvalidParamError):
        me.make_prepped_xfer("READ", local, [0, 1], remote, [0])
    with pytest.raises(nixl.nixlInvalidParamError):
        me.make_prepped_xfer("COPY", local, [0], remote, [0])
    with pytest.raises(nixl.nixlInvalidParamError):
        me.make_prepped_xfer("READ", remote, [0], local, [0])  # sides swapped
    # An unknown agent, and memory the remote's metadata does not hold.
    with pytest.raises(nixl.nixlNotFoundError):
        me.prep_xfer_dlist("nobody", blocks_of(peer.bases[0], 1, BS), "DRAM")
    with pytest.raises(nixl.nixlNotFoundError):
        me.prep_xfer_dlist("target", [(peer.bases[0] + BLOCKS * BS - 10, 20, 0)], "DRAM")
    with pytest.raises(nixl.nixlNotFoundError):
        me.prep_xfer_dlist("NIXL_INIT_AGENT", [(12345, 10, 0)], "DRAM")
    with pytest.raises(nixl.nixlNotFoundError):
        me.send_notif("nobody", b"x")
    # Descriptors of different lengths paired.
    short = me.prep_xfer_dlist("NIXL_INIT_AGENT", [(mine.ctypes.data, 512, 0)], "DRAM")
    with pytest.raises(nixl.nixlMismatchError):
        me.make_prepped_xfer("READ", short, [0], remote, [0])
    # Handles never posted, released, or never made.
    h = me.make_prepped_xfer("READ", local, [0], remote, [0])
    with pytest.raises(nixl.nixlNotPostedError):
        me.check_xfer_state(h)
    me.release_xfer_handle(h)
    for call in (lambda: me.check_xfer_state(h), lambda: me.transfer(h), lambda: me.release_xfer_handle(h)):
        with pytest.raises(nixl.nixlNotFoundError):
            call()
    me.release_dlist_handle(short)
    with pytest.raises(nixl.nixlNotFoundError):
        me.make_prepped_xfer("READ", short, [0], remote, [0])
    with pytest.raises(nixl.nixlNotFoundError):
        me.release_dlist_handle(short)
    # Every one of them is also a gdpath error and the RuntimeError NIXL raises.
    assert issubclass(nixl.nixlNotFoundError, RuntimeError)
    import gdpath

    assert issubclass(nixl.nixlNotFoundError, gdpath.GdpathError)
    # Metadata that is not gdpath.nixl's, or malformed, or too large.
    for blob in (b"", b"nixl-binary", b"gdpath.nixl/1\n{", b"gdpath.nixl/1\n" + b" " * (2 << 20),
                 b'gdpath.nixl/1\n{"name":"x","address":"a","regions":[["DRAM",0,-1,1,1]]}'):
        with pytest.raises(nixl.nixlInvalidParamError):
            me.add_remote_agent(blob)
    # After remove_remote_agent, the agent is unknown.
    me.remove_remote_agent("target")
    with pytest.raises(nixl.nixlNotFoundError):
        me.prep_xfer_dlist("target", blocks_of(peer.bases[0], 1, BS), "DRAM")
    with pytest.raises(nixl.nixlNotFoundError):
        me.remove_remote_agent("target")


@pytest.mark.parametrize("fault", ["killed", "frozen"])
def test_a_peer_lost_mid_transfer_gives_err_within_the_deadline(fault):
    """A target killed (SIGKILL) or frozen (SIGSTOP) while a 256 MiB READ of 65,536 blocks is
    in flight: the state becomes "ERR" by the transfer's 5 s deadline, never a hang; the
    error carries gdpath's kind."""
    import gdpath.nixl as nixl

    blocks, bs = 65536, 4096
    peer = Peer("victim", blocks, bs, seed=4)
    me = nixl.nixl_agent("reader", _cfg(nixl, timeout=5.0, op_timeout=5.0))
    try:
        mine = np.zeros(blocks * bs, dtype=np.uint8)
        me.register_memory([(mine.ctypes.data, mine.nbytes, 0, "")], "DRAM")
        me.add_remote_agent(peer.metadata)
        local = me.prep_xfer_dlist("", blocks_of(mine.ctypes.data, blocks, bs), "DRAM")
        remote = me.prep_xfer_dlist("victim", blocks_of(peer.bases[0], blocks, bs), "DRAM")
        ids = np.random.default_rng(2).permutation(blocks)
        h = me.make_prepped_xfer("READ", local, ids, remote, ids, notif_msg=b"never")
        start = time.monotonic()
        state = me.transfer(h)
        if fault == "killed":
            peer.proc.kill()
        else:
            peer.proc.send_signal(signal.SIGSTOP)
        if state == "DONE":
            pytest.skip("the 256 MiB READ completed before the fault landed; nothing to test")
        state = wait_state(me, h, 30)
        took = time.monotonic() - start
        assert state == "ERR", (state, took)
        assert took < 5.0 + 3.0, took
        err = h.error
        assert isinstance(err, nixl.nixlError) and err.kind in (
            "peer_failed", "deadline_exceeded", "cancelled", "protocol", "ucx"), repr(err)
        assert isinstance(err, (nixl.nixlRemoteDisconnectError, nixl.nixlCancelledError, nixl.nixlBackendError))
        with pytest.raises(nixl.nixlError):
            asyncio.run(_await(h))
        print(f"\n{fault}: ERR after {took:.2f} s: {err!r}")
    finally:
        if peer.proc.poll() is None:
            peer.proc.send_signal(signal.SIGCONT)
            peer.proc.kill()
        peer.proc.wait(10)
        me.close()


def test_side_channel_metadata_over_the_authenticated_channel():
    """fetch_remote_metadata and send_local_metadata travel gdpath's token-authenticated
    channel: with the token both sides learn each other; a fetch without it is refused."""
    import gdpath.nixl as nixl

    token = "side-channel-token-0123456789"
    os.environ["GDPATH_TOKEN"] = token
    try:
        peer = Peer("listener", 16, 4096)
    finally:
        del os.environ["GDPATH_TOKEN"]
    me = nixl.nixl_agent("asker", _cfg(nixl, token=token))
    try:
        host, port = peer.address.rsplit(":", 1)
        assert not me.check_remote_metadata("listener")
        me.fetch_remote_metadata("listener", host, int(port))
        end = time.monotonic() + 20
        while not me.check_remote_metadata("listener") and time.monotonic() < end:
            time.sleep(0.05)
        assert me.check_remote_metadata("listener")
        # The listener added us to answer; our push is accepted too.
        assert json.loads(peer.ask("remotes asker")) is True
        me.send_local_metadata(host, int(port))
        # Without the token, the channel refuses the request.
        stranger = nixl.nixl_agent("stranger", _cfg(nixl, token="wrong-token-but-long-enough"))
        with pytest.raises(nixl.nixlRemoteDisconnectError) as e:
            stranger.fetch_remote_metadata("listener", host, int(port))
        assert e.value.kind == "auth_failed"
        stranger.close()
        # A blob whose address answers with another agent's name is refused.
        forged = me.get_agent_metadata().replace(b'"name":"asker"', b'"name":"listener2"')
        other = nixl.nixl_agent("third", _cfg(nixl))
        with pytest.raises(nixl.nixlError):
            other.add_remote_agent(forged)
        other.close()
    finally:
        me.close()
        peer.close()


def test_vllm_nixl_connector_call_sequence(tmp_path):
    """The decode side as vLLM's NixlConnector drives NIXL: per-layer KV caches registered
    with get_reg_descs/register_memory, metadata exchanged, one prep_xfer_dlist over every
    layer with block-granular descriptors for each side (vLLM's src_xfer_side_handle and
    dst_xfer_side_handles), descriptor ids region_id * num_blocks + block_id,
    make_prepped_xfer("READ", ..., notif_msg=request id), transfer, poll check_xfer_state,
    release; the prefill side sees the request id in get_new_notifs."""
    import gdpath.nixl as nixl
    from gdpath.nixl import nixl_agent as NixlWrapper, nixl_agent_config

    layers, num_blocks, block_len = 4, 512, 2048  # 4 layers' K or V caches
    prefill = Peer("prefill-engine", num_blocks, block_len, seed=8, layers=layers)
    wrapper = NixlWrapper("decode-engine", nixl_agent_config(backends=["UCX"], net_devices="lo"))
    try:
        caches = [np.zeros(num_blocks * block_len, dtype=np.uint8) for _ in range(layers)]
        caches_data = [(c.ctypes.data, c.nbytes, 0, "") for c in caches]
        descs = wrapper.get_reg_descs(caches_data, "DRAM")
        wrapper.register_memory(descs, backends=["UCX"])
        blocks_data = [(c.ctypes.data + b * block_len, block_len, 0) for c in caches for b in range(num_blocks)]
        src_handle = wrapper.prep_xfer_dlist("NIXL_INIT_AGENT", wrapper.get_xfer_descs(blocks_data, "DRAM"))
        remote_name = wrapper.add_remote_agent(prefill.metadata)
        remote_blocks = [(base + b * block_len, block_len, 0) for base in prefill.bases for b in range(num_blocks)]
        dst_handle = wrapper.prep_xfer_dlist(remote_name, wrapper.get_xfer_descs(remote_blocks, "DRAM"))

        def descs_ids(block_ids):
            return np.array([r * num_blocks + b for r in range(layers) for b in block_ids], dtype=np.int64)

        rng = np.random.default_rng(1)
        requests = {}
        # Each request's blocks in slots of their own (vLLM's block manager gives them).
        free = rng.permutation(num_blocks)
        for k, req in enumerate(("req-1", "req-2")):
            local_ids = free[k * 100:(k + 1) * 100]
            remote_ids = rng.choice(num_blocks, 100, replace=False)
            handle = wrapper.make_prepped_xfer("READ", src_handle, descs_ids(local_ids), dst_handle,
                                               descs_ids(remote_ids), notif_msg=req.encode())
            assert wrapper.transfer(handle) in ("DONE", "PROC")
            requests[req] = (handle, local_ids, remote_ids)
        for req, (handle, local_ids, remote_ids) in requests.items():
            end = time.monotonic() + 60
            while (state := wrapper.check_xfer_state(handle)) == "PROC" and time.monotonic() < end:
                time.sleep(0.001)
            assert state == "DONE", handle.error
            wrapper.release_xfer_handle(handle)
        theirs = prefill.initial()
        for req, (handle, local_ids, remote_ids) in requests.items():
            for layer in range(layers):
                got = caches[layer].reshape(num_blocks, block_len)[local_ids]
                assert np.array_equal(got, theirs[layer].reshape(num_blocks, block_len)[remote_ids]), (req, layer)
        notifs = prefill.notifs(2)
        assert sorted(notifs["decode-engine"]) == [b"req-1", b"req-2"]
        wrapper.release_dlist_handle(src_handle)
        wrapper.release_dlist_handle(dst_handle)
        wrapper.remove_remote_agent(remote_name)
        wrapper.deregister_memory(descs, backends=["UCX"])
    finally:
        wrapper.close()
        prefill.close()


def test_loopback_transfer_and_runs_of_a_prepared_list():
    """A list over two regions with two strides is cut into runs; a loopback READ between
    them (remote side prepared with this agent's own name) moves the right bytes, and a
    request touching more runs than block transfers are worth goes as one pair list."""
    import gdpath.nixl as nixl
    from gdpath.nixl._api import _MAX_GROUPS

    me = nixl.nixl_agent("solo", _cfg(nixl))
    try:
        a = np.arange(1 << 16, dtype=np.uint8)
        b = np.zeros(1 << 16, dtype=np.uint8)
        me.register_memory([(a.ctypes.data, a.nbytes, 0, ""), (b.ctypes.data, b.nbytes, 0, "")], "DRAM")
        # 8 blocks of 256 B step 256, then 8 step 1024, all in a.
        src = [(a.ctypes.data + i * 256, 256, 0) for i in range(8)] + [(a.ctypes.data + 4096 + i * 1024, 256, 0) for i in range(8)]
        dst = [(b.ctypes.data + i * 256, 256, 0) for i in range(16)]
        rs = me.prep_xfer_dlist("solo", src, "DRAM")
        ld = me.prep_xfer_dlist("NIXL_INIT_AGENT", dst, "DRAM")
        assert len(me._prepped[int(rs)].runs) == 2
        h = me.make_prepped_xfer("READ", ld, list(range(16)), rs, list(range(15, -1, -1)))
        assert me.transfer(h) in ("DONE", "PROC") and wait_state(me, h, 30) == "DONE", h.error
        for i in range(16):
            s = src[15 - i]
            off = s[0] - a.ctypes.data
            assert np.array_equal(b[i * 256:(i + 1) * 256], a[off:off + 256])
        # Descriptors at random places: one run each, more than _MAX_GROUPS: one pair list.
        rng = np.random.default_rng(4)
        offs = rng.choice((1 << 16) // 64, 2 * _MAX_GROUPS, replace=False) * 64
        scattered = me.prep_xfer_dlist("solo", [(a.ctypes.data + int(o), 64, 0) for o in offs], "DRAM")
        flat = me.prep_xfer_dlist("", [(b.ctypes.data + i * 64, 64, 0) for i in range(len(offs))], "DRAM")
        b[:] = 0
        h = me.make_prepped_xfer("READ", flat, range(len(offs)), scattered, range(len(offs)))
        assert h._xfer.pairs is not None
        assert me.transfer(h) in ("DONE", "PROC") and wait_state(me, h, 30) == "DONE", h.error
        for i, o in enumerate(offs):
            assert np.array_equal(b[i * 64:(i + 1) * 64], a[o:o + 64])
    finally:
        me.close()


def test_install_resolves_nixl_to_gdpath_and_never_shadows_a_real_one(tmp_path):
    """In a fresh interpreter: install() makes nixl, nixl._api and nixl._bindings gdpath's;
    uninstall() undoes it. With a (stand-in) NIXL on the path, install() refuses, force=True
    shadows it and uninstall() gives it back."""
    code = textwrap.dedent(
        """
        import importlib, sys
        import gdpath.nixl as g
        try:
            import nixl
            had_real = True
        except ImportError:
            had_real = False
        sys.modules.pop("nixl", None)
        if had_real:
            try:
                g.install()
                raise SystemExit("install() shadowed a real NIXL")
            except ImportError as e:
                assert "force=True" in str(e), e
            g.install(force=True)
        else:
            g.install()
        import nixl
        from nixl import nixl_agent
        from nixl._api import nixl_agent as NixlWrapper, nixl_agent_config
        from nixl._bindings import nixlNotFoundError
        assert nixl is g and NixlWrapper is g.nixl_agent is nixl_agent
        assert nixlNotFoundError is g.nixlNotFoundError and g.installed()
        g.uninstall()
        assert not g.installed()
        try:
            import nixl as after
            print("after:", getattr(after, "REAL", False))
        except ImportError:
            print("after: gone")
        """
    )
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "after: gone"
    fake = tmp_path / "nixl"
    fake.mkdir()
    (fake / "__init__.py").write_text("REAL = True\n")
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "after: True"


if __name__ == "__main__" and len(sys.argv) >= 6 and sys.argv[1] == "peer":
    _peer_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]),
               int(sys.argv[6]) if len(sys.argv) > 6 else 1)


def _vllm_ids(regions: int, num_blocks: int, block_ids) -> np.ndarray:
    """vLLM's _get_block_descs_ids: region_id * num_blocks + block_id, region-major."""
    return (np.arange(regions)[:, None] * num_blocks + np.asarray(block_ids)[None, :]).ravel()


def test_an_80_layer_vllm_request_posts_one_block_transfer_per_region():
    """80 layers x K and V (160 regions, as vLLM's FlashAttention registers a 70B model): one
    make_prepped_xfer posts one prepared block transfer per region (not a descriptor-pair list
    built in Python), byte-exact, loopback within one process."""
    import gdpath.nixl as nixl

    regions, blocks, bs = 160, 64, 256
    me = nixl.nixl_agent("kv80", _cfg(nixl))
    try:
        src = [np.random.default_rng(r).integers(0, 256, blocks * bs, dtype=np.uint8) for r in range(regions)]
        dst = [np.zeros(blocks * bs, dtype=np.uint8) for _ in range(regions)]
        me.register_memory(me.get_reg_descs([(p.ctypes.data, p.nbytes, 0, "") for p in src + dst], "DRAM"))
        lh = me.prep_xfer_dlist("NIXL_INIT_AGENT", [(p.ctypes.data + b * bs, bs, 0) for p in dst for b in range(blocks)], "DRAM")
        rh = me.prep_xfer_dlist("kv80", [(p.ctypes.data + b * bs, bs, 0) for p in src for b in range(blocks)], "DRAM")
        rng = np.random.default_rng(5)
        lb, rb = rng.permutation(blocks)[:40], rng.permutation(blocks)[:40]
        h = me.make_prepped_xfer("READ", lh, _vllm_ids(regions, blocks, lb), rh, _vllm_ids(regions, blocks, rb))
        assert wait_state(me, h, 60) == "DONE" if me.transfer(h) == "PROC" else True
        assert me.check_xfer_state(h) == "DONE", h.error
        assert len(h.transfers) == regions
        for r in range(regions):
            assert np.array_equal(dst[r].reshape(blocks, bs)[lb], src[r].reshape(blocks, bs)[rb]), r
    finally:
        me.close()


def test_descriptors_that_form_no_runs_post_as_one_column_list():
    """A prepared list in shuffled address order (no two neighbours a run): the request is one
    engine post of descriptor pairs built from NumPy columns, byte-exact; lengths that differ
    raise nixlMismatchError naming both descriptors."""
    import gdpath.nixl as nixl

    n, bs = 4096, 64
    me = nixl.nixl_agent("cols", _cfg(nixl))
    try:
        src = np.random.default_rng(1).integers(0, 256, n * bs, dtype=np.uint8)
        dst = np.zeros(n * bs, dtype=np.uint8)
        me.register_memory(me.get_reg_descs([(a.ctypes.data, a.nbytes, 0, "") for a in (src, dst)], "DRAM"))
        order = np.random.default_rng(2).permutation(n)
        lh = me.prep_xfer_dlist("NIXL_INIT_AGENT", [(dst.ctypes.data + int(b) * bs, bs, 0) for b in order], "DRAM")
        rh = me.prep_xfer_dlist("cols", [(src.ctypes.data + int(b) * bs, bs, 0) for b in order[::-1]], "DRAM")
        idx = np.arange(n)
        h = me.make_prepped_xfer("READ", lh, idx, rh, idx)
        if me.transfer(h) == "PROC":
            wait_state(me, h, 60)
        assert me.check_xfer_state(h) == "DONE", h.error
        assert len(h.transfers) == 1
        assert np.array_equal(dst.reshape(n, bs)[order], src.reshape(n, bs)[order[::-1]])
        odd = me.prep_xfer_dlist("NIXL_INIT_AGENT", [(dst.ctypes.data + int(b) * bs, bs // 2, 0) for b in order], "DRAM")
        with pytest.raises(nixl.nixlMismatchError) as e:
            me.make_prepped_xfer("READ", odd, idx, rh, idx)
        assert "local descriptor 0 is 32 bytes" in str(e.value)
    finally:
        me.close()


def test_vllm_imports_config_and_telemetry_after_install(tmp_path):
    """vLLM's exact imports (``from nixl._api import nixl_agent as NixlWrapper`` and
    ``from nixl._bindings import nixlXferTelemetry`` in one try block) and its agent
    construction (``NixlWrapper(str(uuid.uuid4()), nixl_agent_config(num_threads=4,
    capture_telemetry=True))``), then get_xfer_telemetry after DONE as its _pop_done_transfers
    calls it, send_notif(agent, notif_msg=...) for a full prefix hit, and FlashInfer's K/V
    halves of one region prepared as separate runs (vLLM's blocks-first layout)."""
    import uuid

    import gdpath.nixl as gn

    if importlib_util_find("nixl") is not None:
        pytest.skip("a real NIXL is installed here: install() refuses to shadow it (tested apart)")
    gn.install()
    try:
        from nixl._api import nixl_agent as NixlWrapper
        from nixl._api import nixl_agent_config
        from nixl._bindings import nixlXferTelemetry

        layers, num_blocks, block_len = 2, 64, 1024  # FlashInfer: [num_blocks, 2, ...] per layer
        prefill = Peer("prefill-fi", num_blocks, block_len, seed=9, layers=layers)
        wrapper = NixlWrapper(str(uuid.uuid4()), nixl_agent_config(num_threads=4, capture_telemetry=True, net_devices="lo"))
        try:
            caches = [np.zeros(num_blocks * block_len, dtype=np.uint8) for _ in range(layers)]
            wrapper.register_memory(wrapper.get_reg_descs([(c.ctypes.data, c.nbytes, 0, "") for c in caches], "DRAM"), backends=["UCX"])
            half = block_len // 2

            def fi_blocks(bases):  # K halves of every block, then V halves, per layer
                out = []
                for base in bases:
                    out += [(base + b * block_len, half, 0) for b in range(num_blocks)]
                    out += [(base + b * block_len + half, half, 0) for b in range(num_blocks)]
                return out

            src = wrapper.prep_xfer_dlist("NIXL_INIT_AGENT", wrapper.get_xfer_descs(fi_blocks([c.ctypes.data for c in caches]), "DRAM"))
            name = wrapper.add_remote_agent(prefill.metadata)
            dst = wrapper.prep_xfer_dlist(name, wrapper.get_xfer_descs(fi_blocks(prefill.bases), "DRAM"))
            local_ids, remote_ids = np.arange(10, 30), np.arange(40, 60)
            li, ri = _vllm_ids(2 * layers, num_blocks, local_ids), _vllm_ids(2 * layers, num_blocks, remote_ids)
            h = wrapper.make_prepped_xfer("READ", src, li, dst, ri, notif_msg=b"req-fi:1")
            wrapper.transfer(h)
            assert wait_state(wrapper, h, 60) == "DONE", h.error
            tel = wrapper.get_xfer_telemetry(h)
            assert isinstance(tel, nixlXferTelemetry)
            assert (tel.totalBytes, tel.descCount) == (len(li) * half, len(li))
            assert tel.xferDuration >= tel.postDuration >= 0 and tel.startTime > 0
            wrapper.release_xfer_handle(h)
            theirs = prefill.initial()
            for layer in range(layers):
                got = caches[layer].reshape(num_blocks, block_len)[local_ids]
                assert np.array_equal(got, theirs[layer].reshape(num_blocks, block_len)[remote_ids]), layer
            wrapper.send_notif(name, notif_msg=b"req-hit:1")  # a full prefix-cache hit
            assert sorted(prefill.notifs(2)[wrapper.name]) == [b"req-fi:1", b"req-hit:1"]
            wrapper.release_dlist_handle(src)
            wrapper.release_dlist_handle(dst)
            wrapper.remove_remote_agent(name)
        finally:
            wrapper.close()
            prefill.close()
        # Without capture_telemetry, NIXL's NIXL_ERR_NO_TELEMETRY.
        plain = NixlWrapper("plain", nixl_agent_config(net_devices="lo"))
        try:
            buf = np.zeros(64, dtype=np.uint8)
            plain.register_memory([(buf.ctypes.data, 64, 0, "")], "DRAM")
            a = plain.prep_xfer_dlist("NIXL_INIT_AGENT", [(buf.ctypes.data, 32, 0)], "DRAM")
            b = plain.prep_xfer_dlist("plain", [(buf.ctypes.data + 32, 32, 0)], "DRAM")
            h = plain.make_prepped_xfer("WRITE", a, [0], b, [0])
            plain.transfer(h)
            wait_state(plain, h, 30)
            with pytest.raises(gn.nixlNoTelemetryError):
                plain.get_xfer_telemetry(h)
        finally:
            plain.close()
    finally:
        gn.uninstall()


def importlib_util_find(name: str):
    import importlib.util

    return importlib.util.find_spec(name)


def test_hostile_metadata_is_refused_and_bounded(two):
    """A blob nested deeper than Python's stack, a region whose end overflows 2^64, a bool
    where an int belongs: nixlInvalidParamError, nothing added. A blob that claims a larger
    region than the peer exported: the transfer past the real end fails with a NIXL error
    before any byte moves, and nothing outside the registered memory is read."""
    nixl, me, mine, peer, local, remote = two
    magic = b"gdpath.nixl/1\n"
    body = json.loads(peer.metadata[len(magic):])
    deep = magic + b"[" * 100_000 + b"]" * 100_000
    over = dict(body, name="over", regions=[["DRAM", 0, 2**64 - 16, 32, 1]])
    boolean = dict(body, name="bool", regions=[["DRAM", 0, True, 32, 1]])
    for blob in (deep, magic + json.dumps(over).encode(), magic + json.dumps(boolean).encode()):
        with pytest.raises(nixl.nixlInvalidParamError):
            me.add_remote_agent(blob)
    assert set(me._remotes) == {"target"}
    # The peer's real export is BLOCKS * BS bytes; the blob claims twice that.
    (mt, dv, base, n, eid), = body["regions"]
    big = dict(body, regions=[[mt, dv, base, 2 * n, eid]])
    assert me.add_remote_agent(magic + json.dumps(big).encode()) == "target"
    past = me.prep_xfer_dlist("target", blocks_of(base, 2 * BLOCKS, BS), "DRAM")
    mine[:] = 7
    with pytest.raises(nixl.nixlError):
        h = me.make_prepped_xfer("READ", local, [0, 1], past, [1, BLOCKS + 1])
        me.transfer(h)
        assert wait_state(me, h, 30) == "ERR"
        raise h.error
    assert (mine[:2 * BS] == 7).all()


def test_release_and_deregister_under_a_live_transfer(two):
    """Releasing a handle twice raises nixlNotFoundError; releasing it in flight cancels it;
    deregistering memory a transfer holds raises NIXL's error or waits, never frees memory
    under it; huge NumPy index dtypes raise nixlInvalidParamError."""
    nixl, me, mine, peer, local, remote = two
    for bad in (np.array([2**63 + 5], dtype=np.uint64), np.array([0.5]), np.array([[0]]), np.array([True])):
        with pytest.raises(nixl.nixlInvalidParamError):
            me.make_prepped_xfer("READ", local, bad, remote, np.zeros(len(bad.ravel()), dtype=np.int64))
    idx = np.arange(BLOCKS)
    h = me.make_prepped_xfer("READ", local, idx, remote, idx[::-1])
    me.transfer(h)
    me.release_xfer_handle(h)  # in flight or done: either way the handle is gone
    with pytest.raises(nixl.nixlNotFoundError):
        me.release_xfer_handle(h)
    h = me.make_prepped_xfer("READ", local, idx, remote, idx[::-1])
    state = me.transfer(h)
    reg = me.get_reg_descs([(mine.ctypes.data, mine.nbytes, 0, "")], "DRAM")
    if state == "PROC":
        try:
            me.deregister_memory(reg)
        except nixl.nixlError:
            pass  # refused while the transfer holds it: the memory stays registered
    assert wait_state(me, h, 60) in ("DONE", "ERR")


def test_a_pushed_blob_is_taken_only_from_the_agent_it_names(two):
    """A side-channel push or fetch carrying a blob that names another agent changes nothing:
    it would replace that agent's region table without its authenticated connection."""
    nixl, me, mine, peer, local, remote = two
    magic = b"gdpath.nixl/1\n"
    body = json.loads(peer.metadata[len(magic):])
    (mt, dv, base, n, eid), = body["regions"]
    forged = magic + json.dumps(dict(body, regions=[[mt, dv, base + BS, n - BS, eid]])).encode()
    before = list(me._remotes["target"].regions)
    for tag in (nixl._api._MD_PUSH, nixl._api._MD_FETCH):
        assert me._handle_control("mallory@127.0.0.1:9", tag + forged)
        assert list(me._remotes["target"].regions) == before
    # The agent itself may push its own metadata.
    assert me._handle_control("target@127.0.0.1:9", nixl._api._MD_PUSH + forged)
    assert list(me._remotes["target"].regions) != before
