"""``gdpath.safetensors`` against ``safetensors`` 0.8 itself (CPU, NumPy, in CI), input by input:
valid files of every dtype NumPy has, shapes with zero-size dimensions and scalars, metadata
maps and key orders; hostile headers; random slice indexes. Each input goes through both
libraries and the outcomes must agree: the same values (bytes, arrays bitwise, key order where
safetensors fixes one, metadata), or an exception of safetensors' type (gdpath's may be a
subclass) and, where safetensors' words are fixed text rather than a parser's, its message.

Inputs come from ``random.Random`` with fixed seeds, and a failure names the case, so it
reproduces. Where gdpath differs on purpose (docs/python.md, "Differs"), the test asserts
gdpath's documented behaviour instead."""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import pytest
import safetensors
import safetensors.numpy as snp

import gdpath.safetensors as gst
import gdpath.safetensors.numpy as gnp

# safetensors' dtype names with NumPy's dtype for them (NumPy has no bf16, fp8 or F4).
NP_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
             "I32": np.int32, "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32,
             "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_, "C64": np.complex64}


def outcome(fn: Callable[[], Any]) -> Tuple:
    """``("ok", value)`` or ``("err", type, message)`` of ``fn()``; safetensors' Rust panics
    (``PanicException``, a ``BaseException``) count as errors too."""
    try:
        return ("ok", fn())
    except (Exception, BaseException) as e:  # noqa: B036 - PanicException is a BaseException
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return ("err", type(e), str(e))


def arrays(d: Dict[str, Any]) -> List[Tuple[str, str, tuple, bytes]]:
    """A dict of arrays as comparable rows, in the dict's order: name, dtype, shape, bytes."""
    return [(k, v.dtype.str, v.shape, v.tobytes()) for k, v in d.items()]


# Messages of safetensors that are fixed text (not a JSON parser's), which gdpath says too.
FIXED = ("header too small", "header too large", "invalid header length",
         "incomplete metadata, file not fully covered")


def same(case: str, real: Tuple, ours: Tuple, ordered: bool = True) -> None:
    """``ours`` is ``real``: the same value, or an error of safetensors' type (and its fixed
    words, where its message is one of them)."""
    assert real[0] == ours[0], f"{case}: safetensors {real[:3]} but gdpath {ours[:3]}"
    if real[0] == "ok":
        a, b = real[1], ours[1]
        if not ordered:
            a, b = sorted(a), sorted(b)
        elif isinstance(a, list) and a and isinstance(a[0], tuple) and len(a[0]) == 4:
            a, b = file_order(a), file_order(b)
        assert a == b, f"{case}: values differ"
        return
    assert issubclass(ours[1], real[1]), f"{case}: {real[1]} {real[2]!r} but gdpath {ours[1]} {ours[2]!r}"
    for words in FIXED:
        if real[2].endswith(words):
            assert words in ours[2], f"{case}: {real[2]!r} but gdpath {ours[2]!r}"


def file_order(rows: List[Tuple[str, str, tuple, bytes]]) -> Tuple[list, list]:
    """Rows in file order, compared as: the tensors with bytes in their order, and every row
    as a set. Zero-size tensors share an offset with their neighbour, and safetensors orders
    such ties as its hash map iterates (it differs from run to run); gdpath by name."""
    return [r for r in rows if r[3]], sorted(rows)


def build(header: Any, data: bytes = b"", raw: bool = False) -> bytes:
    h = header if raw else json.dumps(header).encode()
    return len(h).to_bytes(8, "little") + h + data


def through_all(case: str, blob: bytes, path: str) -> None:
    """``blob`` as bytes (``load``, ``deserialize``) and as a file (``load_file``,
    ``safe_open``) through both libraries."""
    with open(path, "wb") as f:
        f.write(blob)
    # load(bytes) and deserialize return safetensors' hash-map order: compared as sets.
    same(case + " load", outcome(lambda: arrays(snp.load(blob))),
         outcome(lambda: arrays(gnp.load(blob))), ordered=False)
    same(case + " deserialize",
         outcome(lambda: [(n, d["dtype"], list(d["shape"]), bytes(d["data"]))
                          for n, d in safetensors.deserialize(blob)]),
         outcome(lambda: [(n, d["dtype"], list(d["shape"]), bytes(d["data"]))
                          for n, d in gst.deserialize(blob)]), ordered=False)
    same(case + " load_file", outcome(lambda: arrays(snp.load_file(path))),
         outcome(lambda: arrays(gnp.load_file(path))))

    def opened(mod: Any) -> Callable[[], Any]:
        def go() -> Any:
            with mod.safe_open(path, "np") as f:
                meta = f.metadata()
                sized = [k for k in f.offset_keys() if f.get_tensor(k).size]
                return (f.keys(), sized, sorted(f.offset_keys()),
                        None if meta is None else sorted(meta.items()),
                        arrays({k: f.get_tensor(k) for k in f.keys()}),
                        [(k, f.get_slice(k).get_shape(), f.get_slice(k).get_dtype())
                         for k in f.keys()])
        return go

    same(case + " safe_open", outcome(opened(safetensors)), outcome(opened(gst)))


def random_tensors(rng: random.Random) -> Dict[str, np.ndarray]:
    out: Dict[str, np.ndarray] = {}
    for _ in range(rng.randint(0, 6)):
        name = "".join(rng.choice("abcxyz._0é") for _ in range(rng.randint(1, 6)))
        code = rng.choice(sorted(NP_DTYPES))
        shape = tuple(rng.choice([0, 1, 2, 3, 5]) for _ in range(rng.randint(0, 3)))
        n = int(np.prod(shape)) * np.dtype(NP_DTYPES[code]).itemsize
        raw = bytes(rng.getrandbits(8) for _ in range(n))
        arr = np.frombuffer(raw, np.uint8).view(NP_DTYPES[code]).reshape(shape)
        if code == "BOOL":
            arr = arr.view(np.uint8).astype(bool)  # bytes other than 0/1 are not NumPy bools
        out[name] = arr.copy()
    return out


@pytest.mark.parametrize("seed", range(200))
def test_valid_files_agree(seed, scratch):
    rng = random.Random(seed)
    t = random_tensors(rng)
    meta = None
    if rng.random() < 0.5:
        meta = {rng.choice(["format", "k", "é", ""]): rng.choice(["pt", "v", "", "x" * 30])
                for _ in range(rng.randint(0, 3))}
    blob = snp.save(t, metadata=meta)
    if meta == {}:
        # Documented differences: gdpath writes no "__metadata__" for an empty map, and so
        # no file safetensors 0.8.0 cannot read back (it writes `{},"__metadata__":{}}` for no
        # tensors); both libraries are then compared on the file without the empty map.
        assert gnp.save(t, metadata=meta) == snp.save(t), f"seed {seed}: save bytes differ"
        blob = snp.save(t)
    elif len(meta or {}) <= 1:  # with several keys safetensors writes them in hash-map order
        assert gnp.save(t, metadata=meta) == blob, f"seed {seed}: save bytes differ"
    gnp.save_file(t, str(scratch / "g.safetensors"), metadata=meta)
    assert set(snp.load_file(str(scratch / "g.safetensors"))) == set(t)
    through_all(f"seed {seed}", blob, str(scratch / "f.safetensors"))


def entry(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


U8 = lambda n, b=0: entry("U8", [n], b, b + n)  # noqa: E731

HOSTILE: Dict[str, bytes] = {
    "not JSON": build(b"{nope", raw=True),
    "a JSON list": build(b"[1,2]", raw=True),
    "empty header": (0).to_bytes(8, "little"),
    "NUL padding": build(b"{}\0\0", raw=True),
    "duplicate key": build(b'{"a":' + json.dumps(U8(1)).encode() + b',"a":'
                           + json.dumps(U8(1, 1)).encode() + b"}", b"ab", raw=True),
    "overlap": build({"a": U8(2), "b": entry("U8", [2], 1, 3)}, b"abc"),
    "hole": build({"a": entry("U8", [1], 1, 2)}, b"ab"),
    "out of range": build({"a": U8(4)}, b"ab"),
    "1 TB tensor in a small file": build({"a": U8(10**12)}, b"a" * 100),
    "end before begin": build({"a": entry("U8", [0], 2, 1)}, b"ab"),
    "offset 2^64-1": build(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551615,0]}}',
                           b"a", raw=True),
    "offset past 2^64": build(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,18446744073709551617]}}',
                              b"a", raw=True),
    "header past the file": (100).to_bytes(8, "little") + b"{}",
    "header length 10^12": (10**12).to_bytes(8, "little") + b"{}",
    "header length 2^64-1": (2**64 - 1).to_bytes(8, "little") + b"{}",
    "shorter than 8 bytes": b"\x01\x00",
    "trailing bytes": build({"a": U8(2)}, b"abXX"),
    "trailing bytes, no tensor": build({}, b"x"),
    "non-UTF-8 name": build(b'{"a\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"a", raw=True),
    "metadata int value": build({"__metadata__": {"k": 1}}),
    "metadata list": build({"__metadata__": ["a"]}),
    "metadata null": build({"__metadata__": None, "a": U8(1)}, b"a"),
    "shape x dtype overflows": build({"a": entry("F32", [2**40, 2**40], 0, 0)}),
    "shape overflows u64": build({"a": entry("F64", [2**61], 0, 0)}),
    "F4 odd count": build({"a": entry("F4", [3], 0, 2)}, b"ab"),
    "NaN in shape": build(b'{"a":{"dtype":"U8","shape":[NaN],"data_offsets":[0,1]}}', b"a", raw=True),
    "negative dim": build({"a": entry("U8", [-1], 0, 1)}, b"a"),
    "float dim": build({"a": entry("U8", [1.0], 0, 1)}, b"a"),
    "deep nesting": build(("[" * 10000 + "]" * 10000).encode(), raw=True),
    "deep metadata": build(('{"__metadata__":' + "[" * 200 + "]" * 200 + "}").encode(), raw=True),
    "unknown dtype": build({"a": entry("F7", [1], 0, 1)}, b"a"),
    "missing data_offsets": build({"a": {"dtype": "U8", "shape": [1]}}, b"a"),
    "three offsets": build({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}}, b"a"),
    "shape a string": build({"a": {"dtype": "U8", "shape": "1", "data_offsets": [0, 1]}}, b"a"),
    "extra field": build({"a": {**U8(1), "x": 1}}, b"a"),
    "size disagrees with shape": build({"a": entry("F32", [3], 0, 8)}, bytes(8)),
    "offsets out of header order": build({"a": entry("U8", [1], 1, 2), "b": U8(1)}, b"ab"),
    "bf16 (NumPy has none)": build({"a": entry("BF16", [1], 0, 2)}, b"ab"),
    "F4 (NumPy has none)": build({"a": entry("F4", [4], 0, 2)}, b"ab"),
    "F8_E8M0 (NumPy has none)": build({"a": entry("F8_E8M0", [2], 0, 2)}, b"ab"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_headers_agree(case, scratch):
    through_all(case, HOSTILE[case], str(scratch / "h.safetensors"))


@pytest.mark.parametrize("seed", range(100))
def test_mutated_headers_agree(seed, scratch):
    """A valid file with random bytes of its header overwritten (seeded)."""
    rng = random.Random(10_000 + seed)
    blob = bytearray(snp.save(random_tensors(rng) or {"a": np.zeros(3, np.int16)}))
    n = int.from_bytes(blob[:8], "little")
    for _ in range(rng.randint(1, 3)):
        blob[8 + rng.randrange(n)] = rng.choice(b'{}[]":,0123456789-eE. \xff')
    through_all(f"mutation seed {seed}", bytes(blob), str(scratch / "m.safetensors"))


def truncations() -> Dict[str, bytes]:
    """A valid two-tensor file cut short at each kind of place: in the length prefix, in the
    header, right after it, in the first tensor, between the tensors, one byte before the end."""
    blob = snp.save({"a": np.arange(6, dtype=np.float32), "b": np.arange(5, dtype=np.int16)})
    n = int.from_bytes(blob[:8], "little")
    cuts = {"in the length": 5, "in the header": 8 + n // 2, "after the header": 8 + n,
            "in a tensor": 8 + n + 7, "between tensors": 8 + n + 24, "last byte": len(blob) - 1}
    return {k: blob[:c] for k, c in cuts.items()}


@pytest.mark.parametrize("case", sorted(truncations()))
def test_truncated_files_agree(case, scratch):
    """A truncated file: through every entry point, safetensors' exception (``SafetensorError``
    with its words), as safetensors raises it."""
    through_all("truncated " + case, truncations()[case], str(scratch / "t.safetensors"))


SLICE_SHAPES = {"s0": (), "s1": (7,), "s2": (4, 5), "s3": (3, 0, 4), "s4": (2, 3, 4, 2)}


def random_index(rng: random.Random) -> Any:
    def item() -> Any:
        c = rng.random()
        if c < 0.3:
            return rng.randint(-9, 9)
        if c < 0.4:
            return Ellipsis
        if c < 0.45:
            return rng.choice([None, 1.5, "a", True, [1], []])
        bound = lambda: rng.choice([None, rng.randint(-9, 9)])  # noqa: E731
        return slice(bound(), bound(), rng.choice([None, None, 1, 2, 3, -1, 0, -2]))

    idx = tuple(item() for _ in range(rng.randint(0, 5)))
    return idx[0] if idx and rng.random() < 0.2 else idx


def reversed_bounds(shape: tuple, index: Any) -> bool:
    """Whether ``index`` has a slice whose stop is below its start on a dimension it reaches:
    safetensors 0.8.0 fails there inside (``SystemError``, ``ValueError`` or a Rust panic from
    a negative size), gdpath returns NumPy's empty result (docs/python.md)."""
    items = list(index) if isinstance(index, tuple) else [index]
    return any(isinstance(it, slice) and isinstance(it.start, int) and isinstance(it.stop, int)
               and it.stop < it.start for it in items)


def test_random_slices_agree(scratch):
    path = str(scratch / "s.safetensors")
    snp.save_file({k: np.arange(int(np.prod(v)), dtype=np.int32).reshape(v)
                   for k, v in SLICE_SHAPES.items()}, path)
    rng = random.Random(1234)
    checked = reversed_seen = 0

    def got(f: Any, name: str, index: Any) -> Callable[[], Any]:
        def go() -> Any:
            r = f.get_slice(name)[index]
            assert isinstance(r, np.ndarray) and r.flags.c_contiguous
            return (r.dtype.str, r.shape, r.tobytes())
        return go

    with safetensors.safe_open(path, "np") as real, gst.safe_open(path, "np") as ours:
        for i in range(3000):
            name = rng.choice(sorted(SLICE_SHAPES))
            index = random_index(rng)
            case = f"slice {i}: {name}{list(SLICE_SHAPES[name])}[{index!r}]"
            theirs, mine = outcome(got(real, name, index)), outcome(got(ours, name, index))
            if theirs[0] == "err" and mine[0] == "ok" and reversed_bounds(SLICE_SHAPES[name], index):
                assert mine[1][1] and 0 in mine[1][1], f"{case}: {mine}"  # empty, as NumPy
                reversed_seen += 1
                continue
            same(case, theirs, mine)
            if theirs[0] == "err":
                # Index errors are fixed text (safetensors' and PyO3's): the words must match.
                assert theirs[2] == mine[2], f"{case}: {theirs[2]!r} but gdpath {mine[2]!r}"
            checked += 1
    assert checked > 2500 and reversed_seen > 0


def test_huge_claim_fails_before_allocating(scratch):
    """A header claiming a 1 TB tensor in a 1 KB file fails before anything of that size is
    allocated: the child's peak RSS grows by far less than the claim (under 256 MiB) over what
    it held after its imports (PyTorch, where installed, alone brings it near 1 GB)."""
    path = scratch / "big.safetensors"
    path.write_bytes(build({"a": U8(10**12)}, bytes(1000)))
    code = """
import resource, sys, numpy, gdpath.safetensors as g, gdpath.safetensors.numpy as n
data = open(sys.argv[1], "rb").read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for f in (lambda: n.load_file(sys.argv[1]), lambda: n.load(data),
          lambda: g.safe_open(sys.argv[1], "np"), lambda: g.deserialize(data)):
    try:
        f()
        raise SystemExit("loaded")
    except g.SafetensorError:
        pass
print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    before, after = (int(w) for w in r.stdout.split())
    assert 0 < before <= after, r.stdout
    assert after - before < 256 * 1024, r.stdout  # KiB: grew by under 256 MiB


def test_non_files_are_refused_at_once(scratch):
    """A directory is an ``OSError`` in both (gdpath's an ``IsADirectoryError``); a missing file
    ``FileNotFoundError`` in both; a FIFO (on which safetensors 0.8.0 blocks in open forever,
    so it is not run here) and ``/dev/zero`` (safetensors: ``header too small``) are refused by
    gdpath at once as not regular files: an ``OSError`` (docs/python.md)."""
    for path, real in ((scratch, OSError), (scratch / "missing.safetensors", FileNotFoundError)):
        with pytest.raises(real):
            snp.load_file(str(path))
        with pytest.raises(real):
            gnp.load_file(str(path))
        with pytest.raises(real):
            gst.safe_open(str(path), "np")
    fifo = scratch / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/zero"):
        with pytest.raises(OSError, match="not a regular file"):
            gnp.load_file(str(path))
        with pytest.raises(OSError, match="not a regular file"):
            gst.safe_open(str(path), "np")
