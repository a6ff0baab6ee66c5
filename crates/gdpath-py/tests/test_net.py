"""The network from Python over UCX on loopback: serve, connect, the peer's regions, puts and
gets byte-exact with their paths, tokens, withdrawal, notifications, clean close."""

from __future__ import annotations

import time

import numpy as np
import pytest

import gdpath
from conftest import Serving, gdpath_bin, net_agent, wait_event


@pytest.fixture
def pair():
    s = Serving(4 << 20)
    yield s.server, s.srv, s.buf, s.exported, s.rid, s.client, s.peer
    s.close()


def test_put_and_get_byte_exact_with_paths(pair):
    server, srv, buf, exported, rid, client, peer = pair
    (r,) = peer.regions()
    assert (r.id, r.kind, r.len) == (rid, "host", 4 << 20)
    remote = peer.memory(rid)
    assert remote.kind.startswith("remote (srv@") and remote.device == "remote"
    data = np.random.default_rng(1).integers(0, 256, 4 << 20, dtype=np.uint8)
    rep = client.post("write", client.register(data), remote).wait()
    assert rep.bytes == 4 << 20
    assert rep.pairs[0].path.startswith("ucx:tcp"), rep.pairs[0]
    assert np.array_equal(buf, data)
    back = np.zeros_like(data)
    rep = client.post("read", client.register(back)[1000:2000], remote[5000:6000]).wait()
    assert rep.pairs[0].path.startswith("ucx:")
    assert np.array_equal(back[1000:2000], data[5000:6000])
    assert peer.transport and peer.failure is None
    # Out of bounds of the remote region, before any byte moves.
    with pytest.raises(gdpath.DescriptorError) as e:
        client.post("write", client.register(bytearray(10)), remote.desc((4 << 20) - 5, 10))
    assert e.value.kind == "out_of_bounds"
    # A sub-range of it, and an id it does not export.
    part = peer.memory(rid, offset=4096, length=4096)
    assert len(part) == 4096
    with pytest.raises(gdpath.GdpathError) as e:
        peer.memory(rid + 99)
    assert e.value.kind == "config"


def test_notification_and_withdrawal(pair):
    server, srv, buf, exported, rid, client, peer = pair
    remote = peer.memory(rid)
    client.post("write", client.register(bytearray(b"\5" * 100)), remote[0:100], notify=b"n1").wait()
    n = server.wait_notification(20.0)
    assert (n.message, n.sender.startswith("cli@")) == (b"n1", True)
    assert server.take_notifications() == []
    server.unexport(exported)
    # The client learns of the withdrawal while its backend progresses (its posts' waits).
    with pytest.raises(gdpath.GdpathError) as e:
        for _ in range(200):
            client.post("write", client.register(bytearray(10)), remote[0:10]).wait(20)
    assert e.value.kind == "deregistered"


def test_tokens_and_a_clean_close():
    server = net_agent("srv")
    token = "0123456789abcdef-secret"
    srv = server.serve("127.0.0.1:0", token=token)
    client = net_agent("cli")
    with pytest.raises(gdpath.PeerError) as e:
        client.connect(srv.address, token="wrong-token-of-length")
    assert e.value.kind == "auth_failed"
    peer = client.connect(srv.address, token=token.encode())
    assert "connected" in wait_event(srv, "connected")
    peer.close()
    with pytest.raises(gdpath.PeerError):
        peer.regions()
    events = wait_event(srv, "left")
    assert "left" in events and "lost" not in events
    srv.close()


def serve_process(export: str):
    """`gdpath serve` in another process on loopback, exporting `export` (`host:1MiB`): the
    process and the address it says it listens on."""
    import subprocess

    srv = subprocess.Popen(
        [str(gdpath_bin()), "serve", "--listen", "127.0.0.1:0", "--devices", "lo",
         "--export", export, "--duration", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    for line in srv.stdout:
        if "listening on " in line:
            return srv, line.split("listening on ", 1)[1].split()[0]
    srv.kill()
    srv.wait(10)
    raise AssertionError("gdpath serve did not say where it listens")


def test_a_serving_process_shared_host_memory_is_written_in_place():
    """`gdpath serve --export host:SIZE` in another process exports shared memory: a client on
    this node writes and reads it with `memcpy` (path host-copy); with ``shared_memory=False``
    through UCX, and each client sees the other's bytes."""
    srv, addr = serve_process("host:1MiB")
    try:
        data = np.random.default_rng(7).integers(0, 256, 1 << 20, dtype=np.uint8)
        for shared, path in [(True, "host-copy"), (False, "ucx:")]:
            a = gdpath.Agent(name=f"cli-{shared}")
            a.enable_net(devices="lo", shared_memory=shared)
            peer = a.connect(addr)
            remote = peer.memory(peer.regions()[0].id)
            mine = data if shared else data[::-1].copy()
            rep = a.post("write", a.register(mine), remote).wait()
            assert rep.pairs[0].path.startswith(path), rep.pairs[0]
            back = np.zeros_like(data)
            rep = a.post("read", a.register(back), remote).wait()
            assert rep.pairs[0].path.startswith(path), rep.pairs[0]
            assert np.array_equal(back, mine)
            peer.close()
    finally:
        srv.kill()
        srv.wait(10)


def test_reconnect_after_close_with_a_live_region_is_prompt():
    """`peer.close()` while a `peer.memory(id)` Region is alive, then `connect` to the same
    `gdpath serve` again: the connect once waited its whole timeout ("cannot answer the
    server: no answer in time", the server stuck closing its endpoint to the closed peer). It
    is made at once now, each time; the old Regions refuse posts, the new one moves bytes."""
    srv, addr = serve_process("host:1MiB")
    a = gdpath.Agent(name="cli-again")
    a.enable_net(devices="lo", shared_memory=False)
    old = []
    try:
        for round_ in range(3):
            start = time.monotonic()
            peer = a.connect(addr, timeout=4.0)
            took = time.monotonic() - start
            # Far below the 5 s the server's endpoint close waited, far above a handshake.
            assert took < 2.0, f"round {round_}: connect took {took:.2f} s"
            remote = peer.memory(peer.regions()[0].id)
            data = bytearray(bytes([round_ + 1]) * 4096)
            assert a.post("write", a.register(data), remote[0:4096]).wait(20).bytes == 4096
            back = bytearray(4096)
            a.post("read", a.register(back), remote[0:4096]).wait(20)
            assert back == data
            peer.close()
            with pytest.raises(gdpath.PeerError) as e:
                a.post("write", a.register(data), remote[0:4096])
            assert "closed the connection" in str(e.value), e.value
            old.append(remote)
        start = time.monotonic()
        del old[:]
        assert time.monotonic() - start < 0.5
    finally:
        srv.kill()
        srv.wait(10)


def test_a_region_from_a_peer_is_used_as_it_is_not_registered_again(pair):
    """`agent.register(peer.memory(id))` said only "cannot register a Region": it says the
    Region is registered memory already, and how to use it."""
    server, srv, buf, exported, rid, client, peer = pair
    remote = peer.memory(rid)
    with pytest.raises(TypeError) as e:
        client.register(remote)
    msg = str(e.value)
    assert "registered memory already" in msg and "peer.memory(id)" in msg, msg
    assert "region.desc(offset, length)" in msg, msg
    local = client.register(bytearray(16))
    with pytest.raises(TypeError, match=r"registered memory already \(host"):
        client.register(local)


def test_a_post_to_a_peer_that_failed_raises_peer_error():
    """After a peer's process is killed, the transfer that meets the loss fails, and later posts
    to its memory raise `PeerError` at once (the trial saw `UnsupportedError`, kind `refused`)."""
    srv, addr = serve_process("host:1MiB")
    a = gdpath.Agent(name="cli-lost")
    a.enable_net(devices="lo", shared_memory=False)
    try:
        peer = a.connect(addr)
        remote = peer.memory(peer.regions()[0].id)
        src = a.register(bytearray(b"z" * 4096))
        assert a.post("write", src, remote[0:4096]).wait(20).bytes == 4096
    finally:
        srv.kill()
        srv.wait(10)
    met = None
    for _ in range(50):  # the loss shows in a transfer's wait or at a post
        try:
            a.post("write", src, remote[0:4096]).wait(20)
        except gdpath.GdpathError as e:
            met = e
            break
        time.sleep(0.1)
    assert isinstance(met, gdpath.GdpathError) and met.kind in ("peer_failed", "refused"), met
    with pytest.raises(gdpath.PeerError) as e:
        a.post("write", src, remote[0:4096])
    assert (e.value.kind, e.value.finding) == ("refused", "net.peer-failed"), e.value


class _Interrupted(Exception):
    """What the test's SIGINT handler raises: a stray interrupt fails one test, not the run."""


def test_ctrl_c_interrupts_a_wait_on_a_stalled_peer_and_the_transfer_goes_on():
    """A write to a peer that stopped (SIGSTOP) cannot complete; a SIGINT (here
    `_thread.interrupt_main`, through a handler of the test's own) interrupts `wait()` within its
    0.1 s slices, not at the network's operation timeout, and once the peer runs again the same
    transfer completes whole."""
    import _thread
    import signal
    import threading
    import time

    def interrupted(signum, frame):
        raise _Interrupted()

    srv, addr = serve_process("host:64MiB")
    old = signal.signal(signal.SIGINT, interrupted)
    timer = threading.Timer(0.3, _thread.interrupt_main)
    try:
        a = gdpath.Agent(name="cli-sigint")
        a.enable_net(devices="lo", shared_memory=False, op_timeout=30.0)
        peer = a.connect(addr)
        remote = peer.memory(peer.regions()[0].id)
        srv.send_signal(signal.SIGSTOP)
        t = a.post("write", a.register(np.ones(64 << 20, dtype=np.uint8)), remote)
        t0 = time.monotonic()
        with pytest.raises(_Interrupted):
            timer.start()
            t.wait()
        assert time.monotonic() - t0 < 5.0
        srv.send_signal(signal.SIGCONT)
        assert t.wait(30).bytes == 64 << 20
        peer.close()
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, old)
        srv.send_signal(signal.SIGCONT)
        srv.kill()
        srv.wait(10)


def test_ctrl_c_interrupts_the_waits_on_notifications_events_and_regions():
    """`wait_notification`, `next_event` and `wait_for_region` wait in slices too: a SIGINT
    (the test's own handler) ends each within a second, not at its 30 s timeout."""
    import _thread
    import signal
    import threading
    import time

    def interrupted(signum, frame):
        raise _Interrupted()

    s = Serving(4096)
    # The client's connection is the server's one event: taken first, none is pending.
    assert "connected" in wait_event(s.srv, "connected")
    old = signal.signal(signal.SIGINT, interrupted)
    try:
        for wait in (lambda: s.server.wait_notification(30.0), lambda: s.srv.next_event(30.0),
                     lambda: s.peer.wait_for_region(s.rid + 99, 30.0)):
            timer = threading.Timer(0.3, _thread.interrupt_main)
            t0 = time.monotonic()
            try:
                with pytest.raises(_Interrupted):
                    timer.start()
                    wait()
            finally:
                timer.cancel()
            assert time.monotonic() - t0 < 5.0
    finally:
        signal.signal(signal.SIGINT, old)
        s.close()
