"""``gdpath.safetensors`` as ``safetensors`` 0.8 (numpy, CPU): byte-identical bytes and files,
``load(bytes)`` of a hostile buffer, ``get_slice`` against NumPy indexing, and ``install()`` /
``uninstall()`` rebinding names other modules imported."""

from __future__ import annotations

import os
import sys
import types

import numpy as np
import pytest
import safetensors
import safetensors.numpy as snp

import gdpath
import gdpath.safetensors as gst
import gdpath.safetensors.numpy as gnp


def sample():
    rng = np.random.default_rng(7)
    return {"w": rng.standard_normal((3, 4)).astype(np.float32), "c": np.ones(3, np.complex64),
            "i": np.arange(6, dtype=np.int16).reshape(2, 3), "e": np.zeros((0, 2), np.uint8)}


def test_bytes_and_files_are_safetensors_own(scratch):
    t = sample()
    assert gnp.save(t) == snp.save(t)
    assert gnp.save(t, metadata={"format": "pt"}) == snp.save(t, metadata={"format": "pt"})
    gnp.save_file(t, scratch / "g.safetensors")
    assert (scratch / "g.safetensors").read_bytes() == snp.save(t)
    back = gnp.load(snp.save(t))
    assert set(back) == set(t)  # safetensors 0.8 returns them in hash-map order
    for k in t:
        assert np.array_equal(back[k], t[k]) and back[k].dtype == t[k].dtype


def test_hostile_bytes_raise_safetensor_error_before_allocating():
    huge = (10**12).to_bytes(8, "little") + b"{}"  # a header length far past the buffer
    with pytest.raises(safetensors.SafetensorError):
        gnp.load(huge)
    with pytest.raises(safetensors.SafetensorError):
        gnp.load(b"\x01")
    bad = b'{"a":{"dtype":"F32","shape":[1000000000],"data_offsets":[0,4000000000]}}'
    with pytest.raises(safetensors.SafetensorError):
        gst.deserialize(len(bad).to_bytes(8, "little") + bad)


def test_a_missing_file_is_worded_as_safetensors(scratch):
    """A missing file is ``FileNotFoundError`` with safetensors' own message from ``safe_open``
    and ``load_file``, and still a :class:`gdpath.StorageError` (kind ``open``) naming it."""
    missing = str(scratch / "missing.safetensors")
    with pytest.raises(FileNotFoundError) as theirs:
        safetensors.safe_open(missing, "np")
    for load in (lambda: gst.safe_open(missing, "np"), lambda: gnp.load_file(missing)):
        with pytest.raises(FileNotFoundError) as ours:
            load()
        assert str(ours.value) == str(theirs.value) == f"No such file or directory: {missing}"
        assert isinstance(ours.value, gdpath.StorageError) and ours.value.kind == "open"
        assert ours.value.filename == missing


def test_slices_match_numpy_and_read_only_their_rows(scratch):
    a = np.arange(60, dtype=np.float64).reshape(10, 6)
    snp.save_file({"a": a}, str(scratch / "s.safetensors"))
    with gst.safe_open(scratch / "s.safetensors", "np") as f:
        s = f.get_slice("a")
        assert s.get_shape() == [10, 6] and s.get_dtype() == "F64"
        for idx in [slice(None), (), slice(2, 5), (slice(None), slice(1, 6, 2)), (3, ...),
                    (..., -1), (slice(0, 10, 3), 2), []]:
            got = s[idx]
            assert np.array_equal(got, a[idx]) and got.flags.c_contiguous, idx
        with pytest.raises(safetensors.SafetensorError, match="index 19 out of bounds"):
            s[:20]
    with pytest.raises(safetensors.SafetensorError, match="closed"):
        f.keys()


def test_install_rebinds_imported_names_and_uninstall_restores():
    user = types.ModuleType("st_user")
    user.safe_open, user.load_file = safetensors.safe_open, snp.load_file
    sys.modules["st_user"] = user
    try:
        gst.install()
        assert user.safe_open is gst.safe_open and user.load_file is gnp.load_file
        assert safetensors.safe_open is gst.safe_open and snp.save is gnp.save
        gst.uninstall()
        assert user.safe_open is not gst.safe_open and safetensors.safe_open is not gst.safe_open
        assert snp.save is not gnp.save
    finally:
        gst.uninstall()
        del sys.modules["st_user"]


@pytest.mark.parametrize("data", [
    b"\x01",  # shorter than the length field
    (10**12).to_bytes(8, "little") + b"{}",  # a header past safetensors' limit
    (100).to_bytes(8, "little") + b"{}",  # a header longer than the buffer
    (5).to_bytes(8, "little") + b"{nope",  # not JSON
    (lambda h: len(h).to_bytes(8, "little") + h)(
        b'{"a":{"dtype":"F32","shape":[1000],"data_offsets":[0,4000]}}'),  # data past the end
    (lambda h: len(h).to_bytes(8, "little") + h + bytes(8))(
        b'{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}'),  # shape and offsets disagree
])
def test_load_bytes_errors_are_worded_as_safetensors_and_name_no_path(data):
    with pytest.raises(safetensors.SafetensorError) as real:
        snp.load(data)
    with pytest.raises(safetensors.SafetensorError) as ours:
        gnp.load(data)
    text = str(ours.value)
    assert "/proc/" not in text and "fd" not in text.split(), text
    assert text.startswith("Error while deserializing: "), text
    if str(real.value).endswith(("header too small", "header too large", "invalid header length")):
        assert text == str(real.value)


def test_save_bytes_without_room_in_dev_shm_uses_the_temp_dir(monkeypatch):
    """A /dev/shm too small for the data (a container's 64 MiB) is passed over, not filled."""
    t = sample()
    real = os.statvfs

    def tiny(path):
        st = real(path)
        if path == "/dev/shm":
            return os.statvfs_result((st.f_bsize, st.f_frsize, st.f_blocks, 0, 0) + tuple(st)[5:])
        return st

    made = []
    real_td = gst.tempfile.TemporaryDirectory

    def spy(*a, **kw):
        made.append(kw.get("dir"))
        return real_td(*a, **kw)

    monkeypatch.setattr(os, "statvfs", tiny)
    monkeypatch.setattr(gst.tempfile, "TemporaryDirectory", spy)
    assert gnp.save(t) == snp.save(t)
    assert made == [None]
