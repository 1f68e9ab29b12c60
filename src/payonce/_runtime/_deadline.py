"""Every exchange with the provider gets a total deadline.

httpx's timeouts bound each wait (to connect, to write, for each read), never the whole
exchange: a server or proxy that trickles its answer one byte per read timeout holds an
attempt, its lease and its caller for as long as it likes. The deadline cuts it and the
attempt ends like any timeout after sending: it may have executed, so it is retried under
the same key (or verified first).

The asynchronous client enforces it with ``asyncio.timeout`` around the whole exchange.
The synchronous one cannot interrupt a blocking read from its own thread, so it bounds
every wait by the deadline (a wait that runs out once the deadline has passed is the
deadline's cut, not the read timeout's) and checks it between chunks of the answer's body;
a status line and headers trickled byte by byte are bounded only by each read's timeout
and h11's limit on their size.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import attrs
import httpx

__all__ = ["AttemptDeadlineExceeded", "Deadline", "default_attempt_timeout"]

_PARTS = ("connect", "read", "write", "pool")


class AttemptDeadlineExceeded(httpx.ReadTimeout):
    """The exchange outlasted its total deadline; like any timeout after sending, the
    request may have executed."""


def default_attempt_timeout(timeouts: httpx.Timeout) -> float | None:
    """The longest a well-behaved exchange waits: for a connection, to connect, to send,
    and for the answer, each within its own timeout. None when no part is set."""
    parts = [timeouts.pool, timeouts.connect, timeouts.write, timeouts.read]
    given = [part for part in parts if part is not None]
    return sum(given) if given else None


@attrs.frozen
class Deadline:
    """One exchange's deadline, started when the exchange starts."""

    seconds: float | None
    ends: float = attrs.field(default=math.inf)

    @classmethod
    def start(cls, seconds: float | None) -> Deadline:
        ends = math.inf if seconds is None else time.monotonic() + seconds
        return cls(seconds, ends)

    def exceeded(self, request: httpx.Request) -> AttemptDeadlineExceeded:
        return AttemptDeadlineExceeded(
            f"the exchange outlasted its total deadline of {self.seconds:g} s (attempt_timeout)"
            ": the answer was cut, and the request may have executed",
            request=request,
        )

    def bound_waits(self, request: httpx.Request) -> None:
        """No single wait of this exchange may outlast the whole deadline."""
        if self.seconds is None:
            return
        waits = dict(request.extensions.get("timeout") or {})
        for part in _PARTS:
            given = waits.get(part)
            waits[part] = self.seconds if given is None else min(given, self.seconds)
        request.extensions["timeout"] = waits

    def cut(self, request: httpx.Request, timeout: httpx.ReadTimeout) -> httpx.ReadTimeout:
        """What a read that timed out is: the deadline's cut when the deadline has passed
        (``bound_waits`` shortened the wait to it: a provider that answers nothing for the
        whole deadline, however long the read timeout), else the read timeout itself."""
        if isinstance(timeout, AttemptDeadlineExceeded) or time.monotonic() < self.ends:
            return timeout
        return self.exceeded(request)

    def read(self, response: httpx.Response) -> None:
        """Read a streamed answer's body, cut as soon as the deadline has passed."""
        if self.seconds is not None:
            response.stream = _BoundedStream(response.stream, self, response.request)
        response.read()


class _BoundedStream(httpx.SyncByteStream):
    def __init__(self, inner: object, deadline: Deadline, request: httpx.Request) -> None:
        assert isinstance(inner, httpx.SyncByteStream)
        self._inner = inner
        self._deadline = deadline
        self._request = request

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            if time.monotonic() > self._deadline.ends:
                raise self._deadline.exceeded(self._request)
            yield chunk

    def close(self) -> None:
        self._inner.close()
