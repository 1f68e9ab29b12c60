"""Named crash points, for proving exactly-once by really killing the process.

``PAYONCE_CRASH_AT="after_send:3"`` makes the process SIGKILL itself on the 3rd visit of
the ``after_send`` point. It is read once, here; unset (always, in production) every
point is a no-op. A per-visit probability would stall long runs, so the harness picks the
visit instead.

Points, in the order one intent passes them:

- ``after_write_ahead``: the intent and its first attempt are durable; nothing sent yet.
- ``after_send``: the request's last byte has been written; the answer has not arrived.
- ``after_response``: the answer arrived; nothing of it is journaled yet.
- ``during_settle``: inside the settle transaction, before its commit.
- ``after_block``: the intent's block has ended normally; the block's acknowledgement
  waits in memory for the journal's next write.

And one the caller's own code reaches, not among ``CRASH_POINTS`` (a drive never passes it):

- ``before_acknowledge``: ``acknowledge(key)`` was called (the caller has recorded the
  outcome on its side); nothing of the acknowledgement is journaled yet.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

__all__ = ["CRASH_POINTS", "crash_armed", "crash_atrace", "crash_point", "crash_trace"]

CRASH_POINTS = (
    "after_write_ahead",
    "after_send",
    "after_response",
    "during_settle",
    "after_block",
)

_spec = os.environ.get("PAYONCE_CRASH_AT", "").strip()
_target, _, _visit = _spec.partition(":")
_nth = int(_visit) if _visit.isdigit() else 1
_visits = 0
_lock = threading.Lock()


def crash_armed() -> bool:
    return bool(_target)


def crash_point(name: str) -> None:
    global _visits
    if name != _target:
        return
    with _lock:
        _visits += 1
        if _visits >= _nth:
            os.kill(os.getpid(), signal.SIGKILL)


def crash_trace(event: str, info: dict[str, Any]) -> None:
    """An httpcore trace hook: the moment the request body is fully written is after_send."""
    if event.endswith("send_request_body.complete"):
        crash_point("after_send")


async def crash_atrace(event: str, info: dict[str, Any]) -> None:
    """The same hook for httpx.AsyncClient, whose trace callbacks must be awaitable."""
    crash_trace(event, info)
