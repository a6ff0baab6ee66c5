"""``gdpath.safetensors`` against the ``safetensors`` package, on the real MiniLM checkpoint
and on generated ones: every dtype the engine knows, zero-size tensors, scalars, metadata,
several shards (a list and an index). Bytes, dtypes, shapes and names must be identical."""

from __future__ import annotations

import gc
import json
import os
import re
import struct
from typing import Any

import numpy as np
import pytest
import safetensors
import safetensors.numpy

import gdpath
import gdpath.safetensors as gst
from conftest import minilm

# Every dtype of the engine's header parser (the `safetensors` crate's Dtype), with its size.
DTYPES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8,
}
NUMPY = {"BOOL", "U8", "I8", "I16", "U16", "F16", "I32", "U32", "F32", "F64", "I64", "U64"}


def tensors(seed: int, prefix: str = ""):
    """Tensors of every dtype and of several shapes (zero-size, scalar, 3-D): name → dtype,
    shape and bytes."""
    rng = np.random.default_rng(seed)
    out = {}
    for i, (dt, size) in enumerate(DTYPES.items()):
        for shape in ([3, 5], [], [0, 4], [2, 1, 3]):
            n = int(np.prod(shape)) if shape else 1
            raw = rng.integers(0, 256, n * size, dtype=np.uint8)
            if dt == "BOOL":
                raw = raw % 2
            elif dt in ("F16", "BF16", "F32", "F64"):
                # Finite values: compare as numbers and as bytes alike.
                raw = np.frombuffer(rng.standard_normal(n).astype(
                    {"F16": np.float16, "BF16": np.float32, "F32": np.float32, "F64": np.float64}[dt]
                ).tobytes(), dtype=np.uint8)
                if dt == "BF16":
                    raw = raw.reshape(-1, 4)[:, 2:].reshape(-1)  # the high half of each f32
            name = f"{prefix}{dt.lower()}.{'x'.join(map(str, shape)) or 'scalar'}"
            out[name] = {"dtype": dt, "shape": shape, "data": raw.tobytes()}
    return out


def write(path, ts, metadata=None):
    """A safetensors file of `ts` in the order given (the format: an 8-byte little-endian header
    length, the JSON header padded with spaces to 8 bytes, the data), written here rather than
    by the package under comparison."""
    header, data, at = {}, bytearray(), 0
    for name, t in ts.items():
        header[name] = {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [at, at + len(t["data"])]}
        data += t["data"]
        at += len(t["data"])
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + bytes(data))
    return path


def file_bytes(path, name):
    """A tensor's bytes as the file has them (header parsed here, independently)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n])
    b, e = h[name]["data_offsets"]
    return raw[8 + n + b:8 + n + e]


def assert_same_numpy(got, want):
    assert list(got) == list(want)  # names, in the same order
    for k in want:
        g, w = got[k], want[k]
        assert (g.dtype, g.shape) == (w.dtype, w.shape), k
        assert g.tobytes() == w.tobytes(), k


def test_minilm_equals_the_safetensors_package():
    path = minilm()
    if path is None:
        pytest.skip("the MiniLM checkpoint is not available (see the printed reason)")
    got = gst.load_file(path, framework="numpy")
    want = safetensors.numpy.load_file(str(path))
    assert len(got) == len(want) == 6 * 16 + 6 + 2
    assert sorted(got) == sorted(want)
    for k in want:
        assert (got[k].dtype, got[k].shape) == (want[k].dtype, want[k].shape), k
        assert np.array_equal(got[k], want[k]), k
    with gst.safe_open(path, framework="numpy") as f, safetensors.safe_open(str(path), "np") as s:
        assert f.keys() == s.keys()
        assert f.metadata() == s.metadata() == {"format": "pt"}
        k = "encoder.layer.3.attention.self.query.weight"
        assert np.array_equal(f.get_tensor(k), s.get_tensor(k))


def test_every_dtype_and_shape_byte_exact(scratch):
    ts = tensors(1)
    p = write(scratch / "all.safetensors", ts, {"format": "np", "k": "v"})
    # NumPy's dtypes: equal to safetensors.numpy, and the same order as the file.
    np_only = {k: v for k, v in ts.items() if v["dtype"] in NUMPY}
    q = write(scratch / "np.safetensors", np_only)
    assert_same_numpy(gst.load_file(q, framework="numpy"), safetensors.numpy.load_file(str(q)))
    # Every dtype, as bytes, through the native loader's views (what torch tensors are built on).
    ck = gdpath.Checkpoint([str(p)])
    loaded = ck.load(gdpath.default_agent())
    assert len(loaded.tensors) == len(ts)
    for i, t in enumerate(loaded.tensors):
        got = np.from_dlpack(loaded.view(i)).tobytes()
        assert got == ts[t.name]["data"] == file_bytes(p, t.name), t.name
        assert (t.dtype, list(t.shape)) == (ts[t.name]["dtype"], ts[t.name]["shape"])
    assert loaded.path in ("posix-direct", "posix-buffered")
    # Dtypes NumPy lacks are refused, as safetensors.numpy refuses them (it raises TypeError
    # for bf16, AttributeError for fp8; gdpath TypeError for both).
    with pytest.raises((TypeError, AttributeError)):
        safetensors.numpy.load_file(str(p))
    with pytest.raises(TypeError, match="NumPy has no dtype"):
        gst.load_file(p, framework="numpy")
    with gst.safe_open(p, framework="numpy") as f, safetensors.safe_open(str(p), "np") as s:
        assert f.keys() == s.keys() and list(f) == s.keys()
        assert f.metadata() == s.metadata() == {"format": "np", "k": "v"}
        for k in s.keys():
            if ts[k]["dtype"] in NUMPY:
                g, w = f.get_tensor(k), s.get_tensor(k)
                assert (g.dtype, g.shape, g.tobytes()) == (w.dtype, w.shape, w.tobytes()), k


def test_several_shards_as_one_plan(scratch):
    shards = [tensors(s, prefix=f"layer{s}.") for s in range(3)]
    shards = [{k: v for k, v in ts.items() if v["dtype"] in NUMPY} for ts in shards]
    names = [f"model-{i + 1:05d}-of-00003.safetensors" for i in range(3)]
    files = [write(scratch / n, ts, {"format": "np"}) for n, ts in zip(names, shards)]
    want = {}
    for f in files:
        want.update(safetensors.numpy.load_file(str(f)))
    index = {"metadata": {"total_size": sum(f.stat().st_size for f in files)},
             "weight_map": {k: n for n, ts in zip(names, shards) for k in ts}}
    ip = scratch / "model.safetensors.index.json"
    ip.write_text(json.dumps(index))
    for arg in (files, ip, [str(f) for f in files]):
        got = gst.load_file(arg, framework="numpy")
        assert_same_numpy(got, want)
    with gst.safe_open(ip, framework="numpy") as f:
        assert f.keys() == sorted(want)
        assert f.metadata() == {"format": "np"}
        assert f.info("layer2.i64.3x5").file == 2
        assert dict(f.tensors()).keys() == want.keys()
    # One allocation, one read per file.
    loaded = gdpath.Checkpoint.open_index(str(ip)).load(gdpath.default_agent())
    assert len(loaded.pairs) == 3 and sum(p.bytes for p in loaded.pairs) >= loaded.tensor_bytes
    # An index that disagrees with its shards is refused.
    index["weight_map"]["layer0.u8.3x5"] = names[1]
    ip.write_text(json.dumps(index))
    with pytest.raises(gdpath.CheckpointError, match="not mapped"):
        gst.load_file(ip, framework="numpy")


def test_tensors_outlive_the_dict_and_the_load(scratch):
    ts = {k: v for k, v in tensors(7).items() if v["dtype"] == "F64"}
    p = write(scratch / "keep.safetensors", ts)
    d = gst.load_file(p, framework="numpy")
    k = next(iter(d))
    keep = d[k]
    del d
    gc.collect()
    # The one allocation lives while a view of it does.
    assert keep.tobytes() == ts[k]["data"]
    # A tensor's memory is writable and its own (as a copy from safetensors would be).
    keep[...] = 0
    assert gst.load_file(p, framework="numpy")[k].tobytes() == ts[k]["data"]


def test_malformed_files_and_unknown_names(scratch):
    p = write(scratch / "ok.safetensors", {k: v for k, v in tensors(2).items() if v["dtype"] == "U8"})
    raw = p.read_bytes()
    (scratch / "cut.safetensors").write_bytes(raw[:-1])
    with pytest.raises(gdpath.CheckpointError) as e:
        gst.load_file(scratch / "cut.safetensors", framework="numpy")
    assert e.value.kind == "checkpoint" and "past the end" in str(e.value)
    with gst.safe_open(p, framework="numpy") as f:
        with pytest.raises(gdpath.CheckpointError, match="File does not contain tensor nope") as e:
            f.get_tensor("nope")
        assert isinstance(e.value, safetensors.SafetensorError)  # the package's own class
    with pytest.raises(ValueError, match="device"):
        gst.load_file(p, framework="numpy", device="cuda:0")
    with pytest.raises(ValueError, match="framework"):
        gst.load_file(p, framework="tf")
    # A path given as bytes is one path (not a list of byte values); a number is no path.
    by_bytes = gst.load_file(os.fsencode(str(p)), framework="numpy")
    by_str = gst.load_file(str(p), framework="numpy")
    assert list(by_bytes) == list(by_str) and len(by_str) > 0
    assert all(np.array_equal(by_bytes[k], by_str[k]) for k in by_str)
    with pytest.raises(TypeError, match="a checkpoint is a path"):
        gst.load_file(3, framework="numpy")
    loaded = gdpath._native.Checkpoint([str(p)]).load(gpu=None)
    for i in (-1, len(loaded.tensors)):
        with pytest.raises(IndexError, match=f"no tensor {i}"):
            loaded.view(i)
    with pytest.raises(ValueError, match="gpu=-2"):
        gdpath._native.Checkpoint([str(p)]).load(gpu=-2)
    # A dict's keys or a set's members are not shards in order (the trial found a dict of
    # path → anything loaded by its keys).
    for unordered in ({str(p): 1}, {str(p)}, frozenset([str(p)])):
        with pytest.raises(TypeError, match="a list of paths, in order"):
            gst.load_file(unordered, framework="numpy")


def test_the_default_framework_without_torch_names_numpy(scratch):
    try:
        import torch  # noqa: F401

        pytest.skip("PyTorch is installed here: the default framework works")
    except ImportError:
        pass
    p = write(scratch / "np.safetensors", {"a": {"dtype": "U8", "shape": [4], "data": b"abcd"}})
    with pytest.raises(ImportError, match='framework="numpy"'):
        gst.load_file(p, device="cpu")
    assert gst.load_file(p, device="cpu", framework="numpy")["a"].tobytes() == b"abcd"


def test_torch_on_the_cpu_equals_safetensors_torch(scratch):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed here (the GPU suite runs these with it)")
    import safetensors.torch

    ts = tensors(3)
    p = write(scratch / "pt.safetensors", ts)
    got = gst.load_file(p, device="cpu")
    want = safetensors.torch.load_file(str(p), device="cpu")
    assert list(got) == list(want) or sorted(got) == sorted(want)
    for k, w in want.items():
        g = got[k]
        assert (g.dtype, g.shape, g.device) == (w.dtype, w.shape, w.device), k
        assert g.reshape(-1).view(torch.uint8).numpy().tobytes() == w.reshape(-1).view(torch.uint8).numpy().tobytes(), k


def test_torch_zero_size_tensors_keep_their_shape_and_dtype(scratch):
    """Tensors without bytes (a zero in the shape) come back from ``load_file``, ``load``,
    ``get_tensor`` and ``get_slice`` with the header's shape and dtype, as from
    ``safetensors.torch`` (PyTorch will not view an empty byte tensor as a wider dtype)."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed here (the GPU suite runs these with it)")
    import safetensors.torch
    import gdpath.safetensors.torch as gtorch

    ts = {"e": torch.zeros((2, 0), dtype=torch.float16), "r": torch.ones((0, 3), dtype=torch.bfloat16),
          "x": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    p = scratch / "zero.safetensors"
    gtorch.save_file(ts, p)
    want = safetensors.torch.load_file(str(p))
    for got in (gtorch.load_file(p), gtorch.load(p.read_bytes()), gst.load_file(p)):
        for k, w in want.items():
            assert (got[k].dtype, got[k].shape) == (w.dtype, w.shape) and torch.equal(got[k], w), k
    with gst.safe_open(p, "pt") as f, safetensors.safe_open(str(p), "pt") as real:
        for k in ("e", "r"):
            assert (f.get_tensor(k).dtype, f.get_tensor(k).shape) == (ts[k].dtype, ts[k].shape)
        for k, index in (("e", slice(None)), ("e", (slice(None), slice(0, 0))), ("x", slice(1, 1)),
                         ("x", (slice(None), slice(2, 2)))):
            g, w = f.get_slice(k)[index], real.get_slice(k)[index]
            assert (g.dtype, g.shape) == (w.dtype, w.shape), (k, index)


def test_torch_slices_follow_pytorch_indexing_as_safetensors(scratch):
    """``get_slice(name)[index]`` with ``framework="pt"`` gives what ``safetensors`` (its
    default backend) gives: PyTorch's indexing (bounds clamped, negative ints, ``None``, lists,
    masks) on tensors with and without rows, 0-d, bf16; PyTorch's exception type where it
    refuses, with either ``backend``."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed here (the GPU suite runs these with it)")
    import safetensors.torch

    gen = torch.Generator().manual_seed(5)
    p = scratch / "slices.safetensors"
    safetensors.torch.save_file({
        "e": torch.zeros((2, 0), dtype=torch.float16), "x": torch.randn(5, 3, generator=gen),
        "z": torch.zeros(0, 3), "s": torch.tensor(3.0), "v": torch.arange(7),
        "b": torch.randn(4, 2, 3, generator=gen).to(torch.bfloat16)}, str(p))
    S, E = slice, Ellipsis
    indexes = [S(None), S(2, 2), S(1, 9), S(-3, None), S(None, None, 2), S(5, 1), S(None, None, 0),
               S(-100, 2), 0, -1, 5, -6, E, None, [], [0, 2], True, (), (E, 0), (0, E),
               (S(1, 3), S(None, None, 2)), (S(None), -1), (None, 0), (1, 2), (1, 2, 3), (E, 1, 1),
               (1, E, 2)]

    def outcome(f: Any, name: str, index: Any) -> Any:
        try:
            t = f.get_slice(name)[index]
        except Exception as e:
            return type(e).__name__
        return tuple(t.shape), t.dtype, t.tolist()

    refused = 0
    for backend in ("mmap", "pread"):
        with safetensors.safe_open(str(p), "pt") as real, gst.safe_open(p, "pt", backend=backend) as ours:
            for name in real.keys():
                for index in indexes:
                    want = outcome(real, name, index)
                    assert outcome(ours, name, index) == want, (backend, name, index)
                    refused += isinstance(want, str)
    assert refused > 10


def test_torch_sharing_helpers_group_every_overlap():
    """``gdpath.safetensors.torch``'s sharing helpers, as ``safetensors.torch``'s: groups in
    the state dict's order, one storage's split where bytes do not overlap, ``_end_ptr`` one
    element past the last; a tensor overlapping a long one but not its neighbour stays in the
    long one's group (safetensors 0.8.0 starts a new group there: docs/python.md)."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed here (the GPU suite runs these with it)")
    from gdpath.safetensors.torch import _end_ptr, _find_shared_tensors, _remove_duplicate_names

    a = torch.zeros(100)
    other = torch.zeros(2)
    assert _find_shared_tensors({"other": other, "long": a, "b": a[10:20], "c": a[30:40]}) == [
        {"other"}, {"long", "b", "c"}]
    assert _find_shared_tensors({"b": a[10:20], "c": a[30:40]}) == [{"b"}, {"c"}]
    assert _remove_duplicate_names({"long": a, "b": a[10:20], "c": a[30:40]}) == {"long": ["b", "c"]}
    t = torch.zeros(4, 6)[:, ::2].t()  # shape (3, 4), strides (2, 6): last element is the 23rd
    assert _end_ptr(t) - t.data_ptr() == 23 * 4
    empty = torch.zeros(0, 3)
    assert _end_ptr(empty) == empty.data_ptr()


def test_a_load_without_an_agent_uses_the_choosers_settings_as_the_cli(scratch):
    """``load`` with no agent takes the storage chooser's settings for the file, the same ones
    ``gdpath load`` prints for it, and a buffered read it chose is not reported as a fallback;
    two loads whose files get the same settings share one agent."""
    from conftest import gdpath_bin
    import subprocess

    ts = {k: t for k, t in tensors(11).items() if t["dtype"] in NUMPY}
    p = scratch / "chosen.safetensors"
    write(p, ts)
    ck = gdpath._native.Checkpoint([str(p)])
    first = ck.load(gpu=None)
    cli = json.loads(
        subprocess.run(
            [str(gdpath_bin()), "load", str(p), "--host", "--json"],
            check=True, capture_output=True, text=True,
        ).stdout
    )
    assert first.chosen == cli["chosen_text"], (first.chosen, cli["chosen_text"])
    assert "buffered" in first.chosen  # a file just written is in the page cache
    assert first.finding is None and first.path == "posix-buffered", (first.finding, first.path)
    threads = lambda: int(open("/proc/self/status").read().split("Threads:")[1].split()[0])
    before = threads()
    again = ck.load(gpu=None)
    assert again.chosen == first.chosen
    # A second agent would have started its own readers (one per chosen thread).
    assert threads() - before < int(first.chosen.split()[0]), (before, threads(), first.chosen)
    got = gst.load_file(p, framework="numpy")
    assert_same_numpy(got, safetensors.numpy.load_file(str(p)))
    # An agent given loads with its own configuration, and says nothing was chosen.
    assert ck.load(gdpath.Agent(name="mine"), gpu=None).chosen is None


def test_direct_overrides_the_choosers_page_cache_choice(scratch):
    """``direct=`` replaces the chooser's O_DIRECT-or-buffered choice, as ``gdpath load
    --direct`` / ``--buffered`` do, and names itself as given; a cold file on a disk is read
    with O_DIRECT by default; ``direct`` with an agent is refused."""
    ts = {k: t for k, t in tensors(12).items() if t["dtype"] in NUMPY}
    p = scratch / "direct.safetensors"
    write(p, ts)
    want = safetensors.numpy.load_file(str(p))
    ck = gdpath._native.Checkpoint([str(p)])
    hot = ck.load(gpu=None, direct=True)  # just written: the chooser alone would read it buffered
    assert "O_DIRECT" in hot.chosen.split(": ")[0] and "(given: direct)" in hot.chosen, hot.chosen
    # O_DIRECT on the disk the scratch dir is on, or the buffered path saying why not.
    assert hot.path == "posix-direct" or hot.finding == "storage.odirect-unsupported", (hot.path, hot.finding)
    assert_same_numpy(gst.load_file(p, framework="numpy", direct=True), want)
    with open(p, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    # "4 threads × 16 MiB, O_DIRECT: cold files (0% in page cache) on ext4: ..." → "O_DIRECT"
    mode = lambda chosen: chosen.split(": ")[0].split(", ")[1]
    cold = ck.load(gpu=None)
    seen = re.match(r"cold files \((?:(\d+)% in page cache|residency unknown)\) on (\w+)",
                    cold.chosen.split(": ")[1])
    buffered = ck.load(gpu=None, direct=False)
    assert mode(buffered.chosen) == "buffered" and "(given: direct)" in buffered.chosen, buffered.chosen
    assert buffered.path == "posix-buffered", buffered.path
    with gst.safe_open(p, framework="numpy", direct=False) as f:
        assert sorted(f.keys()) == sorted(want)
        assert_same_numpy({k: f.get_tensor(k) for k in want}, want)
    agent = gdpath.Agent(name="mine")
    for call in (lambda: gst.load_file(p, framework="numpy", agent=agent, direct=True),
                 lambda: gst.load_file(scratch / "missing", agent=agent, direct=True),
                 lambda: gst.safe_open(p, framework="numpy", agent=agent, direct=False),
                 lambda: ck.load(agent, gpu=None, direct=True)):
        with pytest.raises(ValueError, match="direct="):
            call()
    # The cold half last: its skip ends the test. O_DIRECT on ext4/xfs/btrfs under a tenth
    # cached (or residency unknown), 16 MiB buffered elsewhere.
    if seen is None:
        pytest.skip(f"cold half: the chooser saw no cold file after DONTNEED ({cold.chosen})")
    pct, fs = seen.groups()
    direct = fs in ("ext4", "xfs", "btrfs") and (pct is None or int(pct) < 10)
    assert mode(cold.chosen) == ("O_DIRECT" if direct else "buffered") and "given" not in cold.chosen, cold.chosen
