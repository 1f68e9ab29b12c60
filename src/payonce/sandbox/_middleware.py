"""What wraps every answer: its ``Date`` by the sandbox's own clock, a request id, a
provider's retry hint, and a count of the API requests in flight (so that a reset can wait
for none to be)."""

from __future__ import annotations

import email.utils
import secrets
import threading
from collections.abc import Callable, Mapping

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send


def _is_api(scope: Scope) -> bool:
    # The provider's API, as opposed to the control endpoints under /_sandbox/.
    path: str = scope.get("path", "")
    return scope["type"] == "http" and path.startswith("/v1/")


class DateMiddleware:
    """Dates every answer by the sandbox's clock (``advance_clock`` included), as a provider
    dates its answers by the clock it forgets keys by: a client that judges a key's age by
    the provider's clock reads it here. uvicorn's own ``Date`` (the host's clock) is off."""

    def __init__(self, app: ASGIApp, clock: Callable[[], float]) -> None:
        self.app = app
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_dated(message: Message) -> None:
            if message["type"] == "http.response.start":
                date = email.utils.formatdate(self.clock(), usegmt=True)
                MutableHeaders(scope=message)["Date"] = date
            await send(message)

        await self.app(scope, receive, send_dated)


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = "req_" + secrets.token_hex(12)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)["Request-Id"] = request_id
            await send(message)

        await self.app(scope, receive, send_with_id)


class Activity:
    """Counts the API requests being handled, so a reset can wait until none is."""

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self._in_flight = 0

    def enter(self) -> None:
        with self._idle:
            self._in_flight += 1

    def leave(self) -> None:
        with self._idle:
            self._in_flight -= 1
            self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout)


class ActivityMiddleware:
    def __init__(self, app: ASGIApp, activity: Activity) -> None:
        self.app = app
        self.activity = activity

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Only the provider's API: a control request (a reset among them) is not waited for.
        if not _is_api(scope):
            await self.app(scope, receive, send)
            return
        self.activity.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.activity.leave()


class RetryHintMiddleware:
    """Adds a provider's "should the client retry?" header to API answers, by status."""

    def __init__(self, app: ASGIApp, header: str | None, hints: Mapping[int, bool]) -> None:
        self.app = app
        self.header = header
        self.hints = dict(hints)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        header = self.header
        if header is None or not _is_api(scope):
            await self.app(scope, receive, send)
            return

        async def send_with_hint(message: Message) -> None:
            if message["type"] == "http.response.start":
                hint = self.hints.get(message["status"])
                if hint is not None:
                    MutableHeaders(scope=message)[header] = "true" if hint else "false"
            await send(message)

        await self.app(scope, receive, send_with_hint)
