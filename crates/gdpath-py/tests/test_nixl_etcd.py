"""NIXL's etcd metadata path on gdpath's cluster, against a real etcd (test_cluster.py's
fixture: Debian's etcd-server on free loopback ports, skipped aloud without the binary unless
GDPATH_REQUIRE_ETCD=1): one process publishes with ``send_local_metadata()``, another finds it
by name with ``fetch_remote_metadata(name)`` and READs its host memory through prepared
lists, verified; an unknown name fails with NIXL's not-found error by the deadline; a reader
without the token moves nothing; a withdrawn or killed agent is gone for the nixl layer (its
transfers ``"ERR"`` within the lease TTL, ``check_remote_metadata`` False)."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from test_cluster import etcd_url  # noqa: F401 - the fixture that starts etcd

import gdpath.nixl as nixl
from gdpath.nixl._api import etcd_url_from_env

TOKEN = "nixl-etcd-token-0123456789abcdef"
BLOCKS, BS = 4096, 4096
TTL = 2.0

PREFILL = """
import sys, time, numpy as np
import gdpath.nixl as nixl
cfg = nixl.nixl_agent_config(token=sys.argv[2], cluster=sys.argv[1], lease_ttl=2, net_devices="lo")
a = nixl.nixl_agent("prefill", cfg)
buf = (np.arange(int(sys.argv[3]), dtype=np.uint64) * 2654435761 % 251).astype(np.uint8)
a.register_memory(a.get_reg_descs([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM"))
a.send_local_metadata()
print(buf.ctypes.data, flush=True)
time.sleep(120)
"""


def _cfg(url: str, token: str = TOKEN, **kw) -> "nixl.nixl_agent_config":
    return nixl.nixl_agent_config(token=token, cluster=url, lease_ttl=TTL, net_devices="lo", connect_timeout=kw.pop("connect_timeout", 5.0), **kw)


def _blocks(base: int) -> list:
    return [(base + i * BS, BS, 0) for i in range(BLOCKS)]


def _until(pred, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while not pred():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def test_fetched_by_name_read_verified_thief_refused_killed_is_err_within_ttl(etcd_url):  # noqa: F811
    proc = subprocess.Popen([sys.executable, "-c", PREFILL, etcd_url, TOKEN, str(BLOCKS * BS)], stdout=subprocess.PIPE, text=True)
    me = thief = None
    try:
        base = int(proc.stdout.readline())
        me = nixl.nixl_agent("decode", _cfg(etcd_url))
        me.fetch_remote_metadata("prefill")
        assert _until(lambda: me.check_remote_metadata("prefill"), 10)
        assert me.check_remote_metadata("prefill", me.get_xfer_descs([(base, BS, 0)], "DRAM"))

        mine = np.zeros(BLOCKS * BS, dtype=np.uint8)
        me.register_memory(me.get_reg_descs([(mine.ctypes.data, mine.nbytes, 0, "")], "DRAM"))
        local = me.prep_xfer_dlist("NIXL_INIT_AGENT", _blocks(mine.ctypes.data), "DRAM")
        remote = me.prep_xfer_dlist("prefill", _blocks(base), "DRAM")
        # Scattered: block i of the peer lands in block BLOCKS-1-i here.
        src = np.arange(BLOCKS)
        h = me.make_prepped_xfer("READ", local, src[::-1].copy(), remote, src)
        assert me.transfer(h) in ("PROC", "DONE")
        assert _until(lambda: me.check_xfer_state(h) != "PROC", 30)
        assert me.check_xfer_state(h) == "DONE"
        want = (np.arange(BLOCKS * BS, dtype=np.uint64) * 2654435761 % 251).astype(np.uint8)
        assert np.array_equal(mine.reshape(BLOCKS, BS), want.reshape(BLOCKS, BS)[::-1])
        me.release_xfer_handle(h)

        # Reading etcd grants nothing: the record is found, the channel refuses the token.
        thief = nixl.nixl_agent("thief", _cfg(etcd_url, token="not-the-token-0123456789abcdef"))
        with pytest.raises(nixl.nixlRemoteDisconnectError):
            thief.fetch_remote_metadata("prefill")
        assert not thief.check_remote_metadata("prefill")
        with pytest.raises(nixl.nixlNotFoundError):
            thief.prep_xfer_dlist("prefill", _blocks(base), "DRAM")

        # The peer killed mid-transfer: the transfer in flight ends "ERR" within the TTL,
        # and the agent is unknown after (a new incarnation must be fetched again).
        killed = None
        state = "DONE"
        h = me.make_prepped_xfer("READ", local, src, remote, src)
        for i in range(100000):
            me.transfer(h)
            if i == 2:
                proc.kill()
                killed = time.monotonic()
            _until(lambda: me.check_xfer_state(h) != "PROC", 30)
            state = me.check_xfer_state(h)
            if state == "ERR":
                break
        assert state == "ERR"
        assert killed is not None and time.monotonic() - killed < TTL + 3
        assert _until(lambda: not me.check_remote_metadata("prefill"), TTL + 3)
        with pytest.raises(nixl.nixlNotFoundError):
            me.prep_xfer_dlist("prefill", _blocks(base), "DRAM")
    finally:
        proc.kill()
        proc.wait()
        for a in (me, thief):
            if a is not None:
                a.close()


def test_unknown_name_is_not_found_by_the_deadline_and_invalidate_withdraws(etcd_url):  # noqa: F811
    me = nixl.nixl_agent("lonely", _cfg(etcd_url, connect_timeout=0.5))
    t0 = time.monotonic()
    with pytest.raises(nixl.nixlNotFoundError):
        me.fetch_remote_metadata("nobody")
    assert time.monotonic() - t0 < 3
    assert not me.check_remote_metadata("nobody")

    # Not published before send_local_metadata (NIXL's keys are written there, too).
    other = nixl.nixl_agent("other", _cfg(etcd_url))
    with pytest.raises(nixl.nixlNotFoundError):
        me.fetch_remote_metadata("other")
    other.send_local_metadata()
    me.fetch_remote_metadata("other")
    assert _until(lambda: me.check_remote_metadata("other"), 10)
    # Withdrawn: gone for the agents that fetched it; published again, fetched again.
    other.invalidate_local_metadata()
    assert _until(lambda: not me.check_remote_metadata("other"), TTL + 3)
    other.send_local_metadata()
    me.fetch_remote_metadata("other")
    assert _until(lambda: me.check_remote_metadata("other"), 10)
    # A second agent claiming a published name is refused.
    twin = nixl.nixl_agent("other", _cfg(etcd_url))
    with pytest.raises(nixl.nixlNotAllowedError):
        twin.send_local_metadata()
    for a in (twin, other, me):
        a.close()


def test_nixl_etcd_environment_is_translated():
    env = {"NIXL_ETCD_ENDPOINTS": "http://10.0.0.1:2379,http://10.0.0.2:2379"}
    assert etcd_url_from_env(env) == "etcd://10.0.0.1:2379,10.0.0.2:2379/nixl"
    env["NIXL_ETCD_NAMESPACE"] = "/serving/kv/agents/"
    assert etcd_url_from_env(env) == "etcd://10.0.0.1:2379,10.0.0.2:2379/serving.kv"
    assert etcd_url_from_env({"NIXL_ETCD_ENDPOINTS": "https://e:2379"}) == "etcds://e:2379/nixl"
    assert etcd_url_from_env({}) is None
    with pytest.raises(nixl.nixlInvalidParamError):
        etcd_url_from_env({"NIXL_ETCD_ENDPOINTS": "http://a:1,https://b:2"})
    with pytest.raises(nixl.nixlInvalidParamError):
        etcd_url_from_env({"NIXL_ETCD_ENDPOINTS": "unix:///x"})
