"""The GPU suite of block transfers from Python (H200 machine): KV layouts of PyTorch CUDA
tensors (vLLM's FlashAttention layer shape) and pinned host tiers (FlashInfer's order), blocks
moved GPU → pinned host, pinned host → GPU and GPU → GPU with every copy method the ``cuda``
backend has (``copies``, ``driver-batch``, ``kernel``) and with its own choice, each result
checked against PyTorch's indexing of the same tensors; the path and method reported; ``await``;
ids in GPU memory refused; pageable host memory with a GPU method refused.

Every test skips, saying why, without a usable GPU (no CUDA driver, no PyTorch with CUDA). Run:
``python -m pytest -rs crates/gdpath-py/tests/test_gpu_blocks.py``.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import gdpath
from gdpath import KvLayout
from test_gpu import NO_GPU, _torch

pytestmark = pytest.mark.gpu

METHODS = [None, "copies", "driver-batch", "kernel"]


@pytest.fixture(scope="module")
def gagent():
    if NO_GPU:
        pytest.skip(NO_GPU)
    return gdpath.Agent(name="gpu-blocks")


def _ids(torch, n_from: int, n_to: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n_from, generator=g)[:k], torch.randperm(n_to, generator=g)[:k]


def _report(what: str, rep, method):
    p = rep.pairs[0]
    b = p.batch
    assert b is not None, p
    if method is not None:
        assert b.method == method, (what, b)
    print(f"{what}, {method or 'auto'}: path {p.path}, {b}, {rep.gbps:.1f} GB/s, "
          f"{b.post_us_per_descriptor:.3f} µs/descriptor to post")
    return p


def test_kv_blocks_gpu_to_pinned_host_and_back_every_method(gagent):
    torch = _torch()
    n, tokens, heads, dim = 4096, 16, 8, 64  # blocks of 16 KiB per K/V plane
    pool = torch.randn((2, n, tokens, heads, dim), dtype=torch.float16, device="cuda:0")
    back = torch.zeros_like(pool)
    tier = torch.zeros((2 * n, 2, tokens, heads, dim), dtype=torch.float16).pin_memory()
    torch.cuda.synchronize()
    gl = KvLayout.from_tensor(gagent, pool, kv_dim=0, block_dim=1)
    bl = KvLayout.from_tensor(gagent, back, kv_dim=0, block_dim=1)
    hl = KvLayout.from_tensor(gagent, tier, block_dim=0, kv_dim=1)
    assert gl.region.device == "cuda:0" and hl.region.pinned
    assert gl.block_bytes == hl.block_bytes == tokens * heads * dim * 2
    k = 2000
    for i, method in enumerate(METHODS):
        s, d = _ids(torch, n, 2 * n, k, i)
        tier.zero_()
        back.zero_()
        torch.cuda.synchronize()
        off = gagent.prepare_blocks(gl, hl, method=method)
        assert off.is_block_list and off.plan.backend == "cuda", off
        p = _report("GPU → pinned host", off.transfer(s, d).wait(), method)
        assert p.path == "d2h-pinned", p
        assert p.batch.descriptors == 2 * k
        for kv in range(2):
            assert torch.equal(tier[d, kv], pool[kv, s.cuda()].cpu()), (method, kv)
        # Reload into the other GPU pool at the ids they came from.
        rep = gagent.transfer_blocks(hl, bl, d, s, method=method).wait()
        p = _report("pinned host → GPU", rep, method)
        assert p.path == "h2d-pinned", p
        torch.cuda.synchronize()
        sd = s.cuda()
        assert torch.equal(back[:, sd], pool[:, sd]), method
        rest = torch.ones(n, dtype=torch.bool, device="cuda:0")
        rest[sd] = False
        assert not back[:, rest].any(), "a block not in the list was written"


def test_kv_blocks_within_one_gpu_every_method(gagent):
    torch = _torch()
    n, bs = 8192, 64 << 10
    src = torch.randint(0, 256, (n, bs), dtype=torch.uint8, device="cuda:0")
    dst = torch.zeros_like(src)
    torch.cuda.synchronize()
    sl = KvLayout.from_tensor(gagent, src)
    dl = KvLayout.from_tensor(gagent, dst)
    assert (sl.block_bytes, sl.num_blocks) == (bs, n)
    for i, method in enumerate(METHODS):
        s, d = _ids(torch, n, n, n // 2, 10 + i)
        dst.zero_()
        torch.cuda.synchronize()
        rep = gagent.prepare_blocks(sl, dl, method=method).transfer(s.numpy(), d.numpy().astype(np.int32)).wait()
        p = _report("GPU → GPU", rep, method)
        assert p.path == "device-local", p
        assert rep.bytes == (n // 2) * bs
        torch.cuda.synchronize()
        assert torch.equal(dst[d.cuda()], src[s.cuda()]), method


def test_kv_blocks_gpu_to_gpu1_where_two_gpus_exist(gagent):
    torch = _torch()
    if torch.cuda.device_count() < 2:
        pytest.skip(f"{torch.cuda.device_count()} GPU visible: GPU0 → GPU1 needs two")
    n, bs = 4096, 64 << 10
    src = torch.randint(0, 256, (n, bs), dtype=torch.uint8, device="cuda:0")
    dst = torch.zeros((n, bs), dtype=torch.uint8, device="cuda:1")
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    s, d = _ids(torch, n, n, n, 20)
    rep = gagent.transfer_blocks(KvLayout.from_tensor(gagent, src), KvLayout.from_tensor(gagent, dst), s, d).wait()
    _report("GPU0 → GPU1", rep, None)
    torch.cuda.synchronize(1)
    assert torch.equal(dst[d.to("cuda:1")].cpu(), src[s.cuda()].cpu())


def test_await_gpu_block_transfers(gagent):
    torch = _torch()
    n, bs = 1024, 16 << 10
    src = torch.randint(0, 256, (n, bs), dtype=torch.uint8, device="cuda:0")
    host = torch.zeros((n, bs), dtype=torch.uint8).pin_memory()
    torch.cuda.synchronize()
    off = gagent.prepare_blocks(KvLayout.from_tensor(gagent, src), KvLayout.from_tensor(gagent, host))
    quarters = [torch.arange(i * n // 4, (i + 1) * n // 4) for i in range(4)]

    async def main():
        return await asyncio.gather(*[off.transfer(q, q.flip(0)) for q in quarters])

    reps = asyncio.run(asyncio.wait_for(main(), 60))
    assert [r.pairs[0].path for r in reps] == ["d2h-pinned"] * 4
    for q in quarters:
        assert torch.equal(host[q.flip(0)], src[q.cuda()].cpu())


def test_gpu_ids_and_pageable_gpu_methods_are_refused(gagent):
    torch = _torch()
    n, bs = 64, 4096
    src = torch.randint(0, 256, (n, bs), dtype=torch.uint8, device="cuda:0")
    pageable = np.zeros((n, bs), dtype=np.uint8)
    torch.cuda.synchronize()
    gl = KvLayout.from_tensor(gagent, src)
    hl = KvLayout.from_tensor(gagent, pageable, pinned=False)
    prepared = gagent.prepare_blocks(gl, hl)
    with pytest.raises(TypeError, match="GPU memory"):
        prepared.transfer(torch.arange(4, device="cuda:0"), torch.arange(4, device="cuda:0"))
    # Pageable host memory moves with the copies method only.
    rep = prepared.transfer(np.arange(4), np.arange(4)).wait()
    print("GPU → pageable host:", rep.pairs[0])
    assert np.array_equal(pageable[:4], src[:4].cpu().numpy())
    with pytest.raises(gdpath.TransferError) as e:
        gagent.prepare_blocks(gl, hl, method="kernel").transfer([5], [5]).wait()
    assert e.value.kind == "unsupported", e.value
    assert not pageable[5].any()
