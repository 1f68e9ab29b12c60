"""Simulated processes: each a greenlet in this one OS thread, switched only at command
boundaries (a request about to leave, a journal command about to run, a sleep).

A crash is the scheduler never switching back: the process does nothing more, not even
its ``finally`` blocks (it is kept referenced until the run is over, so that no garbage
collection throws ``GreenletExit`` into it), its journal connection is rolled back and
closed from the scheduler (one thread), and its owners are dead to everyone who asks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import greenlet

from payonce._journal._sqlite import SQLiteJournal

from ._edges import SimKeeper

__all__ = ["Process", "TornDown"]


class TornDown(BaseException):
    """Thrown into a crashed process once its run is over: it unwinds and ends."""


@attrs.define(eq=False)
class Process:
    name: str
    task: str
    """What it runs, in words: ``order-3 (block)``, ``resume platform``."""
    order: str | None
    rerun: bool
    """Code of an order an earlier process crashed in the middle of."""
    body: Callable[[Process], str]
    glet: greenlet.greenlet | None = None
    at: str = "starts"
    crashed: bool = False
    paused: bool = False
    """Stopped whole (a stop-the-world pause, SIGSTOP): its lease keeper renews nothing."""
    lease_seconds: float = 0.0
    done: bool = False
    outcome: str = ""
    journal: SQLiteJournal | None = None
    keeper: SimKeeper | None = None
    owners: set[str] = attrs.Factory(set)
    closers: list[Callable[[], Any]] = attrs.Factory(list)

    @property
    def runnable(self) -> bool:
        return not self.crashed and not self.done

    def crash(self) -> None:
        """SIGKILL: its open transaction (if any) rolled back and its locks released, as the
        database does for a dead connection; nothing of it runs again."""
        self.crashed = True
        if self.journal is not None:
            conn = self.journal._engine.conn  # type: ignore[attr-defined]
            try:
                conn.rollback()
            finally:
                conn.close()
        if self.keeper is not None:
            self.keeper.close()
