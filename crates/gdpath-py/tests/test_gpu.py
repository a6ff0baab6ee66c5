"""The GPU suite of the Python module (H200 machine): PyTorch and CuPy memory on the GPU
registered and moved, pinned host memory recognised, DLPack round trips,
``gdpath.safetensors.load_file(device="cuda:0")`` byte-exact against ``safetensors``, the one
allocation freed with its last tensor, and ``await`` on GPU transfers.

Every test skips, saying why, without a usable GPU (no CUDA driver, no PyTorch with CUDA, no
CuPy). Run: ``.venv/bin/python -m pytest -rs crates/gdpath-py/tests/test_gpu.py``.
"""

from __future__ import annotations

import asyncio
import gc
import json
import struct

import numpy as np
import pytest

import gdpath
import gdpath.safetensors as gst
from conftest import minilm

pytestmark = pytest.mark.gpu


def _why_no_gpu() -> str | None:
    a = gdpath.Agent()
    if "cuda" not in a.backends:
        return "no CUDA driver or no GPU: the agent has no cuda backend"
    return None


NO_GPU = _why_no_gpu()


def _torch():
    if NO_GPU:
        pytest.skip(NO_GPU)
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA device")
    torch.zeros(1, device="cuda:0")  # CUDA up before timing or comparing
    return torch


def _cupy():
    if NO_GPU:
        pytest.skip(NO_GPU)
    return pytest.importorskip("cupy", reason="CuPy is not installed")


@pytest.fixture(scope="module")
def gagent():
    if NO_GPU:
        pytest.skip(NO_GPU)
    return gdpath.Agent(name="gpu-tests")


def test_torch_tensors_on_the_gpu_are_registered_and_moved(gagent, scratch):
    torch = _torch()
    n = 8 << 20
    data = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
    g = torch.zeros(n, dtype=torch.uint8, device="cuda:0")
    rg = gagent.register(g)
    assert (rg.device, rg.source, len(rg)) == ("cuda:0", "dlpack", n)
    # Pageable host → GPU: the staged path, with the finding that says why.
    rep = gagent.post("write", gagent.register(data), rg).wait()
    p = rep.pairs[0]
    assert (p.path, p.finding) == ("h2d-pageable", "system.host-pageable"), p
    torch.cuda.synchronize()
    assert np.array_equal(g.cpu().numpy(), data)
    # A pinned torch tensor is recognised as pinned: the direct copy engine path.
    pinned = torch.empty(n, dtype=torch.uint8).pin_memory()
    rp = gagent.register(pinned)
    assert rp.pinned and rp.kind == "host (pinned)"
    rep = gagent.post("read", rp, rg).wait()
    assert rep.pairs[0].path == "d2h-pinned", rep.pairs[0]
    assert np.array_equal(pinned.numpy(), data)
    # Pageable memory pinned on request.
    host = np.zeros(n, dtype=np.uint8)
    rh = gagent.register(host, pinned=True)
    assert rh.pinned
    assert gagent.post("read", rh, rg).wait().pairs[0].path == "d2h-pinned"
    assert np.array_equal(host, data)
    # GPU → GPU within one device, and a sub-range.
    g2 = torch.zeros(n, dtype=torch.uint8, device="cuda:0")
    r2 = gagent.register(g2)
    rep = gagent.post("write", rg[4096:8192], r2[0:4096]).wait()
    assert rep.pairs[0].path == "device-local"
    torch.cuda.synchronize()
    assert torch.equal(g2[:4096], g[4096:8192])
    # File → GPU on the best path the machine has (GDS, else staged through pinned buffers).
    (scratch / "f").write_bytes(data.tobytes())
    f = gagent.register(gdpath.File(str(scratch / "f")))
    g3 = torch.zeros(n, dtype=torch.uint8, device="cuda:0")
    rep = gagent.post("read", gagent.register(g3), f.desc(0, n)).wait()
    print("file → GPU:", rep.pairs[0])
    assert rep.pairs[0].path in ("gds-native", "gds-compat", "posix-direct", "posix-buffered", "staged")
    torch.cuda.synchronize()
    assert np.array_equal(g3.cpu().numpy(), data)


def test_cupy_arrays_and_cuda_array_interface_objects(gagent):
    cp = _cupy()
    n = 1 << 20
    data = np.random.default_rng(2).integers(0, 256, n, dtype=np.uint8)
    a = cp.zeros(n, dtype=cp.uint8)
    ra = gagent.register(a)
    assert (ra.device, ra.source) == ("cuda:0", "dlpack")
    gagent.post("write", gagent.register(data), ra).wait()
    assert np.array_equal(cp.asnumpy(a), data)

    class OnlyCAI:
        def __init__(self, x):
            self.x = x
            self.__cuda_array_interface__ = x.__cuda_array_interface__

    b = cp.zeros(n, dtype=cp.uint8)
    rb = gagent.register(OnlyCAI(b), gpu=0)
    assert rb.source == "cuda_array_interface"
    assert gagent.post("write", ra, rb).wait().pairs[0].path == "device-local"
    cp.cuda.runtime.deviceSynchronize()
    assert cp.array_equal(a, b)


def _checkpoint(path, ts):
    header, data, at = {}, bytearray(), 0
    for name, (dt, shape, raw) in ts.items():
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [at, at + len(raw)]}
        data += raw
        at += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + bytes(data))
    return path


def _dtypes_checkpoint(path):
    sizes = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
             "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
    rng = np.random.default_rng(3)
    ts = {}
    for dt, size in sizes.items():
        for shape in ([64, 33], [0, 5], []):
            n = int(np.prod(shape)) if shape else 1
            raw = rng.integers(0, 256, n * size, dtype=np.uint8)
            if dt == "BOOL":
                raw %= 2
            ts[f"{dt}.{len(shape)}.{n}"] = (dt, shape, raw.tobytes())
    return _checkpoint(path, ts)


def test_load_file_on_cuda_is_byte_exact_against_safetensors(gagent, scratch):
    torch = _torch()
    import safetensors.torch

    p = _dtypes_checkpoint(scratch / "d.safetensors")
    got = gst.load_file(p, device="cuda:0", agent=gagent)
    want = safetensors.torch.load_file(str(p), device="cpu")
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        g = got[k]
        assert (g.dtype, tuple(g.shape), str(g.device)) == (w.dtype, tuple(w.shape), "cuda:0"), k
        assert torch.equal(g.cpu().reshape(-1).view(torch.uint8), w.reshape(-1).view(torch.uint8)), k
    # CPU tensors too, and the real checkpoint.
    got = gst.load_file(p, device="cpu", agent=gagent)
    for k, w in want.items():
        assert torch.equal(got[k].reshape(-1).view(torch.uint8), w.reshape(-1).view(torch.uint8)), k
    m = minilm()
    if m is not None:
        got = gst.load_file(m, device="cuda:0", agent=gagent)
        want = safetensors.torch.load_file(str(m), device="cuda:0")
        for k, w in want.items():
            assert torch.equal(got[k], w), k


def test_dlpack_round_trips(gagent, scratch):
    torch = _torch()
    p = _dtypes_checkpoint(scratch / "r.safetensors")
    loaded = gdpath.Checkpoint([str(p)]).load(gagent, gpu=0)
    for i, t in enumerate(loaded.tensors):
        v = loaded.view(i)
        assert v.__dlpack_device__() == (2, 0)
        x = torch.from_dlpack(v)
        assert (x.dtype, x.numel(), str(x.device)) == (torch.uint8, t.nbytes, "cuda:0")
        # And back in: a torch tensor made from gdpath's view registers as GPU memory.
        if t.nbytes:
            r = gagent.register(x)
            assert (r.device, len(r)) == ("cuda:0", t.nbytes)
    try:
        import cupy as cp
    except ImportError:
        cp = None
    if cp is not None:
        i = next(i for i, t in enumerate(loaded.tensors) if t.nbytes)
        c = cp.from_dlpack(loaded.view(i))
        assert cp.asnumpy(c).tobytes() == torch.from_dlpack(loaded.view(i)).cpu().numpy().tobytes()


def test_the_allocation_is_freed_with_its_last_tensor(gagent, scratch):
    torch = _torch()
    n = 64
    raw = np.random.default_rng(4).integers(0, 256, 4 << 20, dtype=np.uint8).tobytes()
    ts = {f"t{i}": ("U8", [4 << 20], raw) for i in range(n)}  # 256 MiB
    p = _checkpoint(scratch / "big.safetensors", ts)
    # The agent's one-time GPU setup (cuFile's driver, the CUDA modules) is not the allocation
    # under test: a first load of the same file pays it before the measurement.
    gst.load_file(p, device="cuda:0", agent=gagent).clear()
    gc.collect()
    gagent.register(bytearray(1))
    torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info(0)[0]
    d = gst.load_file(p, device="cuda:0", agent=gagent)
    free1 = torch.cuda.mem_get_info(0)[0]
    assert free0 - free1 >= n * (4 << 20), (free0, free1)
    keep = d["t7"]
    del d
    gc.collect()
    gagent.register(bytearray(1))  # releases references dropped without the GIL
    assert torch.cuda.mem_get_info(0)[0] <= free1 + (8 << 20), "freed while a tensor lives"
    assert keep.cpu().numpy().tobytes() == raw
    del keep
    gc.collect()
    gagent.register(bytearray(1))
    assert torch.cuda.mem_get_info(0)[0] >= free0 - (8 << 20), "not freed with the last tensor"


def test_await_gpu_transfers(gagent):
    torch = _torch()
    n = 32 << 20
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda:0")
    dst = torch.empty(n, dtype=torch.uint8).pin_memory()
    torch.cuda.synchronize()
    rs, rd = gagent.register(src), gagent.register(dst)

    async def main():
        ts = [gagent.post("read", rd[i * (n // 4):(i + 1) * (n // 4)], rs[i * (n // 4):(i + 1) * (n // 4)])
              for i in range(4)]
        return await asyncio.gather(*ts)

    reps = asyncio.run(asyncio.wait_for(main(), 60))
    assert [r.pairs[0].path for r in reps] == ["d2h-pinned"] * 4
    assert torch.equal(dst.cuda(), src)
