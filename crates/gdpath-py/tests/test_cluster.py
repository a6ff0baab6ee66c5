"""The cluster from Python against a real etcd (Debian's etcd-server, started here on free
loopback ports with a temporary data directory): an agent published by name, found by name
with its incarnation checked, bytes moved and verified, its export and doctor verdicts in its
record, events as an async iterator, a second
claim of a name refused, and a peer whose record goes reported gone. Skips aloud without the
etcd binary (CI installs it and sets GDPATH_REQUIRE_ETCD=1, which makes that a failure)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import gdpath

TOKEN = "python-cluster-token-0123456789"


def _free_ports() -> tuple[int, int]:
    """Two distinct free loopback ports (both held until both are chosen)."""
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        return a.getsockname()[1], b.getsockname()[1]


# A loaded 2-core CI machine has needed more than 20 s to start etcd.
_HEALTHY_WITHIN = 60.0


def _start_etcd(binary: str, d: str):
    """etcd on fresh ports in `d`; a start that exits at once (a port taken meanwhile) is
    retried on new ports. Returns (process, client port); fails the test if it never answers."""
    for attempt in range(3):
        cport, pport = _free_ports()
        client, peer = f"http://127.0.0.1:{cport}", f"http://127.0.0.1:{pport}"
        data = os.path.join(d, f"data{attempt}")
        log = open(os.path.join(d, f"etcd{attempt}.log"), "wb")
        proc = subprocess.Popen(
            [binary, "--name", "t", "--data-dir", data,
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"t={peer}"],
            stdout=subprocess.DEVNULL, stderr=log,
        )
        log.close()
        end = time.monotonic() + _HEALTHY_WITHIN
        while time.monotonic() < end and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", cport), 0.2).close()
                return proc, cport
            except OSError:
                time.sleep(0.1)
        proc.kill()
        proc.wait()
        if time.monotonic() >= end:
            break
    with open(os.path.join(d, f"etcd{attempt}.log"), "rb") as f:
        tail = f.read()[-2000:].decode(errors="replace")
    pytest.fail(f"etcd did not start within {_HEALTHY_WITHIN:.0f} s; its log ends:\n{tail}")


@pytest.fixture
def etcd_url():
    binary = shutil.which("etcd")
    if binary is None:
        if os.environ.get("GDPATH_REQUIRE_ETCD"):
            pytest.fail("GDPATH_REQUIRE_ETCD is set but no etcd binary is installed")
        pytest.skip("no etcd binary (apt-get install etcd-server)")
    with tempfile.TemporaryDirectory() as d:
        proc, cport = _start_etcd(binary, d)
        try:
            yield f"etcd://127.0.0.1:{cport}/py"
        finally:
            proc.kill()
            proc.wait()


def _agent(name: str, url: str, ttl: float = 2.0) -> gdpath.Agent:
    a = gdpath.Agent(name=name, cluster=url, lease_ttl=ttl)
    a.enable_net(devices="lo", shared_memory=False)
    return a


def test_found_by_name_verified_transfer_events_and_gone(etcd_url):
    prefill = _agent("prefill-0", etcd_url)
    assert prefill.name.startswith("prefill-0#")
    kv = np.arange(1 << 20, dtype=np.uint8)
    rid = prefill.export(prefill.register(kv))
    srv = prefill.serve("127.0.0.1:0", token=TOKEN)

    decode = _agent("decode-0", etcd_url)
    # Reading etcd grants nothing: without the token no connection.
    with pytest.raises(gdpath.PeerError) as e:
        decode.peer("prefill-0", timeout=2.0)
    assert e.value.kind == "auth_failed"
    p = decode.peer("prefill-0", token=TOKEN, timeout=5.0)
    assert p.name == "prefill-0" and len(p.incarnation) == 32
    assert prefill.name == f"prefill-0#{p.incarnation}"
    assert p.gone is None
    back = np.zeros_like(kv)
    rep = p.wait(decode.post("read", decode.register(back), p.peer.memory(rid)), 20)
    assert rep.bytes == kv.nbytes
    assert np.array_equal(back, kv)

    # A second agent claiming the name is refused, naming the holder.
    twin = _agent("prefill-0", etcd_url)
    with pytest.raises(gdpath.GdpathError) as e:
        twin.serve("127.0.0.1:0", token=TOKEN)
    assert e.value.kind == "name_taken" and p.incarnation in str(e.value)

    async def events():
        seen = []
        async for ev in decode.cluster_events():
            seen.append(ev)
            if ev["event"] == "joined" and ev["record"]["name"] == "prefill-0":
                return seen
    seen = asyncio.run(asyncio.wait_for(events(), 10))
    assert seen[-1]["record"]["incarnation"] == p.incarnation
    # The record lists the export as the engine offers it: numpy's memory is private (no
    # sealed memfd for agents of this node), host memory has no CUDA IPC handle.
    (region,) = seen[-1]["record"]["regions"]
    assert region == {"id": rid, "kind": "host", "len": kv.nbytes, "shm": False,
                      "cuda_ipc": False}
    # The doctor's verdicts come by an update of the same incarnation soon after publishing.
    w = decode.cluster_watch()
    end = time.monotonic() + 35
    verdicts = {}
    while not verdicts and time.monotonic() < end:
        ev = w.next(0.5)
        if ev and ev["event"] in ("joined", "updated") and ev["record"]["name"] == "prefill-0":
            assert ev["record"]["incarnation"] == p.incarnation
            verdicts = ev["record"]["topology"]["verdicts"]
    assert sorted(verdicts) == ["gdr", "gds", "p2p"], verdicts

    # The prefill agent goes (its server and agent dropped: its lease is revoked): the peer
    # is reported gone, and check() raises peer_gone.
    srv.close()
    del prefill
    end = time.monotonic() + 10
    while p.gone is None and time.monotonic() < end:
        time.sleep(0.05)
    assert p.gone is not None
    with pytest.raises(gdpath.GdpathError) as e:
        p.check()
    assert e.value.kind == "peer_gone"


def test_resolution_gives_up_at_its_deadline_and_names_are_checked(etcd_url):
    a = _agent("lonely", etcd_url)
    t0 = time.monotonic()
    with pytest.raises(gdpath.GdpathError) as e:
        a.peer("nobody", token=TOKEN, timeout=0.3)
    assert e.value.kind == "not_found"
    assert time.monotonic() - t0 < 5
    with pytest.raises(gdpath.GdpathError) as e:
        gdpath.Agent(name="a/b", cluster=etcd_url)
    assert e.value.kind == "usage"
    with pytest.raises(ValueError):
        gdpath.Agent(name="x").peer("y")


PREFILL = """
import sys, time, numpy as np, gdpath
a = gdpath.Agent(name="prefill-9", cluster=sys.argv[1], lease_ttl=2)
a.enable_net(devices="lo", shared_memory=False)
buf = np.zeros(8 << 20, dtype=np.uint8)
a.export(a.register(buf))
srv = a.serve("127.0.0.1:0", token=sys.argv[2])
print("ready", flush=True)
time.sleep(120)
"""


def test_a_peer_killed_mid_transfer_is_gone_within_its_ttl(etcd_url):
    proc = subprocess.Popen([sys.executable, "-c", PREFILL, etcd_url, TOKEN], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        decode = _agent("decode-9", etcd_url)
        p = decode.peer("prefill-9", token=TOKEN, timeout=5.0)
        (r,) = p.peer.regions()
        remote = p.peer.memory(r.id)
        data = decode.register(np.full(8 << 20, 7, dtype=np.uint8))
        p.wait(decode.post("write", data, remote), 20)
        killed = None
        with pytest.raises(gdpath.GdpathError) as e:
            for i in range(100000):
                if i == 3:
                    proc.kill()
                    killed = time.monotonic()
                p.wait(decode.post("write", data, remote), 30)
        assert e.value.kind == "peer_gone", e.value
        assert killed is not None and time.monotonic() - killed < 2 + 3
        # Later posts are refused at once through check().
        with pytest.raises(gdpath.GdpathError) as e:
            p.check()
        assert e.value.kind == "peer_gone"
    finally:
        proc.kill()
        proc.wait()
