"""How a batch's results reach the ones waiting for them: a blocked thread or an asyncio
event loop, each woken once (``Batcher`` hands every request one of these).

Why not ``concurrent.futures.Future`` and ``loop.call_soon_threadsafe`` per result: with 64
clients the per-request Python cost of completing a request capped what the batcher
served (about 6,000 img/s on the H200 before), and a Future's Condition is most of it;
and an event loop woken once per result of a batch of 32 took 33 wake-ups and split the
batch's replies over frames. ``ThreadWaiter`` wakes its thread with one C-level lock
release; ``LoopPost`` hands a loop all of a batch's results in one wake-up
(``one_wake_up_per_loop``).

Only the standard library.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import InvalidStateError
from typing import Any

Feeds = dict[str, Any]

__all__ = ["LightFuture", "ThreadWaiter", "LoopPost", "AsyncWaiter", "one_wake_up_per_loop"]


class LightFuture:
    """The part of ``concurrent.futures.Future`` the batcher uses (``done``, ``running``,
    ``set_running_or_notify_cancel``, ``set_result``, ``set_exception``), for the
    waiters below, which differ only in how a result reaches the one waiting for it."""

    __slots__ = ("_done", "_running")

    def __init__(self) -> None:
        self._done = self._running = False

    def done(self) -> bool:
        return self._done

    def running(self) -> bool:
        return self._running and not self._done

    def cancelled(self) -> bool:
        return False

    def set_running_or_notify_cancel(self) -> bool:
        self._running = True
        return True

    def set_result(self, result: Feeds) -> None:
        self._settle(result, None)

    def set_exception(self, exc: BaseException) -> None:
        self._settle(None, exc)

    def _settle(self, result: Feeds | None, error: BaseException | None) -> None:
        if self._done:
            raise InvalidStateError("result already set")
        self._done = True
        self._deliver(result, error)

    def _deliver(self, result: Feeds | None, error: BaseException | None) -> None:
        raise NotImplementedError


class ThreadWaiter(LightFuture):
    """What ``Batcher.infer`` waits on: one lock, held until the result is set (why not a
    Future: the module docstring; a Future's Condition costs a lock per wait, a deque of
    waiters and a Python ``notify_all``). No cancellation: a blocking caller cannot cancel.
    """

    __slots__ = ("_lock", "_result", "_error")

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._lock.acquire()
        self._result: Feeds | None = None
        self._error: BaseException | None = None

    def _deliver(self, result: Feeds | None, error: BaseException | None) -> None:
        self._result, self._error = result, error
        self._lock.release()

    def result(self, timeout: float | None = None) -> Feeds:
        if not self._done:
            if not self._lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
                raise TimeoutError(f"no result within {timeout} s")
            self._lock.release()      # done: later calls return at once
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]


class LoopPost:
    """Results bound for one asyncio event loop, handed over in as few wake-ups as the
    loop allows: the first result posted schedules one ``call_soon_threadsafe`` flush,
    and results posted before the loop ran it ride along. While the completion thread
    delivers a batch (`one_wake_up_per_loop`), the flush is scheduled once, after the
    batch's last result: scheduling it wakes the loop through a socket write, which gives
    the GIL away, and a loop that took it then would flush one result per wake-up (seen:
    33 wake-ups for a batch of 32, and a batch's replies split over frames)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: list[tuple[asyncio.Future, Feeds | None, BaseException | None]] = []
        self._lock = threading.Lock()
        self._scheduled = False

    def post(self, fut: asyncio.Future, result: Feeds | None, error: BaseException | None
             ) -> None:
        with self._lock:
            self._items.append((fut, result, error))
            if self._scheduled:
                return
            held = getattr(_delivering, "posts", None)
            if held is not None:
                held.add(self)          # scheduled once the batch is delivered
                return
            self._scheduled = True
        self._wake()

    def kick(self) -> None:
        """Schedule the flush of what was posted, if nothing has yet."""
        with self._lock:
            if self._scheduled or not self._items:
                return
            self._scheduled = True
        self._wake()

    def _wake(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self._flush)
        except RuntimeError:            # the loop is closed: nobody awaits these any more
            with self._lock:
                self._items.clear()
                self._scheduled = False

    def _flush(self) -> None:
        with self._lock:
            items, self._items, self._scheduled = self._items, [], False
        for fut, result, error in items:
            if fut.done():              # the awaiting task was cancelled
                continue
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)


#: The loops' posts touched by the batch this thread is delivering (`one_wake_up_per_loop`).
_delivering = threading.local()


@contextlib.contextmanager
def one_wake_up_per_loop():
    """Deliver a batch, then wake each event loop that awaits its results once."""
    _delivering.posts = posts = set()
    try:
        yield
    finally:
        _delivering.posts = None
        for post in posts:
            post.kick()


class AsyncWaiter(LightFuture):
    """What ``Batcher.submit_async`` awaits: an asyncio future of the caller's loop, set
    through the loop's `LoopPost`. Cancelling the awaiting task cancels the request
    while it has not started."""

    __slots__ = ("fut", "_post")

    def __init__(self, fut: asyncio.Future, post: LoopPost) -> None:
        super().__init__()
        self.fut, self._post = fut, post

    def cancelled(self) -> bool:
        return self.fut.cancelled()     # a read of the future's state: safe off its loop

    def set_running_or_notify_cancel(self) -> bool:
        if self.fut.cancelled():        # a read of the future's state: safe off its loop
            self._done = True
            return False
        return super().set_running_or_notify_cancel()

    def _deliver(self, result: Feeds | None, error: BaseException | None) -> None:
        self._post.post(self.fut, result, error)
