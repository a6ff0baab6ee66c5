"""``await transfer`` and ``await agent.notification()`` in asyncio: the loop is woken through
the eventfd the engine's completion hooks write (no polling), many awaits at once, cancelled and
timed-out transfers, and task cancellation."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

import gdpath
from conftest import Serving


def big_file(agent, scratch, n=8 << 20):
    data = np.random.default_rng(5).integers(0, 256, n, dtype=np.uint8)
    (scratch / "a").write_bytes(data.tobytes())
    return agent.register(gdpath.File(str(scratch / "a"))), data


def test_await_a_transfer(agent, scratch):
    f, data = big_file(agent, scratch)
    out = np.zeros_like(data)
    dst = agent.register(out)

    async def main():
        t = agent.post("read", dst, f.desc(0, data.nbytes))
        rep = await t
        return rep, t

    rep, t = asyncio.run(main())
    assert rep.bytes == data.nbytes and rep.pairs[0].path in ("posix-direct", "posix-buffered")
    assert np.array_equal(out, data) and t.done()


def test_many_awaits_at_once_and_the_loop_stays_free(agent, scratch):
    f, data = big_file(agent, scratch)
    k = 1 << 20
    outs = [np.zeros(k, dtype=np.uint8) for _ in range(8)]
    regions = [agent.register(o) for o in outs]

    async def ticker(stop):
        n = 0
        while not stop.is_set():
            await asyncio.sleep(0)
            n += 1
        return n

    async def main():
        stop = asyncio.Event()
        tick = asyncio.ensure_future(ticker(stop))
        ts = [agent.post("read", r, f.desc(i * k, k)) for i, r in enumerate(regions)]
        reps = await asyncio.gather(*ts)
        stop.set()
        return reps, await tick

    reps, ticks = asyncio.run(main())
    assert [r.bytes for r in reps] == [k] * 8
    for i, o in enumerate(outs):
        assert np.array_equal(o, data[i * k:(i + 1) * k])
    assert ticks > 0  # the loop ran other tasks while the transfers were awaited


def test_an_already_finished_transfer_returns_at_once(agent, scratch):
    f, data = big_file(agent, scratch, 4096)
    t = agent.post("read", agent.register(bytearray(4096)), f.desc(0, 4096))
    t.wait()

    async def main():
        return await t

    assert asyncio.run(asyncio.wait_for(main(), 5)).bytes == 4096


def test_cancel_deadline_and_task_cancellation(agent, scratch):
    f, data = big_file(agent, scratch, 64 << 20)
    out = np.zeros_like(data)
    dst = agent.register(out)
    k = 1 << 20
    pairs = ([dst[i * k:(i + 1) * k] for i in range(64)], [f.desc(i * k, k) for i in range(64)])

    async def cancelled():
        t = agent.post("read", *pairs)
        t.cancel()
        return await t

    try:
        rep = asyncio.run(asyncio.wait_for(cancelled(), 30))
        assert rep.bytes == 64 << 20  # every pair was under way before the cancel
    except gdpath.Cancelled as e:
        assert e.kind == "cancelled"

    async def past_deadline():
        return await agent.post("read", *pairs, timeout=0.0)

    with pytest.raises(gdpath.DeadlineExceeded):
        asyncio.run(asyncio.wait_for(past_deadline(), 30))

    async def task_cancelled():
        t = agent.post("read", *pairs)
        task = asyncio.ensure_future(_await(t))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return t

    t = asyncio.run(task_cancelled())
    assert t.cancelled  # cancelling the awaiting task cancelled the transfer
    try:
        t.wait(30)
    except gdpath.Cancelled:
        pass


async def _await(t):
    return await t


def test_await_a_network_transfer_and_a_notification():
    s = Serving(1 << 20)
    server, buf, client, peer = s.server, s.buf, s.client, s.peer
    remote = peer.memory(s.rid)
    data = np.random.default_rng(9).integers(0, 256, 1 << 20, dtype=np.uint8)
    local = client.register(data)

    async def main():
        waiting = asyncio.ensure_future(server.notification())
        await asyncio.sleep(0)
        t = client.post("write", local, remote, notify=b"layer 7 done")
        assert t.needs_progress
        rep = await t
        n = await asyncio.wait_for(waiting, 20)
        return rep, n

    rep, n = asyncio.run(main())
    assert rep.bytes == 1 << 20 and rep.pairs[0].path.startswith("ucx:")
    assert n.message == b"layer 7 done" and n.sender.startswith("cli@")
    assert np.array_equal(buf, data)

    # A notification that arrived before the await is returned at once.
    peer.notify(b"second")
    deadline = time.time() + 20

    async def later():
        return await server.notification()

    n = asyncio.run(asyncio.wait_for(later(), max(deadline - time.time(), 1)))
    assert n.message == b"second"
    s.close()
