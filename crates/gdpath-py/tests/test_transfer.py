"""Host memory ↔ files through the engine from Python: bytes checked, the path of every pair
reported (and the finding id of a fallback), descriptors by offset and by slicing, several
pairs, plans, strict mode, deadlines, cancellation, and the GIL released while bytes move."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

import gdpath


def pattern(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def test_numpy_to_file_and_back_reports_the_path(agent, scratch):
    data = pattern((4 << 20) + 3, 1)
    src = agent.register(data)
    f = agent.register(gdpath.File(str(scratch / "f"), "w"))
    w = agent.post("write", src, f.desc(0, data.nbytes)).wait()
    assert w.bytes == data.nbytes and len(w.pairs) == 1
    p = w.pairs[0]
    # O_DIRECT on the disk the scratch folder is on, else the buffered path with its reason.
    assert p.path == "posix-direct" or (p.path == "posix-buffered" and p.finding), p
    assert (scratch / "f").read_bytes() == data.tobytes()
    back = bytearray(data.nbytes)
    r = agent.post("read", agent.register(back), f.desc(0, data.nbytes)).wait()
    assert r.pairs[0].path in ("posix-direct", "posix-buffered")
    assert back == data.tobytes()
    assert r.paths == [r.pairs[0].path]
    assert r.gbps > 0 and r.elapsed > 0


def test_a_buffered_file_reports_the_finding_that_explains_it(agent, scratch):
    data = pattern(100_000, 2)
    (scratch / "b").write_bytes(data.tobytes())
    f = agent.register(gdpath.File(str(scratch / "b"), "r", direct="off"))
    out = np.zeros_like(data)
    r = agent.post("read", agent.register(out), f.desc(0, data.nbytes)).wait()
    assert (r.pairs[0].path, r.pairs[0].finding) == ("posix-buffered", "storage.odirect-disabled")
    assert np.array_equal(out, data)


def test_many_pairs_by_offset_and_by_slicing(agent, scratch):
    data = pattern(1 << 20, 3)
    (scratch / "m").write_bytes(data.tobytes())
    f = agent.register(gdpath.File(str(scratch / "m")))
    out = np.zeros(1 << 20, dtype=np.uint8)
    dst = agent.register(out)
    # 64 pairs of 16 KiB, scattered: pair i reads file block 63 - i into memory block i.
    k = 16 << 10
    local = [dst[i * k:(i + 1) * k] for i in range(64)]
    remote = [f.desc((63 - i) * k, k) for i in range(64)]
    rep = agent.post("read", local, remote).wait()
    assert [p.index for p in rep.pairs] == list(range(64))
    assert rep.bytes == 1 << 20
    for i in range(64):
        assert np.array_equal(out[i * k:(i + 1) * k], data[(63 - i) * k:(64 - i) * k])
    # A descriptor sliced again is relative to itself; slices clip as Python's do.
    d = dst.desc(1000, 5000)
    assert (d[10:20].offset, len(d[10:20])) == (1010, 10)
    assert len(dst[-10:]) == 10 and dst[-10:].offset == (1 << 20) - 10
    assert len(dst[5:2]) == 0
    with pytest.raises(ValueError, match="step"):
        dst[::2]


def test_plan_says_what_post_would_do_without_moving(agent, scratch):
    (scratch / "p").write_bytes(b"\1" * 8192)
    f = agent.register(gdpath.File(str(scratch / "p"), direct="off"))
    b = bytearray(8192)
    plans = agent.plan("read", agent.register(b), f.desc(0, 8192))
    assert [(p.index, p.backend, p.path, p.finding) for p in plans] == [
        (0, "posix-buffered", "posix-buffered", "storage.odirect-disabled")]
    assert b == bytearray(8192)


def test_strict_agents_and_accept_lists_refuse_fallbacks_before_moving(scratch):
    (scratch / "s").write_bytes(b"\2" * 8192)
    strict = gdpath.Agent(strict=True)
    f = strict.register(gdpath.File(str(scratch / "s"), direct="off"))
    b = bytearray(8192)
    dst = strict.register(b)
    with pytest.raises(gdpath.PathNotAcceptedError) as e:
        strict.post("read", dst, f.desc(0, 8192))
    assert (e.value.kind, e.value.planned, e.value.finding, e.value.index) == (
        "path_not_accepted", "posix-buffered", "storage.odirect-disabled", 0)
    assert b == bytearray(8192)
    # Naming the paths overrides the agent's default.
    rep = strict.post("read", dst, f.desc(0, 8192), accept=["posix-buffered"]).wait()
    assert rep.pairs[0].path == "posix-buffered" and b == bytearray(b"\2" * 8192)
    with pytest.raises(gdpath.PathNotAcceptedError):
        strict.post("read", dst, f.desc(0, 8192), accept=["posix-direct", "gds-native"])
    with pytest.raises(gdpath.GdpathError) as e:
        strict.post("read", dst, f.desc(0, 8192), accept=["posix"])
    assert e.value.kind == "config" and "posix-direct" in str(e.value)


def test_a_deadline_in_the_past_and_a_cancel_end_the_transfer(agent, scratch):
    data = pattern(64 << 20, 4)
    (scratch / "d").write_bytes(data.tobytes())
    f = agent.register(gdpath.File(str(scratch / "d")))
    out = np.zeros_like(data)
    dst = agent.register(out)
    k = 1 << 20
    pairs = ([dst[i * k:(i + 1) * k] for i in range(64)], [f.desc(i * k, k) for i in range(64)])
    t = agent.post("read", *pairs, timeout=0.0)
    with pytest.raises(gdpath.DeadlineExceeded) as e:
        t.wait()
    assert e.value.kind == "deadline_exceeded" and isinstance(e.value, TimeoutError)
    assert len(e.value.outcomes) == 64
    # Waiting again gives the same at once; the report property raises it too.
    with pytest.raises(gdpath.DeadlineExceeded):
        t.wait()
    t = agent.post("read", *pairs)
    t.cancel()
    assert t.cancelled
    try:
        rep = t.wait()
        assert rep.bytes == 64 << 20  # every pair had started before the cancel
    except gdpath.Cancelled as e:
        assert e.kind == "cancelled"
        assert set(e.completed()) <= set(range(64))
    # A wait's timeout ends it the same way.
    t = agent.post("read", *pairs)
    try:
        t.wait(timeout=0.0)
    except gdpath.DeadlineExceeded:
        pass


def test_done_and_report_before_and_after(agent, scratch):
    (scratch / "r").write_bytes(b"\3" * 4096)
    f = agent.register(gdpath.File(str(scratch / "r")))
    t = agent.post("read", agent.register(bytearray(4096)), f.desc(0, 4096))
    rep = t.wait()
    assert t.done() and t.report.bytes == rep.bytes == 4096
    assert [p.path for p in t.plan] == [rep.pairs[0].path]
    assert t.deadline_in is None and not t.needs_progress


def test_the_gil_is_released_while_bytes_move(agent, scratch):
    size = 256 << 20
    path = scratch / "big"
    with open(path, "wb") as fh:
        fh.truncate(size)
    f = agent.register(gdpath.File(str(path), "r+"))
    src = agent.register(np.ones(size, dtype=np.uint8))
    spans = []

    def waiter():
        t = agent.post("write", src, f.desc(0, size))
        start = time.perf_counter()
        t.wait()
        spans.append((start, time.perf_counter()))

    th = threading.Thread(target=waiter)
    ticks = []
    th.start()
    while th.is_alive():
        ticks.append(time.perf_counter())
    th.join()
    (start, end), = spans
    during = [x for x in ticks if start < x < end]
    # Python ran on this thread while the other one was inside wait(): it had let go of the
    # GIL. (If wait() held it, no tick could fall strictly inside the wait.)
    assert end - start > 0.01, "the write was too quick to tell"
    assert len(during) > 100, (len(during), end - start)
    assert os.path.getsize(path) == size


def test_accept_takes_one_path_name_or_a_non_empty_list(agent, scratch):
    f = agent.register(gdpath.File(str(scratch / "acc"), "w"))
    src = agent.register(bytearray(b"x" * 4096))
    planned = agent.plan("write", src, f.desc(0, 4096))[0]
    path = planned.path
    # Reprs print Python's None or the quoted id, not Rust's Option.
    pair = agent.post("write", src, f.desc(0, 4096)).wait().pairs[0]
    for obj, finding in ((planned, planned.finding), (pair, pair.finding)):
        want = "finding=None" if finding is None else f'finding="{finding}"'
        assert want in repr(obj) and "Some(" not in repr(obj), repr(obj)
    assert agent.post("write", src, f.desc(0, 4096), accept=path).wait().pairs[0].path == path
    assert agent.post("write", src, f.desc(0, 4096), accept=[path]).wait().pairs[0].path == path
    with pytest.raises(ValueError, match="accept=\\[\\]"):
        agent.post("write", src, f.desc(0, 4096), accept=[])
    with pytest.raises(TypeError, match="accept: a path name.*not int"):
        agent.post("write", src, f.desc(0, 4096), accept=3)
    # The item that is wrong is named, not the list.
    with pytest.raises(TypeError, match="each a str\\), not int$"):
        agent.post("write", src, f.desc(0, 4096), accept=[path, 1])
    with pytest.raises(TypeError, match="each a str\\), not bytes$"):
        agent.post("write", src, f.desc(0, 4096), accept=path.encode())


def test_a_notification_is_bytes_and_a_str_is_refused_by_name(agent, scratch):
    f = agent.register(gdpath.File(str(scratch / "note"), "w"))
    src = agent.register(bytearray(16))
    with pytest.raises(TypeError, match="notify: bytes, not str"):
        agent.post("write", src, f.desc(0, 16), notify="layer 7 done")
    with pytest.raises(TypeError, match="notify: bytes, bytearray or memoryview, not int"):
        agent.post("write", src, f.desc(0, 16), notify=7)
    with pytest.raises(TypeError, match="object references"):
        agent.post("write", src, f.desc(0, 16), notify=np.array([None], dtype=object))
    # Any buffer of bytes is a message.
    agent.post("write", src, f.desc(0, 16), notify=memoryview(b"done")).wait()
    # One the wire cannot carry fails at post, before any byte moves.
    with pytest.raises(gdpath.GdpathError) as e:
        agent.post("write", src, f.desc(0, 16), notify=b"x" * (64 * 1024 + 1))
    assert e.value.kind == "protocol_limit", e.value
