"""``gdpath.topo()`` and ``gdpath.doctor()`` are the CLI's ``--json`` documents, byte for byte,
on every vendored fixture (NCCL XML, hwloc XML, ``nvidia-smi topo -m`` texts, captured
snapshots, the H200 snapshot) and on this machine."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import gdpath
from conftest import FIXTURES, REPO, gdpath_bin


def cli(args, cwd, env=None) -> str:
    out = subprocess.run([str(gdpath_bin()), *args, "--json"], cwd=cwd, capture_output=True,
                         text=True, env=env)
    # The doctor's exit status is its verdict (0-2, 4: none decided); 3 is a failure.
    assert out.returncode in (0, 1, 2, 4), (args, out.stderr)
    assert out.stdout.endswith("\n")
    return out.stdout[:-1]


def sources():
    for p in sorted((FIXTURES / "nccl-xml").glob("*.xml")):
        yield "nccl_xml", "--nccl-xml", p
    for p in sorted((FIXTURES / "hwloc-xml").glob("*.xml")):
        yield "hwloc_xml", "--hwloc-xml", p
    for p in sorted((FIXTURES / "nvidia-smi").glob("*.txt")):
        yield "smi_topo", "--smi-topo", p
    for p in sorted((FIXTURES / "device").glob("*.tar.gz")):
        yield "snapshot", "--snapshot", p
    yield "snapshot", "--snapshot", REPO / "assets" / "snapshots" / "h200x2.tar.gz"


SOURCES = list(sources())


@pytest.mark.parametrize("kw,flag,path", SOURCES, ids=[p.name for _, _, p in SOURCES])
def test_topo_is_the_cli_document(kw, flag, path, tmp_path):
    text = gdpath.topo_json(**{kw: str(path)})
    assert text == cli(["topo", flag, str(path)], tmp_path)
    doc = gdpath.topo(**{kw: str(path)})
    assert doc == json.loads(text) and doc["schema"] == "gdpath.topo/1"


@pytest.mark.parametrize("kw,flag,path", SOURCES, ids=[p.name for _, _, p in SOURCES])
def test_doctor_is_the_cli_document(kw, flag, path, scratch):
    # Same process environment and the same GDS directory for both.
    text = gdpath.doctor_json(**{kw: str(path)}, paths=[str(scratch)])
    assert text == cli(["doctor", flag, str(path), "--path", str(scratch)], scratch)
    doc = gdpath.doctor(**{kw: str(path)}, paths=[scratch])
    assert doc["schema"] == "gdpath.doctor/1" and doc["mode"] == "replay"


SYSFS = sorted((FIXTURES / "hwloc-sysfs").glob("*.tar.bz2"))


@pytest.mark.parametrize("dump", SYSFS, ids=[p.name for p in SYSFS])
def test_a_sysfs_tree_replays_as_the_cli_does(dump, tmp_path, scratch):
    import tarfile

    with tarfile.open(dump, "r:bz2") as t:
        # The vendored dumps are ours (fixtures/LICENSES); their links stay inside the tree.
        if hasattr(tarfile, "fully_trusted_filter"):
            t.extractall(tmp_path, filter="fully_trusted")
        else:
            t.extractall(tmp_path)
    (root,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert gdpath.topo_json(sysfs_root=str(root)) == cli(["topo", "--sysfs-root", str(root)], scratch)
    assert gdpath.doctor_json(sysfs_root=str(root), paths=[str(scratch)]) == cli(
        ["doctor", "--sysfs-root", str(root), "--path", str(scratch)], scratch)


def same_libraries_env() -> dict:
    """This process's environment for a CLI child that finds the CUDA libraries this process
    has already loaded: a framework (PyTorch's CUDA build) may have loaded ``libcufile.so.0``
    from its own wheel, which the engine's ``dlopen`` by name then finds here but a child would
    not; their folders go first on the child's ``LD_LIBRARY_PATH``."""
    names = ("libcufile.so", "libcuda.so", "libnvidia-ml.so")
    with open("/proc/self/maps") as maps:
        loaded = {line.split()[-1] for line in maps if any(n in line for n in names)}
    dirs = sorted({os.path.dirname(p) for p in loaded if p.startswith("/")})
    env = dict(os.environ)
    if dirs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(dirs + [env.get("LD_LIBRARY_PATH", "")]).rstrip(os.pathsep)
    return env


def test_this_machine_live(scratch):
    assert gdpath.topo_json() == cli(["topo"], scratch)
    live = gdpath.doctor(paths=[scratch])
    assert live["mode"] == "live"
    # The live doctor probes the directory; its document matches the CLI's run beside it.
    env = same_libraries_env()
    assert gdpath.doctor_json(paths=[str(scratch)]) == cli(["doctor", "--path", str(scratch)], scratch, env)
    # One path is a list of one (the trial's paths="/dir" was read as its characters).
    assert gdpath.doctor_json(paths=str(scratch)) == gdpath.doctor_json(paths=[scratch])
    # The default directory is the current one, as for the CLI.
    cwd = os.getcwd()
    try:
        os.chdir(scratch)
        assert gdpath.doctor_json() == cli(["doctor"], scratch, env)
    finally:
        os.chdir(cwd)
