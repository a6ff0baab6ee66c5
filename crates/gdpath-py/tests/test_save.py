"""``gdpath.safetensors.save_file`` (and the native ``Checkpoint.save`` under it) against the
``safetensors`` package on real files: every dtype of the format, zero-size tensors, scalars,
metadata; the files must read back equal with the package and with gdpath's loader, and be the
bytes the package itself writes for the same tensors."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import safetensors
import safetensors.numpy
import safetensors._safetensors_rust

import gdpath
import gdpath.safetensors as gst
from test_safetensors import tensors


def temporaries(d):
    return [n for n in os.listdir(d) if ".gdpath-tmp-" in n]


def package_file(path, ts, metadata):
    """The ``safetensors`` package's own file of raw tensors (its ``serialize_file``: dicts of
    dtype, shape and bytes before 0.7, ``TensorSpec``s of pointers since)."""
    spec = getattr(safetensors._safetensors_rust, "TensorSpec", None)
    if spec is None:
        safetensors.serialize_file(ts, str(path), metadata=metadata)
        return
    names = {"BOOL": "bool", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn", "F16": "float16",
             "BF16": "bfloat16", "F32": "float32", "F64": "float64"}
    for b in (8, 16, 32, 64):
        names[f"I{b}"], names[f"U{b}"] = f"int{b}", f"uint{b}"
    keep = {k: np.frombuffer(t["data"] or b"\0", dtype=np.uint8) for k, t in ts.items()}
    specs = {
        k: spec(dtype=names[t["dtype"]], shape=t["shape"], data_ptr=keep[k].ctypes.data, data_len=len(t["data"]))
        for k, t in ts.items()
    }
    safetensors.serialize_file(specs, str(path), metadata=metadata)


def native_save(path, ts, metadata=None, **kw):
    """Saves raw tensors (name → dtype, shape, bytes) through the native binding: each one's
    bytes in a registered ``bytearray`` (a scratch one for zero-size tensors)."""
    agent = gdpath.default_agent()
    scratch = agent.register(bytearray(1))
    entries = []
    for name, t in ts.items():
        region = agent.register(bytearray(t["data"])) if t["data"] else scratch
        entries.append((name, t["dtype"], t["shape"], region, 0, len(t["data"])))
    return gdpath.Checkpoint.save(agent, entries, str(path), metadata=metadata, **kw)


def test_every_dtype_and_zero_size_tensors_equal_the_package(scratch):
    ts = tensors(11)
    ours = scratch / "ours.safetensors"
    report = native_save(ours, ts, {"format": "pt"})
    assert report["tensors"] == len(ts) and report["fsync"] is True
    assert report["file_bytes"] == ours.stat().st_size
    # The package reads every tensor back: same dtype, shape and bytes.
    got = {name: t for name, t in safetensors.deserialize(ours.read_bytes())}
    assert sorted(got) == sorted(ts)
    for name, t in ts.items():
        g = got[name]
        assert (g["dtype"], list(g["shape"]), bytes(g["data"])) == (t["dtype"], t["shape"], t["data"]), name
    with safetensors.safe_open(str(ours), "np") as f:
        assert f.metadata() == {"format": "pt"}
    # The package's own file for the same tensors is the same bytes (one metadata key: its
    # order is then fixed too).
    theirs = scratch / "theirs.safetensors"
    package_file(theirs, ts, {"format": "pt"})
    assert ours.read_bytes() == theirs.read_bytes()
    # And gdpath's loader reads it back.
    loaded = gdpath.Checkpoint([str(ours)]).load(gdpath.default_agent())
    for i, t in enumerate(loaded.tensors):
        assert np.from_dlpack(loaded.view(i)).tobytes() == ts[t.name]["data"], t.name
        assert (t.dtype, list(t.shape)) == (ts[t.name]["dtype"], ts[t.name]["shape"])
    assert temporaries(scratch) == []


def test_save_file_of_numpy_arrays_reads_back_equal(scratch):
    rng = np.random.default_rng(5)
    arrays = {}
    for dt in (np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8,
               np.uint8, np.uint16, np.uint32, np.uint64, np.bool_):
        name = np.dtype(dt).name
        arrays[name] = (rng.standard_normal((7, 3)) * 50).astype(dt)
        arrays[name + ".empty"] = np.zeros((0, 5), dtype=dt)
        arrays[name + ".scalar"] = np.array(3, dtype=dt)
    # Not contiguous: saved as the array's values, as the package does.
    arrays["strided"] = np.arange(40, dtype=np.float32).reshape(5, 8)[:, ::2]
    path = scratch / "np.safetensors"
    r = gst.save_file(arrays, path, metadata={"format": "np"})
    assert r["paths"] and r["paths"][0] in ("posix-direct", "posix-buffered"), r
    assert r["gbps"] > 0 and r["elapsed"] >= r["transfer"]
    want = safetensors.numpy.load_file(str(path))
    assert sorted(want) == sorted(arrays)
    for k, a in arrays.items():
        assert want[k].dtype == a.dtype and want[k].shape == a.shape, k
        assert np.array_equal(want[k], a), k
    again = gst.load_file(path, framework="numpy")
    for k, a in arrays.items():
        assert again[k].tobytes() == np.ascontiguousarray(a).tobytes(), k
    # The package's file of the contiguous arrays is the same bytes. (It is left without the
    # strided one: safetensors 0.8.0's numpy saver writes a non-contiguous array's underlying
    # buffer from its first byte, not the array's values.)
    contiguous = {k: a for k, a in arrays.items() if a.flags.c_contiguous}
    ours, theirs = scratch / "c.safetensors", scratch / "theirs.safetensors"
    gst.save_file(contiguous, ours, metadata={"format": "np"})
    safetensors.numpy.save_file(contiguous, str(theirs), metadata={"format": "np"})
    assert ours.read_bytes() == theirs.read_bytes()
    # Big-endian items are stored little-endian and NumPy scalars as 0-d tensors, as the
    # package stores them.
    odd = {"be": np.arange(6, dtype=">f4").reshape(2, 3), "scalar": np.float32(3.5)}
    gst.save_file(odd, scratch / "odd.safetensors")
    back = safetensors.numpy.load_file(str(scratch / "odd.safetensors"))
    assert back["be"].dtype == np.dtype("<f4") and np.array_equal(back["be"], odd["be"])
    assert back["scalar"].shape == () and back["scalar"] == np.float32(3.5)
    # A path given as bytes names the same file.
    as_bytes = scratch / "b.safetensors"
    gst.save_file(contiguous, os.fsencode(str(as_bytes)), metadata={"format": "np"})
    assert as_bytes.read_bytes() == theirs.read_bytes()


def test_replacing_fsync_off_and_refusals_leave_no_temporary(scratch):
    path = scratch / "m.safetensors"
    path.write_bytes(b"old")
    a = {"w": np.ones((4, 4), dtype=np.float32)}
    with pytest.raises(gdpath.GdpathError) as e:
        gst.save_file(a, path, overwrite=False)
    assert e.value.kind == "exists"
    assert path.read_bytes() == b"old"
    r = gst.save_file(a, path, fsync=False)
    assert r["replaced"] is True and r["fsync"] is False
    assert np.array_equal(safetensors.numpy.load_file(str(path))["w"], a["w"])
    with pytest.raises(gdpath.CheckpointError, match="reserved") as e:
        gst.save_file({"__metadata__": a["w"]}, scratch / "r.safetensors")
    assert e.value.kind == "checkpoint"
    with pytest.raises(ValueError, match="metadata"):
        gst.save_file(a, scratch / "x.safetensors", metadata={"k": 1})
    with pytest.raises(TypeError, match="save_file takes"):
        gst.save_file({"l": [1, 2]}, scratch / "x.safetensors")
    with pytest.raises(ValueError, match="not a safetensors dtype"):
        native_save(scratch / "x.safetensors", {"t": {"dtype": "F33", "shape": [1], "data": b"1234"}})
    with pytest.raises(gdpath.CheckpointError, match="needs 8 bytes, 4 given"):
        native_save(scratch / "x.safetensors", {"t": {"dtype": "F32", "shape": [2], "data": b"1234"}})
    assert sorted(os.listdir(scratch)) == ["m.safetensors"]


def test_torch_tensors_on_the_cpu_equal_safetensors_torch(scratch):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed here (the GPU suite runs these with it)")
    import safetensors.torch

    ts = {}
    for name, dt in gst._torch_dtypes().items():
        ts[name] = torch_random(torch, dt, (6, 4))
        ts[name + ".empty"] = torch.empty(0, 4, dtype=dt)
    ours, theirs = scratch / "ours.safetensors", scratch / "theirs.safetensors"
    gst.save_file(ts, ours, metadata={"format": "pt"})
    safetensors.torch.save_file(ts, str(theirs), metadata={"format": "pt"})
    assert ours.read_bytes() == theirs.read_bytes()
    back = safetensors.torch.load_file(str(ours))
    for k, t in ts.items():
        assert back[k].dtype == t.dtype and back[k].shape == t.shape, k
        assert torch.equal(back[k].reshape(-1).view(torch.uint8), t.contiguous().reshape(-1).view(torch.uint8)) or t.numel() == 0, k
    # Sub-byte and fp8 tensors that are not contiguous: a slice with a step through safe_open and
    # a lenient save, both copied by PyTorch, which has no copy kernel for some of these dtypes.
    for name in ("F4", "F8_E8M0", "F8_E4M3", "BF16"):
        if name not in ts:
            continue
        want = ts[name].view(torch_bits(torch, ts[name]))[0:6:2].contiguous()
        with gst.safe_open(ours, "pt") as f:
            got = f.get_slice(name)[0:6:2]
        assert got.dtype == ts[name].dtype and torch.equal(got.view(want.dtype), want), name
        gst.save_file({"t": ts[name][0:6:2]}, scratch / "strided.safetensors", lenient=True)
        got = safetensors.torch.load_file(str(scratch / "strided.safetensors"))["t"]
        assert got.dtype == ts[name].dtype and torch.equal(got.view(want.dtype), want), name


def torch_bits(torch, t):
    """The integer dtype of ``t``'s element size: tensors are compared as these bits (PyTorch has
    no ``==``, ``copy_`` or ``to`` for some sub-byte and fp8 dtypes)."""
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]


def torch_random(torch, dt, shape, device="cpu"):
    """A tensor of dtype ``dt`` and (PyTorch) ``shape`` of random bytes, made as bytes and viewed
    as ``dt`` (no conversion kernel needed, e.g. ``float4_e2m1fn_x2``); bool as 0/1."""
    if dt == torch.bool:
        return torch.randint(0, 2, shape, device=device).bool()
    n = 1
    for d in shape:
        n *= d
    size = torch.empty(0, dtype=dt).element_size()
    raw = torch.randint(0, 256, (n * size,), dtype=torch.uint8, device=device)
    return raw.view(dt).reshape(shape)


NOBODY = 65534


@pytest.fixture
def planted():
    """The scene of a link planted to redirect root's write, made for real: in a sticky world-writable directory ``S`` (mode 1777,
    inside a scratch directory), ``nobody`` planted ``S/model.safetensors``, a link to root's
    mode-0600 file ``P``; ``S/own.link`` is root's own link to it. Root only: skipped, saying
    why, otherwise."""
    if os.geteuid() != 0:
        pytest.skip("needs root: planting a link as another user (nobody)")
    # Not pytest's tmp_path: its parents are closed to nobody.
    tmp_path = Path(tempfile.mkdtemp())
    os.chmod(tmp_path, 0o755)
    sticky = tmp_path / "S"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    victim = tmp_path / "P"
    victim.write_bytes(b"root's secret\n")
    os.chmod(victim, 0o600)
    link = sticky / "model.safetensors"
    subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "ln", "-s", str(victim), str(link)],
        check=True,
    )
    own = sticky / "own.link"
    own.symlink_to(victim)
    yield sticky, victim, link, own
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_save_file_refuses_a_link_another_user_planted(planted):
    """A link another user planted must not redirect root's save: ``save_file`` (overwrite is its
    default) given ``nobody``'s link to root's file raises kind ``symlink_refused``, a ``PermissionError`` as
    ``open()`` raises where the kernel applies the rule, and the file is untouched."""
    sticky, victim, link, _ = planted
    a = {"w": np.ones((4, 4), dtype=np.float32)}
    with pytest.raises(gdpath.StorageError) as e:
        gst.save_file(a, link)
    assert e.value.kind == "symlink_refused"
    assert isinstance(e.value, PermissionError) and e.value.filename == str(link)
    assert "owned by uid 65534" in str(e.value) and "protected_symlinks" in str(e.value)
    assert victim.read_bytes() == b"root's secret\n"
    assert os.stat(victim).st_mode & 0o7777 == 0o600
    assert temporaries(sticky) == [] and temporaries(victim.parent) == []


def test_save_file_refuses_a_planted_link_as_a_directory_and_another_users_file(planted):
    """The hostile tester's reproductions 3 and 4: a link ``nobody`` planted as a directory of
    the path (``S/sub/P``, ``sub`` pointing at root's directory) is refused too (on main the
    kernel followed it, ``fs.protected_symlinks`` being 0, and root's file was replaced), and
    ``nobody``'s own file in the sticky directory is not replaced (kind
    ``foreign_file_refused``, a ``PermissionError``; on main root's tensors became ``nobody``'s
    file, mode 0666)."""
    sticky, victim, _, _ = planted
    sub = sticky / "sub"
    nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    subprocess.run([*nobody, "ln", "-s", str(victim.parent), str(sub)], check=True)
    a = {"w": np.ones((4, 4), dtype=np.float32)}
    with pytest.raises(gdpath.StorageError) as e:
        gst.save_file(a, sub / "P")
    assert e.value.kind == "symlink_refused" and isinstance(e.value, PermissionError)
    assert e.value.filename == str(sub), e.value.filename
    assert victim.read_bytes() == b"root's secret\n"
    theirs = sticky / "theirs.safetensors"
    subprocess.run([*nobody, "sh", "-c", f"echo x > {theirs}; chmod 666 {theirs}"], check=True)
    with pytest.raises(gdpath.StorageError) as e:
        gst.save_file(a, theirs)
    assert e.value.kind == "foreign_file_refused" and isinstance(e.value, PermissionError)
    assert "protected_regular" in str(e.value)
    assert theirs.read_bytes() == b"x\n"
    assert temporaries(sticky) == [] and temporaries(victim.parent) == []


def test_save_file_refuses_a_magic_link_and_a_directory_with_the_errno_open_gives(scratch):
    """``/dev/stdout`` goes through ``/proc/self/fd/1``: kind ``magic_link_refused`` (on main a
    new file was renamed over what stdout went to). A directory is ``not_a_file`` with
    ``EISDIR``, an ``IsADirectoryError`` as ``open()`` raises (on main its errno was None)."""
    import errno

    a = {"w": np.ones(3, dtype=np.float32)}
    with pytest.raises(gdpath.StorageError) as e:
        gst.save_file(a, "/dev/stdout")
    assert e.value.kind == "magic_link_refused" and "write to a file" in str(e.value)
    with pytest.raises(gdpath.StorageError) as e:
        gst.save_file(a, scratch)
    assert e.value.kind == "not_a_file"
    assert isinstance(e.value, IsADirectoryError) and e.value.errno == errno.EISDIR


def test_save_file_follows_an_allowed_link_and_reports_the_real_file(planted):
    """Root's own link is followed, as ``open()`` follows it; the report's ``path`` is the file
    written."""
    _, victim, _, own = planted
    a = {"w": np.arange(8, dtype=np.int32)}
    r = gst.save_file(a, own)
    assert Path(r["path"]) == victim.resolve() and r["replaced"] is True
    assert own.is_symlink()
    assert np.array_equal(safetensors.numpy.load_file(str(victim))["w"], a["w"])


def test_save_file_keeps_the_owner_and_mode_of_the_file_it_replaces(scratch):
    """A replaced file stays its owner's, so the owner can still read it: root replacing
    ``nobody``'s 0640 checkpoint leaves it ``nobody``'s, mode 0640."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a file owned by another user (nobody)")
    path = scratch / "theirs.safetensors"
    path.write_bytes(b"old")
    os.chown(path, NOBODY, NOBODY)
    os.chmod(path, 0o640)
    gst.save_file({"w": np.ones(3, dtype=np.float32)}, path)
    st = os.stat(path)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (NOBODY, NOBODY, 0o640)


def test_a_save_killed_mid_write_leaves_the_old_file_and_the_next_save_cleans_up(scratch):
    """SIGKILL while a 768 MiB save is writing its temporary: the target is still the old file
    byte for byte; the next save of the same target succeeds and leaves no temporary."""
    path = scratch / "m.safetensors"
    old = safetensors.numpy.save({"w": np.arange(10, dtype=np.int32)})
    path.write_bytes(old)
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, numpy as np, gdpath.safetensors as g\n"
        "g.save_file({'w': np.ones(768 << 20, np.uint8)}, sys.argv[1])\n"), str(path)])
    seen = []
    deadline = time.monotonic() + 60
    try:
        # Kill as soon as the child's temporary holds bytes (bounded: the save is seconds at
        # most). Seen through /proc/PID/fd: the temporary may have no name (O_TMPFILE) until
        # the commit links it.
        while time.monotonic() < deadline and child.poll() is None and not seen:
            seen = written_temporaries(child.pid, scratch, path)
            time.sleep(0.001)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert seen, f"the save ended (rc {child.returncode}) before its temporary was seen: nothing killed mid-write"
    assert path.read_bytes() == old
    new = {"w": np.full((3, 5), 7, np.float32)}
    gst.save_file(new, path)
    assert sorted(os.listdir(scratch)) == ["m.safetensors"]
    assert np.array_equal(safetensors.numpy.load_file(str(path))["w"], new["w"])


def written_temporaries(pid: int, directory: Path, target: Path) -> list:
    """The files in ``directory`` other than ``target`` that process ``pid`` holds open and has
    written bytes to (named or not)."""
    out = []
    fds = Path(f"/proc/{pid}/fd")
    try:
        for fd in fds.iterdir():
            try:
                where = os.readlink(fd)
                if where.startswith(f"{directory}/") and where != str(target) and os.stat(fd).st_size > 0:
                    out.append(where)
            except OSError:
                continue  # closed meanwhile
    except OSError:
        pass  # the process ended
    return out


@pytest.fixture
def small_tmpfs():
    """A 1 MiB tmpfs mounted for the test (root only; skipped, saying why, otherwise)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: mounting a 1 MiB tmpfs to fill")
    d = Path(tempfile.mkdtemp())
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        os.rmdir(d)
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield d
    subprocess.run(["umount", str(d)], check=True)
    os.rmdir(d)


def test_a_save_that_runs_out_of_space_keeps_the_old_file_and_the_link(small_tmpfs):
    """A save that cannot fit (ENOSPC on a full tmpfs), made through the owner's own symlink:
    a typed error, the old file and the link as they were, no temporary left."""
    real = small_tmpfs / "real.safetensors"
    old = safetensors.numpy.save({"w": np.arange(10, dtype=np.int32)})
    real.write_bytes(old)
    link = small_tmpfs / "model.safetensors"
    link.symlink_to(real.name)
    with pytest.raises(gdpath.GdpathError) as e:
        gst.save_file({"w": np.ones(4 << 20, np.uint8)}, link)
    assert "space" in str(e.value).lower() or "ENOSPC" in str(e.value), str(e.value)
    assert os.readlink(link) == real.name and real.read_bytes() == old
    assert sorted(os.listdir(small_tmpfs)) == ["model.safetensors", "real.safetensors"]
