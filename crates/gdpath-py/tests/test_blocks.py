"""Block transfers (KV caches) from Python on the CPU: NumPy host pools ↔ host pools through the
engine's ``host-copy`` backend, byte-exact against NumPy's own indexing of the same arrays;
layouts from tensor shapes (vLLM's and FlashInfer's), prepared transfers re-posted with new
ids, ids of every integer type, the report's method and counts, a file tier (expanded into
descriptor pairs), ``await``, and every bad layout and id refused with ``gdpath.BlockError``
(or ``ReadOnlyMemoryError``) and nothing moved."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import gdpath
from gdpath import BlockError, KvLayout


def pattern(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def expected(dst_before, src, sl: KvLayout, dl: KvLayout, s_ids, d_ids) -> np.ndarray:
    """What the destination must hold, from the layout formula of KvLayout's documentation
    (offset + l × layer_stride + k × kv_stride + id × block_stride), not from the engine."""
    out = dst_before.copy()
    bs = sl.block_bytes
    for s, d in zip(s_ids, d_ids):
        for l in range(sl.num_layers):
            for k in range(sl.kv_planes):
                so = sl.offset + l * sl.layer_stride + k * sl.kv_stride + int(s) * sl.block_stride
                do = dl.offset + l * dl.layer_stride + k * dl.kv_stride + int(d) * dl.block_stride
                out[do:do + bs] = src[so:so + bs]
    return out


def test_a_layer_major_pool_to_a_block_major_tier_is_byte_exact(agent):
    # GPU-style cache [layers][2][blocks][bs] → CPU tier [2 × blocks][layers][2][bs].
    bs, n, L = 256, 64, 3
    src_arr = pattern(L * 2 * n * bs, 1)
    src = KvLayout(agent.register(src_arr), bs, n, num_layers=L, kv_planes=2)
    assert (src.block_stride, src.kv_stride, src.layer_stride) == (bs, n * bs, 2 * n * bs)
    assert src.block_offset(7, layer=2, plane=1) == 2 * 2 * n * bs + n * bs + 7 * bs
    dst_arr = np.zeros(2 * n * L * 2 * bs, dtype=np.uint8)
    dst = KvLayout(agent.register(dst_arr), bs, 2 * n, block_stride=L * 2 * bs, num_layers=L,
                   layer_stride=2 * bs, kv_planes=2, kv_stride=bs)
    assert dst.bytes_per_block == L * 2 * bs
    rng = np.random.default_rng(2)
    s_ids = rng.choice(n, 40, replace=False)
    d_ids = rng.choice(2 * n, 40, replace=False)
    prepared = agent.prepare_blocks(src, dst)
    assert prepared.is_block_list
    assert (prepared.plan.backend, prepared.plan.path) == ("host-copy", "host-copy")
    before = dst_arr.copy()
    rep = prepared.transfer(s_ids, d_ids).wait()
    assert rep.bytes == 40 * L * 2 * bs and len(rep.pairs) == 1
    p = rep.pairs[0]
    assert (p.path, p.finding) == ("host-copy", None), p
    assert p.batch is not None and p.batch.method == "copies", p
    assert p.batch.descriptors == 40 * L * 2 and 1 <= p.batch.coalesced <= p.batch.descriptors
    assert np.array_equal(dst_arr, expected(before, src_arr, src, dst, s_ids, d_ids))
    # Posted again with new ids of other integer types (int32, uint64, a list, a range):
    # nothing is prepared again.
    for s, d in [
        (np.arange(10, dtype=np.int32), np.arange(100, 110, dtype=np.int32)),
        (np.array([63, 0], dtype=np.uint64), np.array([0, 127], dtype=np.uint64)),
        ([5, 6, 7], np.array([20, 21, 22], dtype=np.uint32)),
        (range(30, 33), [1, 2, 3]),
        (np.array([9, 8], dtype=np.int16), np.array([50, 51], dtype=np.int64)),
    ]:
        before = dst_arr.copy()
        prepared.transfer(s, d).wait()
        assert np.array_equal(dst_arr, expected(before, src_arr, src, dst, list(s), list(d))), (s, d)


def test_runs_of_ids_are_merged_and_the_counts_reported(agent):
    bs, n = 4096, 1000
    a = np.zeros(n * bs, dtype=np.uint8)
    b = np.zeros(n * bs, dtype=np.uint8)
    a[:] = pattern(n * bs, 3)
    la, lb = KvLayout(agent.register(a), bs, n), KvLayout(agent.register(b), bs, n)
    rep = agent.transfer_blocks(la, lb, np.array([3, 4, 5, 900]), np.array([0, 1, 2, 7])).wait()
    batch = rep.pairs[0].batch
    assert (batch.descriptors, batch.coalesced) == (4, 2), batch  # 3,4,5 → 0,1,2 merged
    assert batch.post_ns >= 0 and batch.post_us_per_descriptor >= 0
    assert rep.bytes == 4 * bs
    assert b[:3 * bs].tobytes() == a[3 * bs:6 * bs].tobytes()
    assert b[7 * bs:8 * bs].tobytes() == a[900 * bs:901 * bs].tobytes()
    assert not b[3 * bs:7 * bs].any() and not b[8 * bs:].any()
    print("host-copy, 4 ids:", rep.pairs[0], batch)


def test_layouts_from_tensor_shapes_move_what_numpy_indexing_says(agent):
    rng = np.random.default_rng(4)
    n, tokens, heads, dim = 32, 16, 4, 8
    # vLLM's FlashAttention layer: [2, num_blocks, block_size, heads, head_dim], fp16.
    gpu_like = rng.standard_normal((2, n, tokens, heads, dim)).astype(np.float16)
    src = KvLayout.from_tensor(agent, gpu_like, kv_dim=0, block_dim=1)
    block = tokens * heads * dim * 2
    assert (src.block_bytes, src.num_blocks, src.block_stride) == (block, n, block)
    assert (src.kv_planes, src.kv_stride, src.num_layers) == (2, n * block, 1)
    assert src.region.obj is gpu_like and len(src.region) == gpu_like.nbytes
    # FlashInfer's order on the host tier: [num_blocks, 2, block_size, heads, head_dim].
    tier = np.zeros((3 * n, 2, tokens, heads, dim), dtype=np.float16)
    dst = KvLayout.from_tensor(agent, tier, block_dim=0, kv_dim=1)
    assert (dst.block_stride, dst.kv_stride) == (2 * block, block)
    s_ids = rng.choice(n, 12, replace=False)
    d_ids = rng.choice(3 * n, 12, replace=False)
    agent.transfer_blocks(src, dst, s_ids, d_ids).wait()
    for k in range(2):
        assert np.array_equal(tier[d_ids, k], gpu_like[k, s_ids])
    untouched = np.setdiff1d(np.arange(3 * n), d_ids)
    assert not tier[untouched].any()
    # A region already registered from the tensor is reused; the layer dimension too.
    layered = rng.standard_normal((3, 2, n, tokens, dim)).astype(np.float32)
    r = agent.register(layered)
    lay = KvLayout.from_tensor(r, layered, layer_dim=0, kv_dim=1, block_dim=2)
    assert lay.region.id == r.id
    assert (lay.num_layers, lay.layer_stride, lay.block_bytes) == (3, 2 * n * tokens * dim * 4, tokens * dim * 4)
    # Negative indices count from the end, as in Python.
    flat = np.zeros((n, 64), dtype=np.uint8)
    assert KvLayout.from_tensor(agent, flat, block_dim=-2).block_bytes == 64


def test_prepared_ids_are_kept_and_posted_again(agent):
    bs, n = 64, 16
    a = pattern(n * bs, 5)
    b = np.zeros(n * bs, dtype=np.uint8)
    la, lb = KvLayout(agent.register(a), bs, n), KvLayout(agent.register(b), bs, n)
    s_ids = np.array([1, 2, 3])
    prepared = agent.prepare_blocks(la, lb, s_ids, [10, 11, 12])
    s_ids[:] = 0  # the prepared transfer keeps its own copy
    prepared.transfer().wait()
    assert b[10 * bs:13 * bs].tobytes() == a[1 * bs:4 * bs].tobytes()
    b[:] = 0
    prepared.transfer().wait()
    assert b[10 * bs:13 * bs].tobytes() == a[1 * bs:4 * bs].tobytes()
    # No ids anywhere, or one side only: TypeError.
    bare = agent.prepare_blocks(la, lb)
    with pytest.raises(TypeError, match="no block ids"):
        bare.transfer()
    with pytest.raises(TypeError, match="both"):
        bare.transfer([1])
    with pytest.raises(TypeError, match="both"):
        agent.prepare_blocks(la, lb, [1])


def test_await_a_block_transfer(agent):
    bs, n = 1024, 256
    a = pattern(n * bs, 6)
    b = np.zeros(n * bs, dtype=np.uint8)
    prepared = agent.prepare_blocks(KvLayout(agent.register(a), bs, n), KvLayout(agent.register(b), bs, n))
    ids = np.random.default_rng(7).permutation(n)

    async def main():
        return await prepared.transfer(ids, np.arange(n), timeout=30)

    rep = asyncio.run(asyncio.wait_for(main(), 30))
    assert rep.pairs[0].batch.descriptors == n
    assert np.array_equal(b.reshape(n, bs), a.reshape(n, bs)[ids])


def test_blocks_to_a_file_tier_expand_into_pairs(agent, scratch):
    bs, n = 4096, 32
    a = pattern(n * bs, 8)
    f = agent.register(gdpath.File(str(scratch / "kv.bin"), "w"))
    prepared = agent.prepare_blocks(KvLayout(agent.register(a), bs, n), KvLayout(f, bs, n))
    assert not prepared.is_block_list
    d_ids = np.random.default_rng(9).permutation(n)
    rep = prepared.transfer(np.arange(n), d_ids).wait()
    assert rep.bytes == n * bs
    assert all(p.path in ("posix-direct", "posix-buffered") for p in rep.pairs), rep.pairs
    on_disk = np.frombuffer((scratch / "kv.bin").read_bytes(), dtype=np.uint8).reshape(n, bs)
    want = np.zeros((n, bs), dtype=np.uint8)
    want[d_ids] = a.reshape(n, bs)
    assert np.array_equal(on_disk, want)


# --- refusals: typed, with the engine's fields, nothing moved ---------------------------------


@pytest.fixture
def pools(agent):
    bs, n = 128, 8
    a = pattern(n * bs, 10)
    b = np.zeros(n * bs, dtype=np.uint8)
    return a, b, KvLayout(agent.register(a), bs, n), KvLayout(agent.register(b), bs, n)


@pytest.mark.parametrize(
    "s_ids, d_ids, reason, attrs",
    [
        ([0, 8], [0, 1], "id_out_of_range", {"side": "source", "position": 1, "id": 8, "blocks": 8}),
        ([0, 1], [2, 99], "id_out_of_range", {"side": "destination", "position": 1, "id": 99}),
        ([0, -1], [0, 1], "negative_id", {"side": "source", "position": 1, "id": -1}),
        ([0, 1], [3, 3], "duplicate_destination", {"position": 1, "id": 3}),
        ([0, 1, 2], [0, 1], "id_count_mismatch", {"src": 3, "dst": 2}),
        ([], [], "empty", {}),
    ],
)
def test_bad_ids_raise_block_errors_and_move_nothing(agent, pools, s_ids, d_ids, reason, attrs):
    a, b, la, lb = pools
    prepared = agent.prepare_blocks(la, lb)
    with pytest.raises(BlockError) as e:
        prepared.transfer(np.array(s_ids, dtype=np.int64), np.array(d_ids, dtype=np.int64))
    err = e.value
    assert (err.kind, err.reason) == ("blocks", reason), err
    for k, v in attrs.items():
        assert getattr(err, k) == v, (k, err)
    assert isinstance(err, gdpath.DescriptorError) and isinstance(err, ValueError)
    assert not b.any(), "nothing moves when the ids are refused"
    # The same through transfer_blocks, and with lists.
    with pytest.raises(BlockError, match="block transfer"):
        agent.transfer_blocks(la, lb, list(s_ids), list(d_ids))


def test_ids_above_the_int64_range_keep_their_value(agent, pools):
    """A uint64 id 2^64 - 1 was reported as 9223372036854775807 (prepared ids, ids of two
    types, Python ints): every path now names the id given."""
    a, b, la, lb = pools
    top = 2**64 - 1
    u64 = np.array([0, top], dtype=np.uint64)
    cases = [
        ("uint64 arrays", u64, np.array([0, 1], dtype=np.uint64)),
        ("uint64 and int64", u64, np.array([0, 1], dtype=np.int64)),
        ("int32 and uint64", np.array([0, 1], dtype=np.int32), np.array([2, top], dtype=np.uint64)),
        ("Python ints", [0, top], [0, 1]),
    ]
    for what, s, d in cases:
        side = "destination" if what.startswith("int32") else "source"
        for how in ("transfer_blocks", "prepare_blocks"):
            with pytest.raises(BlockError) as e:
                if how == "transfer_blocks":
                    agent.transfer_blocks(la, lb, s, d)
                else:
                    agent.prepare_blocks(la, lb, s, d).transfer()
            err = e.value
            assert (err.reason, err.side, err.position, err.id) == (
                "id_out_of_range", side, 1, top), (what, how, err)
            assert str(top) in str(err), (what, how, err)
    # In the engine's order (position by position, the source first) the first bad id is the
    # error, whether it is negative or huge.
    i64, u64 = np.int64, np.uint64
    with pytest.raises(BlockError) as e:
        agent.transfer_blocks(la, lb, np.array([0, -1], dtype=i64), np.array([1, top], dtype=u64))
    assert (e.value.reason, e.value.side, e.value.id) == ("negative_id", "source", -1)
    with pytest.raises(BlockError) as e:
        agent.transfer_blocks(la, lb, np.array([0, top], dtype=u64), np.array([1, -1], dtype=i64))
    assert (e.value.reason, e.value.side, e.value.id) == ("id_out_of_range", "source", top)
    with pytest.raises(BlockError) as e:
        agent.transfer_blocks(la, lb, [-3, top], [0, 1])
    assert (e.value.reason, e.value.id) == ("negative_id", -3)
    # An int no id type holds names itself.
    with pytest.raises(OverflowError, match=r"src_ids\[1\] is 1180591620717411303424"):
        agent.transfer_blocks(la, lb, [0, 2**70], [0, 1])
    assert not b.any(), "nothing moves when the ids are refused"


def test_a_block_read_and_written_on_one_region_is_refused(agent, pools):
    a, _, la, _ = pools
    with pytest.raises(BlockError) as e:
        agent.transfer_blocks(la, la, [0, 1], [1, 2])
    assert e.value.reason == "source_is_destination" and e.value.id == 1
    # Disjoint ids on one region are fine.
    before = a.copy()
    agent.transfer_blocks(la, la, [0], [5]).wait()
    assert a[5 * 128:6 * 128].tobytes() == before[:128].tobytes()


def test_bad_layouts_are_refused_at_prepare(agent):
    bs, n = 256, 16
    a = pattern(n * bs, 11)
    b = np.zeros(n * bs, dtype=np.uint8)
    ra, rb = agent.register(a), agent.register(b)
    ok = KvLayout(ra, bs, n)
    cases = [
        # One block more than the region holds: the first block that does not fit is named.
        (KvLayout(rb, bs, n + 1), "out_of_bounds", {"side": "destination", "first_bad": n, "region_len": n * bs}),
        (KvLayout(rb, bs, n, offset=1), "out_of_bounds", {"first_bad": n - 1}),
        # Destination slots that overlap.
        (KvLayout(rb, bs, n, block_stride=bs - 1), "overlap", {"dim": "blocks", "stride": bs - 1, "needed": bs}),
        # Another block size.
        (KvLayout(rb, bs // 2, n), "mismatch", {"what": "block size", "src": bs, "dst": bs // 2}),
        (KvLayout(rb, 0, n), "mismatch", {}),
    ]
    for dst, reason, attrs in cases:
        with pytest.raises(BlockError) as e:
            agent.prepare_blocks(ok, dst)
        assert e.value.reason == reason, (dst, e.value)
        for k, v in attrs.items():
            assert getattr(e.value, k) == v, (k, e.value)
    with pytest.raises(BlockError) as e:
        agent.prepare_blocks(KvLayout(ra, 0, n), KvLayout(rb, 0, n))
    assert (e.value.reason, e.value.side) == ("zero_block_size", "source")
    with pytest.raises(BlockError) as e:
        agent.prepare_blocks(KvLayout(ra, bs, 0), KvLayout(rb, bs, 0))
    assert (e.value.reason, e.value.dim) == ("zero_count", "blocks")
    # A source may read past nothing either.
    with pytest.raises(BlockError) as e:
        agent.prepare_blocks(KvLayout(ra, bs, n, layer_stride=bs, num_layers=2), KvLayout(rb, bs, n // 2, num_layers=2))
    assert (e.value.reason, e.value.side) == ("out_of_bounds", "source")
    # One region with two layouts.
    with pytest.raises(BlockError) as e:
        agent.prepare_blocks(KvLayout(ra, bs, n), KvLayout(ra, bs, n // 2))
    assert e.value.reason == "shared_region_layouts"
    assert not b.any()


def test_read_only_memory_is_never_a_destination(agent):
    bs, n = 64, 8
    src = pattern(n * bs, 12)
    ro = np.zeros(n * bs, dtype=np.uint8)
    ro.flags.writeable = False
    for region in (agent.register(ro), agent.register(bytes(n * bs)),
                   agent.register(np.zeros(n * bs, dtype=np.uint8), read_only=True)):
        with pytest.raises(gdpath.ReadOnlyMemoryError) as e:
            agent.prepare_blocks(KvLayout(agent.register(src), bs, n), KvLayout(region, bs, n))
        assert e.value.kind == "read_only_memory", e.value
    assert not ro.any()
    # Read-only memory is a source like any other.
    out = np.zeros(n * bs, dtype=np.uint8)
    frozen = src.copy()
    frozen.flags.writeable = False
    agent.transfer_blocks(KvLayout(agent.register(frozen), bs, n), KvLayout(agent.register(out), bs, n),
                          [7, 0], [0, 7]).wait()
    assert out[:bs].tobytes() == src[7 * bs:].tobytes() and out[7 * bs:].tobytes() == src[:bs].tobytes()


def test_what_is_not_ids_or_a_layout_is_refused(agent, pools):
    a, b, la, lb = pools
    prepared = agent.prepare_blocks(la, lb)
    with pytest.raises(TypeError, match="src_ids"):
        prepared.transfer(np.array([0.5, 1.0]), [0, 1])
    with pytest.raises(TypeError, match="dst_ids"):
        prepared.transfer([0], "ab")
    with pytest.raises(ValueError, match="method"):
        agent.prepare_blocks(la, lb, method="fast")
    # A GPU method on host memory: the transfer fails with the backend's error, nothing moved.
    with pytest.raises(gdpath.TransferError) as e:
        agent.prepare_blocks(la, lb, method="kernel").transfer([0], [1]).wait()
    assert e.value.kind == "backend", e.value
    assert not b.any()
    # Layout arguments: negative sizes, defaults that overflow.
    with pytest.raises(OverflowError):
        KvLayout(la.region, -1, 4)
    with pytest.raises(ValueError, match="overflows"):
        KvLayout(la.region, 1 << 40, 1 << 30, num_layers=2, kv_planes=2)
    with pytest.raises(IndexError):
        la.block_offset(8)
    # from_tensor: dimensions that are not the leading ones, a block that is not one span,
    # a region of another object, a file.
    t = np.zeros((4, 8, 16), dtype=np.uint8)
    with pytest.raises(ValueError, match="leading"):
        KvLayout.from_tensor(agent, t, block_dim=1)
    with pytest.raises(ValueError, match="different"):
        KvLayout.from_tensor(agent, t, block_dim=0, kv_dim=0)
    with pytest.raises(IndexError):
        KvLayout.from_tensor(agent, t, block_dim=3)
    with pytest.raises(ValueError, match="not registered from this tensor"):
        KvLayout.from_tensor(la.region, t)
    with pytest.raises(TypeError):
        KvLayout.from_tensor("agent", t)
    f = gdpath.File("/dev/null")
    with pytest.raises(TypeError, match="file"):
        KvLayout.from_tensor(agent, f)
