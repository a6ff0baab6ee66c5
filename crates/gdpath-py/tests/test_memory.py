"""Registration in place: the buffer protocol (NumPy, bytearray, memoryview, bytes, mmap),
DLPack from NumPy, the objects kept alive by their regions, read-only memory, and what cannot
be registered."""

from __future__ import annotations

import gc
import mmap
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pytest

import gdpath


def write_file(agent, path, data: bytes) -> gdpath.Region:
    f = agent.register(gdpath.File(str(path), "w"))
    src = agent.register(bytearray(data))
    agent.post("write", src, f.desc(0, len(data))).wait()
    return f


def test_a_numpy_array_is_read_into_in_place(agent, scratch):
    data = np.random.default_rng(1).integers(0, 256, 3 << 20, dtype=np.uint8)
    f = write_file(agent, scratch / "src", data.tobytes())
    arr = np.zeros(data.size // 4, dtype=np.float32)  # another dtype: the bytes count
    r = agent.register(arr)
    assert (len(r), r.kind, r.device, r.source, r.read_only) == (
        arr.nbytes, "host (pageable)", "cpu", "buffer", False)
    assert r.obj is arr
    rep = agent.post("read", r, f.desc(0, arr.nbytes)).wait()
    assert rep.bytes == arr.nbytes
    # Zero-copy: the array itself holds the file's bytes.
    assert arr.tobytes() == data.tobytes()


def test_every_buffer_kind_is_written_from_in_place(agent, scratch):
    payload = bytes(range(256)) * 64
    m = mmap.mmap(-1, len(payload))
    m[:] = payload
    for obj in (bytearray(payload), memoryview(bytearray(payload)), payload, m,
                np.frombuffer(payload, dtype=np.uint8).copy()):
        r = agent.register(obj)
        out = scratch / f"out-{type(obj).__name__}"
        f = agent.register(gdpath.File(str(out), "w"))
        rep = agent.post("write", r, f.desc(0, len(payload))).wait()
        assert rep.bytes == len(payload)
        assert out.read_bytes() == payload, type(obj)
    m.close()


def test_fortran_order_is_one_span_and_a_strided_view_is_refused(agent):
    f = np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4))
    assert len(agent.register(f)) == 48
    with pytest.raises(ValueError, match="not contiguous"):
        agent.register(np.arange(10, dtype=np.int64)[::2])
    e = np.zeros((0, 4), dtype=np.float64)[:, ::2]
    assert len(agent.register(e)) == 0


def test_memory_holding_python_objects_is_refused(agent):
    # Bytes read over object references would be pointers the interpreter follows.
    with pytest.raises(TypeError, match="object references"):
        agent.register(np.array([None, 1, "x"], dtype=object))
    with pytest.raises(TypeError, match="object references"):
        agent.register(np.zeros(2, dtype=[("Omega", "<f8"), ("obj", "O")]))
    import ctypes

    with pytest.raises(TypeError, match="object references"):
        agent.register((ctypes.py_object * 2)())
    # References the buffer format does not show: a multi-field view of a record with an
    # object field (its items still span the references), a ctypes Union (format "B"), a
    # byte cast of an object array.
    rec = np.zeros(4, dtype=[("a", "<i8"), ("o", "O")])
    with pytest.raises(TypeError, match="object references"):
        agent.register(rec[["a"]])

    class U(ctypes.Union):
        _fields_ = [("x", ctypes.c_int64), ("o", ctypes.py_object)]

    with pytest.raises(TypeError, match="object references"):
        agent.register((U * 2)())
    with pytest.raises(TypeError, match="object references"):
        agent.register(memoryview(np.array([None, 1], dtype=object)).cast("B"))
    # A field merely named with an O holds no objects.
    assert len(agent.register(np.zeros(2, dtype=[("Omega", "<f8"), ("count", "<i4")]))) == 24


def test_a_gpu_ordinal_for_memory_that_names_its_own_place_is_refused(agent):
    with pytest.raises(ValueError, match="gpu="):
        agent.register(np.zeros(16), gpu=0)
    with pytest.raises(ValueError, match="gpu="):
        agent.register(bytearray(16), gpu=0)
    # A negative ordinal is a ValueError naming the argument (PyO3 alone raised OverflowError).
    with pytest.raises(ValueError, match="gpu=-1: a CUDA ordinal is 0 or more"):
        agent.register(bytearray(16), gpu=-1)


def test_read_only_memory_is_never_written(agent, scratch):
    f = write_file(agent, scratch / "src", b"x" * 100)
    cases = [b"y" * 100]
    ro_arr = np.zeros(100, dtype=np.uint8)
    ro_arr.setflags(write=False)
    cases.append(ro_arr)
    for obj in cases:
        r = agent.register(obj)
        assert r.read_only
        with pytest.raises(gdpath.ReadOnlyMemoryError) as e:
            agent.post("read", r, f.desc(0, 100))
        assert e.value.kind == "read_only_memory"
        # Reading it (writing from it) is fine.
        agent.post("write", r, f.desc(0, 100)).wait()
    # Writable memory registered read-only on request.
    w = bytearray(100)
    r = agent.register(w, read_only=True)
    with pytest.raises(gdpath.ReadOnlyMemoryError):
        agent.post("read", r, f.desc(0, 100))
    assert w == bytearray(100)
    # Nor exported, where a peer could write it.
    with pytest.raises(gdpath.ReadOnlyMemoryError, match="peers"):
        agent.export(r)


def test_the_region_keeps_its_object_alive_and_lets_it_go(agent, scratch):
    data = bytes(range(200)) * 40_000
    f = write_file(agent, scratch / "src", data)
    arr = np.zeros(len(data), dtype=np.uint8)
    ref = weakref.ref(arr)
    d = agent.register(arr).desc(0, len(data))
    del arr
    gc.collect()
    # The descriptor holds the region, which holds the array.
    assert ref() is not None
    t = agent.post("read", d, f.desc(0, len(data)))
    del d
    gc.collect()
    assert t.wait().bytes == len(data)
    # Whether the array lived until the last pair completed is the engine's (the work items
    # hold the region: crates/gdpath/tests/borrowed.rs); here, that nothing keeps it after.
    del t
    gc.collect()
    agent.register(bytearray(1))  # any call into the module releases references dropped off the GIL
    gc.collect()
    assert ref() is None, "the array outlived its region"


def test_a_bytearray_cannot_be_resized_under_its_region(agent):
    b = bytearray(4096)
    r = agent.register(b)
    with pytest.raises(BufferError):
        b.extend(b"x")
    del r
    gc.collect()
    agent.register(bytearray(1))  # drains references released without the GIL
    b.extend(b"x")


def run_isolated(body: str) -> subprocess.CompletedProcess:
    """Runs ``body`` (Python, with ``gdpath``, ``np``, ``ctypes``, ``array`` and ``mmap``
    imported and an agent ``a`` whose region ``src`` holds 64 MiB) in a child interpreter, so
    that a write into freed memory kills the child and fails the test instead of pytest."""
    prelude = (
        "import array, ctypes, mmap, sys\n"
        "import numpy as np\n"
        "import gdpath\n"
        "a = gdpath.Agent()\n"
        "N = 64 << 20\n"  # large enough that malloc maps it apart and a free unmaps it
        "src = a.register(bytearray(b'x' * N))\n"
    )
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(body)],
                          capture_output=True, text=True, timeout=120)


def assert_clean(out: subprocess.CompletedProcess, expect: str) -> None:
    assert out.returncode == 0, f"the child died (status {out.returncode}): {out.stderr[-2000:]}"
    assert out.stdout.strip().splitlines()[-1] == expect, out.stdout + out.stderr


def test_a_registered_numpy_array_cannot_be_resized_even_without_refcheck():
    """``resize(refcheck=False)`` frees an array's memory whatever views are out; the
    registration's weakref makes NumPy refuse it, for the array and for the owner of a
    registered view, and every later transfer still lands in the registered memory."""
    out = run_isolated("""
        for view in (False, True):
            arr = np.zeros(N, dtype=np.uint8)
            r = a.register(arr[16:] if view else arr)
            try:
                arr.resize(16, refcheck=False)
                print("resized")
            except ValueError as e:
                assert "referenced" in str(e), e
            for _ in range(4):
                a.post("write", src.desc(0, len(r)), r).wait()
            assert arr[16:].tobytes() == b"x" * (N - 16)
            del r
        print("ok")
    """)
    assert_clean(out, "ok")


def test_an_array_freed_by_setstate_fails_the_next_post_cleanly():
    """No pin holds an array against ``__setstate__`` (NumPy frees its memory unchecked): the
    post after it fails with ``memory_moved`` before any byte moves."""
    out = run_isolated("""
        arr = np.zeros(N, dtype=np.uint8)
        r = a.register(arr)
        state = np.zeros(N, dtype=np.uint8).__reduce__()[2]
        arr.__setstate__(state)
        try:
            a.post("write", src, r).wait()
            print("posted")
        except gdpath.DescriptorError as e:
            assert e.kind == "memory_moved" and "register the object again" in str(e), e
            print("refused")
    """)
    assert_clean(out, "refused")


def test_a_ctypes_resize_fails_the_next_post_cleanly():
    """``ctypes.resize`` reallocates with nothing to refuse it: the next post on the region
    (by region, descriptor, export or block layout) fails with ``memory_moved``, and a region
    of a ctypes object left alone still moves data."""
    out = run_isolated("""
        c = (ctypes.c_char * N)()
        r = a.register(c)
        a.post("write", src, r).wait()
        assert c.raw[:4] == b"xxxx"
        ctypes.resize(c, 4 * N)
        for post in (lambda: a.post("write", src, r), lambda: a.post("read", r.desc(0, 8), src.desc(0, 8)),
                     lambda: a.plan("write", src, r), lambda: a.export(r),
                     lambda: a.prepare_blocks(gdpath.KvLayout(src, 4096, 4), gdpath.KvLayout(r, 4096, 4))):
            try:
                post()
                print("posted")
            except gdpath.DescriptorError as e:
                assert e.kind == "memory_moved" and "c_char_Array" in str(e), e
        # A member of a structure lies in the structure's memory: its resize is seen too.
        class S(ctypes.Structure):
            _fields_ = [("head", ctypes.c_int64), ("body", ctypes.c_uint8 * N)]
        s = S()
        body = a.register(s.body)
        ctypes.resize(s, 4 * N)
        try:
            a.post("write", src, body)
            print("posted")
        except gdpath.DescriptorError as e:
            assert e.kind == "memory_moved", e
        print("ok")
    """)
    assert "posted" not in out.stdout, out.stdout
    assert_clean(out, "ok")


def test_exporters_that_count_exports_refuse_to_resize_for_the_registrations_life():
    """``bytearray``, ``array.array`` and ``mmap.mmap`` refuse a resize (and an mmap a close)
    while their memory is registered, through a memoryview too, and allow it once the region
    and its transfers are gone; the mmap a NumPy array lies in (of which NumPy holds no export)
    refuses its close while the array is registered."""
    out = run_isolated("""
        import gc
        def attempts(o):
            if isinstance(o, mmap.mmap):
                return (lambda: o.resize(2 * N), o.close)
            return (lambda: o.extend(b"y"),)
        for make in (lambda: bytearray(N), lambda: array.array("B", bytes(N)),
                     lambda: mmap.mmap(-1, N)):
            o = make()
            for target in (o, memoryview(o)):
                r = a.register(target)
                t = a.post("write", src, r)
                for attempt in attempts(o):
                    try:
                        attempt()
                        print("resized", type(o).__name__)
                    except BufferError:
                        pass
                t.wait()
                assert bytes(o[:4]) == b"xxxx"
                del r, t, target
                gc.collect()
                a.register(bytearray(1))  # drains references released without the GIL
            for attempt in attempts(o):
                attempt()
        # NumPy holds no export of the mmap an array over it lies in: the registration does.
        m = mmap.mmap(-1, N)
        r = a.register(np.ndarray((N,), np.uint8, buffer=m))
        for attempt in attempts(m):
            try:
                attempt()
                print("resized", "mmap under an ndarray")
            except BufferError:
                pass
        a.post("write", src, r).wait()
        assert m[:4] == b"xxxx"
        print("ok")
    """)
    assert "resized" not in out.stdout, out.stdout
    assert_clean(out, "ok")


def test_dlpack_from_numpy_registers_host_memory(agent, scratch):
    class OnlyDLPack:
        """Exposes an array through DLPack alone (no buffer protocol)."""

        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    arr = np.arange(1000, dtype=np.int32)
    r = agent.register(OnlyDLPack(arr))
    assert (r.source, r.device, len(r)) == ("dlpack", "cpu", 4000)
    f = agent.register(gdpath.File(str(scratch / "d"), "w"))
    agent.post("write", r, f.desc(0, 4000)).wait()
    assert (scratch / "d").read_bytes() == arr.tobytes()


def test_what_cannot_be_registered_says_so(agent):
    with pytest.raises(TypeError, match="cannot register a str"):
        agent.register("not memory")
    with pytest.raises(TypeError, match="cannot register a int"):
        agent.register(3)

    class NoDevice:
        __cuda_array_interface__ = {"data": (0x7000_0000, False), "shape": (16,),
                                    "typestr": "<f4", "version": 3}

    with pytest.raises(ValueError, match="gpu=N"):
        agent.register(NoDevice())


def test_gpu_and_pinned_memory_without_a_cuda_driver_are_unsupported():
    a = gdpath.Agent()
    if "cuda" in a.backends:
        pytest.skip("this machine has a CUDA driver: test_gpu.py covers GPU memory")

    class FakeGpuArray:
        __cuda_array_interface__ = {"data": (0x7000_0000, False), "shape": (16,),
                                    "typestr": "<f4", "version": 3}

    with pytest.raises(gdpath.UnsupportedError) as e:
        a.register(FakeGpuArray(), gpu=0)
    assert e.value.kind == "unsupported"
    with pytest.raises(gdpath.UnsupportedError) as e:
        a.register(bytearray(64), pinned=True)
    assert e.value.kind == "unsupported"
