"""Every bad input the engine refuses is refused from Python with the engine's kind (the
strings of ``gdpath::Error::kind()``, the CLI's ``gdpath.error/1`` kinds), as a
``gdpath.GdpathError`` subclass, before any byte moves."""

from __future__ import annotations

import pytest

import gdpath


@pytest.fixture
def setup(agent, scratch):
    (scratch / "f").write_bytes(b"\7" * 10_000)
    f = agent.register(gdpath.File(str(scratch / "f")))
    buf = bytearray(4096)
    return agent, f, agent.register(buf), buf, scratch


def kind_of(fn) -> gdpath.GdpathError:
    with pytest.raises(gdpath.GdpathError) as e:
        fn()
    return e.value


def test_descriptor_errors(setup):
    agent, f, dst, buf, _ = setup
    cases = {
        "out_of_bounds": lambda: agent.post("read", dst.desc(4000, 200), f.desc(0, 200)),
        "list_length_mismatch": lambda: agent.post("read", [dst[0:10], dst[10:20]], [f.desc(0, 10)]),
        "pair_length_mismatch": lambda: agent.post("read", dst.desc(0, 10), f.desc(0, 11)),
        "short_file": lambda: agent.post("read", dst.desc(0, 100), f.desc(9_950, 100)),
        "read_only": lambda: agent.post("write", dst.desc(0, 10), f.desc(0, 10)),
    }
    for kind, fn in cases.items():
        e = kind_of(fn)
        assert e.kind == kind, (kind, e)
        assert isinstance(e, (gdpath.DescriptorError, gdpath.ReadOnlyMemoryError)), e
    e = kind_of(cases["out_of_bounds"])
    assert (e.index, e.side) == (0, "local")
    assert buf == bytearray(4096), "nothing moved"
    assert dst.in_flight == 0


def test_regions_of_another_agent_and_deregistered_ones(setup):
    agent, f, dst, _, _ = setup
    other = gdpath.Agent()
    theirs = other.register(bytearray(4096))
    assert kind_of(lambda: agent.post("read", theirs, f.desc(0, 4096))).kind == "foreign_region"
    assert kind_of(lambda: agent.deregister(theirs)).kind == "foreign_region"
    mine = agent.register(bytearray(4096))
    agent.deregister(mine)
    assert kind_of(lambda: agent.post("read", mine, f.desc(0, 4096))).kind == "deregistered"


def test_files_that_cannot_be_registered(setup):
    agent, _, _, _, scratch = setup
    e = kind_of(lambda: agent.register(gdpath.File(str(scratch / "missing"))))
    assert e.kind == "open" and isinstance(e, OSError) and "missing" in str(e)
    e = kind_of(lambda: agent.register(gdpath.File(str(scratch))))
    assert e.kind == "not_a_file"
    with pytest.raises(ValueError, match="mode"):
        gdpath.File(str(scratch / "f"), "rw")
    with pytest.raises(ValueError, match="direct"):
        gdpath.File(str(scratch / "f"), direct="sometimes")


def test_file_errors_are_the_oserror_python_raises(setup):
    """A missing file is ``FileNotFoundError`` with its errno and filename, as ``open()`` and
    ``safetensors`` raise it; an existing one not to be replaced is ``FileExistsError``; the
    messages say the Python way out and keep gdpath's text."""
    import errno

    np = pytest.importorskip("numpy")
    from gdpath.safetensors import load_file, save_file

    agent, f, _, _, scratch = setup
    missing = str(scratch / "missing.safetensors")
    for fn in (
        lambda: agent.register(gdpath.File(missing)),
        lambda: load_file(missing, framework="numpy"),
    ):
        with pytest.raises(FileNotFoundError) as e:
            fn()
        assert isinstance(e.value, gdpath.StorageError) and e.value.kind == "open"
        assert e.value.errno == errno.ENOENT and e.value.filename == missing
        assert missing in str(e.value) and "[Errno" not in str(e.value)
    (scratch / "old.safetensors").write_bytes(b"old")
    with pytest.raises(FileExistsError) as e:
        save_file({"a": np.zeros(4, np.float32)}, str(scratch / "old.safetensors"), overwrite=False)
    assert e.value.kind == "exists" and "overwrite=True" in str(e.value)
    assert (scratch / "old.safetensors").read_bytes() == b"old"
    src = agent.register(bytearray(16))
    with pytest.raises(gdpath.ReadOnlyMemoryError) as e:
        agent.post("write", src.desc(0, 16), f.desc(0, 16)).wait(10)
    assert 'mode="r+"' in str(e.value)


def test_file_errors_pickle_with_their_errno(scratch):
    """Errors cross process boundaries (multiprocessing, concurrent.futures): a file error keeps
    its class, errno, filename and message through pickle and copy."""
    import copy
    import pickle

    missing = str(scratch / "missing.safetensors")
    with pytest.raises(FileNotFoundError) as e:
        gdpath.Checkpoint([missing])
    for back in (pickle.loads(pickle.dumps(e.value)), copy.copy(e.value)):
        assert isinstance(back, FileNotFoundError) and isinstance(back, gdpath.StorageError)
        assert (back.kind, back.errno, back.filename, str(back)) == (
            e.value.kind,
            e.value.errno,
            e.value.filename,
            str(e.value),
        )


def test_timeouts_and_network_arguments(setup):
    agent, f, dst, _, _ = setup
    with pytest.raises(ValueError, match="seconds"):
        agent.post("read", dst, f.desc(0, 4096), timeout=-1.0)
    with pytest.raises(ValueError, match="op"):
        agent.post("copy", dst, f.desc(0, 4096))
    with pytest.raises(TypeError):
        agent.post("read", "dst", f.desc(0, 4096))
    e = kind_of(lambda: agent.serve("0.0.0.0:0"))
    assert e.kind == "config" and "token" in str(e)
    e = kind_of(lambda: agent.serve("127.0.0.1:0", token="short"))
    assert e.kind == "config" and "too short" in str(e)


def test_a_timeout_too_long_or_not_a_number_says_so_in_few_digits(setup):
    """`timeout=1e300` once put its 301 digits in the message; it names the argument, the
    number as written, and the most a timeout may be."""
    agent, f, dst, _, _ = setup
    with pytest.raises(ValueError) as e:
        agent.post("read", dst, f.desc(0, 4096), timeout=1e300)
    msg = str(e.value)
    assert msg.startswith("timeout 1e300 s is longer than the most this accepts ("), msg
    assert len(msg) < 120, msg
    with pytest.raises(ValueError, match=r"^timeout NaN is not a number of seconds"):
        agent.wait_notification(float("nan"))
    with pytest.raises(ValueError, match=r"^connect_timeout 1e300 s is longer"):
        gdpath.Agent().enable_net(connect_timeout=1e300)
    # A long bound that a duration holds is accepted (no bound in practice).
    assert agent.post("read", dst, f.desc(0, 4096), timeout=1e18).wait(1e18).bytes == 4096


def test_checkpoint_errors_are_of_kind_checkpoint(scratch):
    (scratch / "bad.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{nope")
    with pytest.raises(gdpath.CheckpointError) as e:
        gdpath.Checkpoint([str(scratch / "bad.safetensors")])
    assert e.value.kind == "checkpoint" and "bad.safetensors" in str(e.value)
    with pytest.raises(gdpath.CheckpointError):
        gdpath.Checkpoint([])


def test_doctor_and_topo_arguments(scratch):
    e = kind_of(lambda: gdpath.doctor(paths=[str(scratch / "nope")]))
    assert e.kind == "usage" and "not a directory" in str(e)
    e = kind_of(lambda: gdpath.topo(snapshot=str(scratch / "none.tar.gz")))
    assert e.kind == "topology"
    with pytest.raises(ValueError, match="at most one"):
        gdpath.topo(snapshot="a", nccl_xml="b")
