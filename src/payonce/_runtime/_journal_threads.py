"""Journal calls of asyncio code, run on payonce's own journal threads.

The event loop never blocks on SQLite or an fsync, so every journal call of
``AsyncClient`` and the webhook inbox runs in a thread. ``asyncio.to_thread`` costs about
twice what a journal hand-off needs (an executor, a ``concurrent.futures`` future wrapped
in an asyncio one: some 45 µs of CPU per call here, against 20 µs for a queue and one
``call_soon_threadsafe``), so payonce keeps threads of its own, fed by one queue: one
round trip between the loop and a thread per journal call.

The threads are few and made on demand: a job that finds no thread free to take it starts one,
up to ``MAX_THREADS``, so concurrent intents still meet in one SQLite group commit (a single
thread would serialise them) without a crowd of threads fighting for the GIL. A
thread idle for ``IDLE_SECONDS`` ends. After a fork the child starts with none.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import os
import queue
import threading
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

__all__ = ["IDLE_SECONDS", "MAX_THREADS", "JournalThreads", "calls_made", "off_loop"]

P = ParamSpec("P")
T = TypeVar("T")

MAX_THREADS = min(8, (os.cpu_count() or 1) + 2)
"""At most this many journal calls run at once. Few on purpose: SQLite writes one
transaction at a time anyway, and more threads only fight for the GIL and the journal's
lock. Measured at 64 concurrent intents on 2 CPUs (bench/RESULTS.md): 4 threads paid 361/s
with group commit and 407/s inline, 16 threads 221/s and 298/s."""

IDLE_SECONDS = 10.0

_Job = tuple[
    asyncio.AbstractEventLoop, "asyncio.Future[Any]", contextvars.Context, Callable[[], Any]
]


def _answer(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():  # its caller went away; the call itself still ran to its end
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class JournalThreads:
    """The threads that run journal calls for the event loops of one process."""

    def __init__(self, max_threads: int = MAX_THREADS, idle_seconds: float = IDLE_SECONDS) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._waiting = 0
        """Calls queued and not yet taken, counted with ``_idle`` under the lock: the
        queue's own size moves outside it."""
        self._max = max_threads
        self._idle_seconds = idle_seconds
        self.calls = 0
        """Calls handed to a journal thread so far (what an async journal edge spares)."""

    @property
    def threads(self) -> int:
        return self._threads

    async def run(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``function(*args, **kwargs)`` in a journal thread, in a copy of this context
        (as ``asyncio.to_thread``: log records made there see the caller's contextvars)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        call = functools.partial(function, *args, **kwargs)
        with self._lock:
            # More calls waiting than threads free to take them: one more thread. Started
            # before the call is queued: a thread the system refuses ("can't start new
            # thread") must leave no call queued that nobody awaits, nor count as one.
            if self._waiting + 1 > self._idle and self._threads < self._max:
                thread = threading.Thread(target=self._serve, name="payonce-journal", daemon=True)
                try:
                    thread.start()
                except RuntimeError:
                    if self._threads == 0:
                        raise  # no thread would ever take the call: it is not made
                else:  # it waits for this lock before it counts itself busy
                    self._threads += 1
                    self._idle += 1
            self._jobs.put((loop, future, contextvars.copy_context(), call))
            self._waiting += 1
            self.calls += 1
        return await future

    def _serve(self) -> None:
        while True:
            try:
                loop, future, context, call = self._jobs.get(timeout=self._idle_seconds)
            except queue.Empty:
                with self._lock:
                    # A job queued before this check is served by this thread; one queued
                    # after it finds one idle thread fewer and starts another.
                    if self._waiting == 0:
                        self._threads -= 1
                        self._idle -= 1
                        return
                continue
            with self._lock:
                self._idle -= 1
                self._waiting -= 1
            try:
                result, error = context.run(call), None
            except BaseException as exc:  # handed to the caller, whatever it is
                result, error = None, exc
            # A loop closed meanwhile raises RuntimeError: nobody waits for the answer any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_answer, future, result, error)
            del loop, future, context, call, result, error
            with self._lock:
                self._idle += 1


_shared: tuple[int, JournalThreads] | None = None


def off_loop(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, T]:
    """Await ``function(*args, **kwargs)`` run in a journal thread of this process."""
    global _shared
    if _shared is None or _shared[0] != os.getpid():
        _shared = (os.getpid(), JournalThreads())
    return _shared[1].run(function, *args, **kwargs)


def calls_made() -> int:
    """How many calls this process has handed to its journal threads so far."""
    if _shared is None or _shared[0] != os.getpid():
        return 0
    return _shared[1].calls
