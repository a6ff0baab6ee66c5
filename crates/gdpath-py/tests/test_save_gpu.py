"""The GPU suite of ``gdpath.safetensors.save_file`` (H200 machine): PyTorch CUDA tensors of
every dtype PyTorch has (zero-size ones too) and CuPy arrays saved straight from GPU memory,
read back equal by ``safetensors.torch.load_file`` and by gdpath's loader onto the GPU, and
the same bytes as ``safetensors.torch.save_file``'s file of the same tensors.

Every test skips, saying why, without a usable GPU (no CUDA driver, no PyTorch with CUDA, no
CuPy). Run: ``python -m pytest -rs crates/gdpath-py/tests/test_save_gpu.py``.
"""

from __future__ import annotations

import pytest

import gdpath.safetensors as gst
from test_gpu import _cupy, _torch
from test_save import torch_bits, torch_random

pytestmark = pytest.mark.gpu


def test_torch_cuda_tensors_save_and_load_back_equal(scratch):
    torch = _torch()
    import safetensors.torch

    ts = {}
    for name, dt in gst._torch_dtypes().items():
        ts[name] = torch_random(torch, dt, (257, 34), "cuda:0")
        ts[name + ".empty"] = torch.empty(0, 4, dtype=dt, device="cuda:0")
        # A 0-d tensor of its own storage, made as bytes (no copy kernel for every dtype).
        if name != "F4":  # a 0-d F4 tensor holds two values the header's shape [] cannot count
            ts[name + ".scalar"] = torch_random(torch, dt, (), "cuda:0")
    ts["strided"] = torch.arange(4096, dtype=torch.float32, device="cuda:0").reshape(64, 64).t()
    ts["big"] = torch.randn(16 << 20, device="cuda:0")  # 64 MiB: many staged chunks
    path = scratch / "gpu.safetensors"
    r = gst.save_file(ts, path, metadata={"format": "pt"})
    print(f"save_file: {r['file_bytes']} bytes in {r['elapsed']:.3f} s, {r['gbps']:.2f} GB/s "
          f"via {r['paths']} ({r['finding']})")
    assert r["fsync"] is True and r["tensors"] == len(ts)
    back = safetensors.torch.load_file(str(path), device="cpu")
    assert sorted(back) == sorted(ts)
    for k, t in ts.items():
        bits = t.view(torch_bits(torch, t))
        want = bits.contiguous().cpu().view(t.dtype)
        assert back[k].dtype == want.dtype and back[k].shape == want.shape, k
        if want.numel():
            assert torch.equal(back[k].reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)), k
    ours = gst.load_file(path, device="cuda:0")
    for k, t in ts.items():
        assert ours[k].device == t.device and ours[k].dtype == t.dtype, k
        if t.numel():
            assert torch.equal(ours[k].view(torch_bits(torch, t)), t.view(torch_bits(torch, t)).contiguous()), k
    # Slices with a step on the GPU, read without the prefetch (copied to the device as bytes).
    with gst.safe_open(path, "pt", device="cuda:0", prefetch=False) as f:
        for name in ("F4", "F8_E8M0", "BF16"):
            if name in ts:
                got = f.get_slice(name)[0:9:3]
                want = ts[name].view(torch_bits(torch, ts[name]))[0:9:3]
                assert got.device == ts[name].device and got.dtype == ts[name].dtype, name
                assert torch.equal(got.view(want.dtype), want), name
    theirs = scratch / "theirs.safetensors"
    contiguous = {k: t for k, t in ts.items() if t.is_contiguous()}
    gst.save_file(contiguous, path, metadata={"format": "pt"})
    # safetensors gets host copies of the same bytes (its own device move is not under test).
    host = {k: t.view(torch_bits(torch, t)).cpu().view(t.dtype) for k, t in contiguous.items()}
    safetensors.torch.save_file(host, str(theirs), metadata={"format": "pt"})
    assert path.read_bytes() == theirs.read_bytes()


def test_cupy_arrays_save_from_the_gpu(scratch):
    cp = _cupy()
    import numpy as np
    import safetensors.numpy

    arrays = {"f32": cp.arange(1 << 20, dtype=cp.float32), "u8": cp.arange(4097, dtype=cp.uint8),
              "empty": cp.zeros((0, 2), dtype=cp.float64)}
    path = scratch / "cupy.safetensors"
    gst.save_file(arrays, path)
    back = safetensors.numpy.load_file(str(path))
    for k, a in arrays.items():
        assert np.array_equal(back[k], cp.asnumpy(a)), k
