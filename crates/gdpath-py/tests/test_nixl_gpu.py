"""GPU suite of gdpath.nixl (skips with the reason without PyTorch or a CUDA GPU): two
processes on one GPU, VRAM <-> VRAM through CUDA IPC, VRAM -> another process's pinned DRAM,
torch tensors registered directly with ``register_memory(tensor)``, byte-exact.

This file is also the other process (``python test_nixl_gpu.py gpu-peer|pinned-peer ...``).
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

from test_nixl import Peer, PeerFailed, _cfg, _peer_main, blocks_of, wait_state  # noqa: E402

# The engine's finding when the loaded UCX cannot export GPU memory (docs/ucx.md).
UCX_NO_CUDA = "gdr.ucx-no-cuda"
REMEDY = ("set GDPATH_UCX_LIB to a CUDA-enabled libucp.so.0, e.g. the libucx-cu13 wheel's "
          "libucx/lib/libucp.so.0 (docs/nixl.md, 'Running on the GPU machine')")


def ucx_no_cuda_reason(e: BaseException) -> str | None:
    """The skip reason when ``e`` (a NIXL error of this process or a :class:`PeerFailed`) is
    the engine saying the loaded UCX has no CUDA support, else None."""
    if getattr(e, "finding", None) != UCX_NO_CUDA:
        return None
    where = f"peer process: {str(e).splitlines()[0]}" if isinstance(e, PeerFailed) else str(e)
    return f"SKIPPED: the loaded UCX has no CUDA support [{UCX_NO_CUDA}] ({where}); {REMEDY}"


@contextmanager
def skip_without_cuda_ucx():
    """Turns the engine's gdr.ucx-no-cuda (here or in a peer) into a skip that says the
    remedy; any other error passes through."""
    import gdpath.nixl as nixl

    try:
        yield
    except (nixl.nixlError, PeerFailed) as e:
        reason = ucx_no_cuda_reason(e)
        if reason is None:
            raise
        pytest.skip(reason)


def _cuda_or_skip():
    try:
        import torch
    except ImportError:
        pytest.skip("SKIPPED: PyTorch is not installed (the GPU suite needs it)")
    if not torch.cuda.is_available():
        pytest.skip("SKIPPED: no CUDA GPU usable by PyTorch")
    return torch


BLOCKS, BS, MOVED = 8192, 16384, 4000


@pytest.mark.gpu
@pytest.mark.parametrize("peer_mem", ["vram", "pinned"])
def test_gpu_blocks_between_two_processes(peer_mem, tmp_path):
    """READ scattered blocks from the other process's memory into this process's GPU tensor,
    then WRITE others back, each byte-exact: VRAM <-> VRAM (CUDA IPC) with peer_mem "vram",
    VRAM -> another process's pinned DRAM with "pinned"."""
    torch = _cuda_or_skip()
    import gdpath.nixl as nixl

    with skip_without_cuda_ucx():
        peer = Peer(f"gpu-{peer_mem}", BLOCKS, BS, seed=11, script=HERE, mode=f"{peer_mem}-peer")
    me = nixl.nixl_agent("gpu-initiator", _cfg(nixl, timeout=60.0))
    try:
        mine = torch.zeros(BLOCKS * BS, dtype=torch.uint8, device="cuda:0")
        torch.cuda.synchronize()
        with skip_without_cuda_ucx():
            me.register_memory(mine)
        me.add_remote_agent(peer.metadata)
        local = me.prep_xfer_dlist("NIXL_INIT_AGENT", blocks_of(mine.data_ptr(), BLOCKS, BS), "VRAM")
        remote_type = "VRAM" if peer_mem == "vram" else "DRAM"
        remote = me.prep_xfer_dlist(peer.name, blocks_of(peer.bases[0], BLOCKS, BS), remote_type)
        rng = np.random.default_rng(6)
        src, dst = rng.choice(BLOCKS, MOVED, replace=False), rng.choice(BLOCKS, MOVED, replace=False)
        h = me.make_prepped_xfer("READ", local, dst, remote, src, notif_msg=b"r")
        me.transfer(h)
        assert wait_state(me, h, 120) == "DONE", h.error
        print(f"\n{peer_mem} READ paths:", [t.report.paths for t in h.transfers])
        theirs = peer.initial()[0].reshape(BLOCKS, BS)
        got = mine.cpu().numpy().reshape(BLOCKS, BS)
        assert np.array_equal(got[dst], theirs[src])
        assert peer.notifs(1) == {"gpu-initiator": [b"r"]}
        # WRITE from this GPU into the other process's memory.
        mine.copy_(torch.from_numpy(np.random.default_rng(12).integers(0, 256, BLOCKS * BS, dtype=np.uint8)).to("cuda:0"))
        torch.cuda.synchronize()
        w_src, w_dst = rng.choice(BLOCKS, MOVED, replace=False), rng.choice(BLOCKS, MOVED, replace=False)
        h2 = me.make_prepped_xfer("WRITE", local, w_src, remote, w_dst, notif_msg=b"w")
        me.transfer(h2)
        assert wait_state(me, h2, 120) == "DONE", h2.error
        print(f"{peer_mem} WRITE paths:", [t.report.paths for t in h2.transfers])
        assert peer.notifs(1) == {"gpu-initiator": [b"w"]}
        after = peer.dump(tmp_path)[0].reshape(BLOCKS, BS)
        expect = theirs.copy()
        expect[w_dst] = mine.cpu().numpy().reshape(BLOCKS, BS)[w_src]
        assert np.array_equal(after, expect)
    finally:
        me.close()
        peer.close()


@pytest.mark.gpu
def test_torch_tensors_registered_directly_loopback():
    """A list of torch CUDA tensors registered and described as tensors (get_xfer_descs of a
    tensor list), moved GPU -> GPU within this agent (remote side prepared with its own name)."""
    torch = _cuda_or_skip()
    import gdpath.nixl as nixl

    me = nixl.nixl_agent("gpu-solo", _cfg(nixl))
    try:
        a = [torch.randint(0, 255, (1 << 20,), dtype=torch.uint8, device="cuda:0") for _ in range(3)]
        b = [torch.zeros(1 << 20, dtype=torch.uint8, device="cuda:0") for _ in range(3)]
        torch.cuda.synchronize()
        with skip_without_cuda_ucx():
            me.register_memory(a)
        me.register_memory(b)
        rs = me.prep_xfer_dlist("gpu-solo", me.get_xfer_descs(a))
        ld = me.prep_xfer_dlist("NIXL_INIT_AGENT", me.get_xfer_descs(b))
        h = me.make_prepped_xfer("READ", ld, [0, 1, 2], rs, [2, 0, 1])
        me.transfer(h)
        assert wait_state(me, h, 60) == "DONE", h.error
        for i, j in zip([0, 1, 2], [2, 0, 1]):
            assert torch.equal(b[i], a[j])
    finally:
        me.close()


def test_ucx_without_cuda_is_a_skip_with_the_remedy_and_nothing_else_is():
    """CPU: the engine's gdr.ucx-no-cuda, raised here or said by a peer, becomes a skip naming
    GDPATH_UCX_LIB; another finding, or none, still fails the test."""
    import gdpath.nixl as nixl

    here = nixl.nixlNotSupportedError("register descriptor 0: exporting GPU memory with UCX 1.16.0",
                                      "unsupported", UCX_NO_CUDA)
    peer = PeerFailed("p", 3, "Traceback ...", {"error": "register descriptor 0: ...", "kind": "unsupported",
                                                "finding": UCX_NO_CUDA})
    for e in (here, peer):
        assert "GDPATH_UCX_LIB" in ucx_no_cuda_reason(e)
        with pytest.raises(pytest.skip.Exception, match="GDPATH_UCX_LIB"):
            with skip_without_cuda_ucx():
                raise e
    other = nixl.nixlNotSupportedError("x", "unsupported", "gds.no-nvfs")
    for e in (other, PeerFailed("p", 1, "segfault", None), nixl.nixlBackendError("y")):
        assert ucx_no_cuda_reason(e) is None
        with pytest.raises(type(e)):
            with skip_without_cuda_ucx():
                raise e


if __name__ == "__main__" and len(sys.argv) >= 6 and sys.argv[1] in ("vram-peer", "pinned-peer"):
    _peer_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]),
               int(sys.argv[6]) if len(sys.argv) > 6 else 1, where=sys.argv[1].split("-")[0])
