"""The journal threads of asyncio code: answers, errors and context come back to the loop,
concurrent calls run at once (up to the cap), idle threads end, a forked child has its own.
"""

from __future__ import annotations

import asyncio
import contextvars
import multiprocessing
import threading
import time

import pytest

from payonce._runtime._journal_threads import JournalThreads, off_loop

pytestmark = pytest.mark.anyio

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _wait_until(condition: object, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


async def test_a_call_returns_its_answer_raises_its_error_and_sees_the_callers_context() -> None:
    threads = JournalThreads()
    REQUEST_ID.set("req-7")

    assert await threads.run(lambda a, b: a + b, 2, b=3) == 5
    assert await threads.run(REQUEST_ID.get) == "req-7"
    assert await threads.run(threading.current_thread) is not threading.current_thread()
    with pytest.raises(KeyError, match="missing"):
        await threads.run({}.__getitem__, "missing")


async def test_concurrent_calls_run_at_once_so_group_commit_can_batch_them() -> None:
    threads = JournalThreads(max_threads=8)
    together = threading.Barrier(8, timeout=10)

    # Each call waits for the other seven: run one after another, they would time out.
    await asyncio.gather(*(threads.run(together.wait) for _ in range(8)))

    assert threads.threads == 8


async def test_no_more_threads_than_the_cap_and_every_call_is_still_served() -> None:
    threads = JournalThreads(max_threads=2)
    running: list[int] = []
    peak = 0
    lock = threading.Lock()

    def work(n: int) -> int:
        nonlocal peak
        with lock:
            running.append(n)
            peak = max(peak, len(running))
        time.sleep(0.01)
        with lock:
            running.remove(n)
        return n

    assert await asyncio.gather(*(threads.run(work, n) for n in range(10))) == list(range(10))
    assert peak <= 2
    assert threads.threads <= 2


async def test_a_thread_the_system_refuses_leaves_no_call_behind_and_no_thread_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ "can't start new thread": the call is not made (nobody would ever take it, and
    it must not run later with no one awaiting it), and the next call starts a thread."""
    threads = JournalThreads(max_threads=1)
    ran: list[str] = []
    start = threading.Thread.start

    def refused(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refused)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        await threads.run(ran.append, "refused call")
    assert threads.threads == 0
    monkeypatch.setattr(threading.Thread, "start", start)

    assert await threads.run(lambda: "served") == "served"
    await threads.run(time.sleep, 0.05)  # anything queued before would have run by now
    assert ran == [], "the refused call never ran"


async def test_idle_threads_end_and_new_calls_start_one_again() -> None:
    threads = JournalThreads(idle_seconds=0.05)
    await asyncio.gather(*(threads.run(time.sleep, 0.01) for _ in range(3)))
    assert threads.threads >= 1

    assert _wait_until(lambda: threads.threads == 0), "idle threads ended"
    assert await threads.run(lambda: "served") == "served"


async def test_a_caller_that_goes_away_leaves_the_call_to_finish_quietly() -> None:
    threads = JournalThreads()
    finished = threading.Event()
    started = threading.Event()

    def slow() -> None:
        started.set()
        time.sleep(0.05)
        finished.set()

    call = asyncio.ensure_future(threads.run(slow))
    await asyncio.to_thread(started.wait, 5)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call

    assert await asyncio.to_thread(finished.wait, 5), "the journal call ran to its end"
    assert await threads.run(lambda: 1) == 1, "the thread went on serving"


def _child_uses_its_own_threads() -> None:
    assert asyncio.run(off_loop(lambda: "child")) == "child"


async def test_a_forked_child_gets_journal_threads_of_its_own() -> None:
    assert await off_loop(lambda: "parent") == "parent"  # the parent's threads exist
    child = multiprocessing.get_context("fork").Process(target=_child_uses_its_own_threads)
    child.start()
    child.join(30)
    if child.is_alive():
        child.kill()
        pytest.fail("the child waited for threads that only exist in its parent")
    assert child.exitcode == 0
