"""asyncio for gdpath: ``await transfer`` and ``await agent.notification()``.

Nothing here polls. Each event loop gets one eventfd (``gdpath._native.Waker``) that the loop
watches with ``loop.add_reader``; the engine's completion hooks (a transfer's last pair done, a
notification queued) write it from the engine's threads, without the GIL, after queueing a
token; the reader callback, on the loop's thread, drains the tokens and resolves the futures.
A transfer on the network backend, which completes only while something progresses it, gets a
native thread that waits on it (without the GIL) and so drives the hook.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from typing import Any, AsyncIterator, Dict, Optional

from . import _native

_tokens = itertools.count(1)


class _LoopWaker:
    """The eventfd of one event loop and the futures waiting on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.waker = _native.Waker()
        # token -> (future, transfer)
        self.transfers: Dict[int, Any] = {}
        # agent id -> (agent, [futures])
        self.notified: Dict[int, Any] = {}
        loop.add_reader(self.waker.fileno(), self._ready)

    def _ready(self) -> None:
        for token in self.waker.drain():
            if token == _native.NOTIFICATION_TOKEN:
                self._deliver_notifications()
                continue
            entry = self.transfers.get(token)
            if entry is not None:
                self._settle(token, *entry)

    def _settle(self, token: int, fut: "asyncio.Future[Any]", transfer: Any, deadline: bool = False) -> None:
        if fut.done():
            self.transfers.pop(token, None)
            return
        if not (transfer.done() or transfer.cancelled or deadline):
            return  # not over yet (a hook fired for another reason)
        self.transfers.pop(token, None)
        try:
            # Over: the result is final (a deadline reached: the engine cancels and raises).
            fut.set_result(transfer.wait(0.0))
        except BaseException as e:  # the transfer's error, delivered to the awaiter
            fut.set_exception(e)

    def _deliver_notifications(self) -> None:
        for key, (agent, futs) in list(self.notified.items()):
            while futs:
                fut = futs[0]
                if fut.done():
                    futs.pop(0)
                    continue
                n = agent.wait_notification(0.0)
                if n is None:
                    break
                futs.pop(0)
                fut.set_result(n)
            if not futs:
                del self.notified[key]

    def close(self) -> None:
        try:
            self.loop.remove_reader(self.waker.fileno())
        except Exception:
            pass


_wakers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaker]" = weakref.WeakKeyDictionary()


def _waker(loop: asyncio.AbstractEventLoop) -> _LoopWaker:
    w = _wakers.get(loop)
    if w is None:
        w = _wakers[loop] = _LoopWaker(loop)
    return w


async def wait_transfer(transfer: Any) -> Any:
    """Waits for ``transfer`` without blocking the loop and returns its ``TransferReport``, or
    raises its ``gdpath.TransferError``. Cancelling the awaiting task cancels the transfer."""
    loop = asyncio.get_running_loop()
    w = _waker(loop)
    fut: asyncio.Future[Any] = loop.create_future()
    token = next(_tokens)
    w.transfers[token] = (fut, transfer)
    timer: Optional[asyncio.TimerHandle] = None
    left = transfer.deadline_in
    if left is not None:
        # The request's deadline ends the await even if an I/O never completes.
        timer = loop.call_later(max(left, 0.0), w._settle, token, fut, transfer, True)
    transfer._notify(w.waker, token)
    try:
        return await fut
    except asyncio.CancelledError:
        transfer.cancel()
        raise
    finally:
        if timer is not None:
            timer.cancel()
        w.transfers.pop(token, None)


async def wait_notification(agent: Any) -> Any:
    """The next notification ``agent`` receives (a ``gdpath.Notification``), without blocking
    the loop. Notifications arrive while the agent's network backend is progressed: a serving
    agent's thread (``agent.serve``) does it."""
    loop = asyncio.get_running_loop()
    w = _waker(loop)
    n = agent.wait_notification(0.0)
    if n is not None:
        return n
    fut: asyncio.Future[Any] = loop.create_future()
    entry = w.notified.setdefault(id(agent), (agent, []))
    entry[1].append(fut)
    agent._notify_notifications(w.waker)
    # One may have arrived between the check above and the hook's installation.
    w._deliver_notifications()
    return await fut


async def cluster_events(watch: Any) -> AsyncIterator[Dict[str, Any]]:
    """The events of ``watch`` (a ``gdpath.ClusterWatch``) as an async iterator: each wait
    runs in the loop's default executor (the GIL released, half a second at a time), so the
    loop never blocks; the iterator ends when the consumer stops."""
    loop = asyncio.get_running_loop()
    while True:
        e = await loop.run_in_executor(None, watch.next, 0.5)
        if e is not None:
            yield e
