"""Lazy acknowledgements: a block's acknowledgement rides in the journal's next write.

Leaving ``with client.intent(...)`` normally acknowledges its outcome. Its own transaction
would cost a commit per intent for a mark that only decides what ``ack --list`` shows, so
the key waits here, in memory, and the journal's next write transaction (the next intent's
write-ahead, a settle, anything) applies every waiting key in one more statement: no
transaction and no fsync of its own.

Losing them is safe by construction. A crash before that write leaves the intents
unacknowledged, the conservative state: they are listed by ``ack --list`` and
``unacknowledged()`` as outcomes the caller may not have seen, which is what an
acknowledgement the block never reached would have left too.

What bounds how long a key waits: the next write; a read through the same engine (by any
object holding it), which applies them first (so it reads its own acknowledgements);
``close()``; a normal interpreter exit; and at the latest ``FLUSH_DELAY`` seconds later,
the flusher thread (one per process, for every journal, started on first use). Keys are
per process: a child of ``os.fork()`` starts with none and the parent still applies its
own.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from typing import Any, Protocol

from .._fork import ForkGuard
from .._lifecycle import IntentState

__all__ = [
    "FLUSH_DELAY",
    "Flushable",
    "PendingAcknowledgements",
    "acknowledgements",
    "flusher",
]

logger = logging.getLogger("payonce")

FLUSH_DELAY = 1.0
"""Seconds an acknowledgement waits for a write of its journal before the flusher writes
it: long enough that a busy worker's writes carry every one of them, short enough that
another process's ``ack --list`` soon stops listing an idle worker's."""

_CHUNK = 200
"""Keys per statement: two parameters each, well under SQLite's 999 of old builds."""

_SETTLED = (IntentState.SUCCEEDED.value, IntentState.FAILED.value)


def acknowledgements(acknowledged: dict[str, float]) -> list[tuple[str, tuple[Any, ...]]]:
    """The statements that acknowledge every key at its own time, one per ``_CHUNK`` keys.
    An intent acknowledged already keeps its first time; one that is not settled (never
    the case for a key a block queued) or no longer there is left alone."""
    keys = list(acknowledged)
    statements = []
    for start in range(0, len(keys), _CHUNK):
        chunk = keys[start : start + _CHUNK]
        whens = " ".join("WHEN ? THEN ?" for _ in chunk)
        marks = ", ".join("?" for _ in chunk)
        params: list[Any] = [value for key in chunk for value in (key, acknowledged[key])]
        statements.append(
            (
                f"UPDATE intents SET acknowledged_at = CASE key {whens} END"
                f" WHERE key IN ({marks}) AND acknowledged_at IS NULL AND state IN (?, ?)",
                (*params, *chunk, *_SETTLED),
            )
        )
    return statements


class PendingAcknowledgements:
    """One journal's acknowledgements not written yet: key → when the block acknowledged."""

    __slots__ = ("_fork", "_keys", "_lock")

    def __init__(self) -> None:
        self._fork = ForkGuard()
        self._lock = threading.Lock()
        self._keys: dict[str, float] = {}

    def _in_this_process(self) -> None:
        if self._fork.forked(self._lock):
            # The parent's keys are the parent's to write; its lock may have been held.
            self._lock = threading.Lock()
            self._keys = {}

    def add(self, key: str, at: float) -> None:
        self._in_this_process()
        with self._lock:
            self._keys.setdefault(key, at)

    def take(self) -> dict[str, float] | None:
        """Every waiting key, now the caller's to write (or to ``restore``)."""
        if not self._keys:  # the common case, read without the lock: a key added meanwhile
            return None  # is taken by the next write or the flusher
        self._in_this_process()
        with self._lock:
            taken, self._keys = self._keys, {}
        return taken or None

    def restore(self, taken: dict[str, float]) -> None:
        """Keys whose write did not commit wait again."""
        self._in_this_process()
        with self._lock:
            for key, at in taken.items():
                self._keys.setdefault(key, at)

    def __bool__(self) -> bool:
        self._in_this_process()
        return bool(self._keys)


class Flushable(Protocol):
    def flush_acknowledgements(self) -> None: ...


class _Flusher:
    """One daemon thread per process that writes the acknowledgements of journals no write
    has carried within ``FLUSH_DELAY``. It holds journals weakly: a journal dropped without
    ``close()`` is not kept alive by it."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._wake = threading.Condition(threading.Lock())
        self._due: weakref.WeakKeyDictionary[Flushable, float] = weakref.WeakKeyDictionary()
        self._thread: threading.Thread | None = None

    def schedule(self, journal: Flushable) -> None:
        with self._wake:
            if journal in self._due:
                return  # due sooner already; its flush writes this key too
            self._due[journal] = time.monotonic() + FLUSH_DELAY
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="payonce-acknowledgements", daemon=True
                )
                self._thread.start()
            else:
                self._wake.notify()  # at most once a FLUSH_DELAY per journal

    def _ready(self) -> list[Flushable]:
        with self._wake:
            while True:
                now = time.monotonic()
                first = min(self._due.values(), default=None)
                if first is not None and first <= now:
                    ready = [journal for journal, at in self._due.items() if at <= now]
                    for journal in ready:
                        del self._due[journal]
                    return ready
                self._wake.wait(None if first is None else first - now)

    def _run(self) -> None:
        while True:
            for journal in self._ready():
                journal.flush_acknowledgements()

    def flush_all(self) -> None:
        """At interpreter exit: write what waits, while the journals are still open."""
        with self._wake:
            journals = list(self._due.keys())
            self._due.clear()
        for journal in journals:
            journal.flush_acknowledgements()


flusher = _Flusher()
os.register_at_fork(after_in_child=flusher._reset)  # the parent's thread is not the child's
atexit.register(flusher.flush_all)
