"""The wire between one simulated process and the provider, and what it does wrong.

Each request first reaches a command boundary (the scheduler may run another process, or
crash this one, before it leaves), then draws its fate: delivered; lost before the
provider saw it; executed and its answer lost; executed and the answer delayed past the
caller's timeout (the provider still busy with it, answering 409 to a repeat); a 503 before
or after executing; a 429; a proxy's 2xx HTML page after executing.
"""

from __future__ import annotations

from typing import Protocol

import httpx

from ._provider import ProviderModel

__all__ = ["FAULTS", "Network"]

FAULTS = (
    "delivered",
    "lost before the provider",
    "executed, answer lost",
    "executed, answer delayed past the timeout",
    "503 before executing",
    "503 after executing",
    "429",
    "executed, a proxy's 2xx HTML page",
    "401: the credential refused for a moment (a key being rotated)",
    "a proxy's 403 HTML page, before the provider",
)
_READ_FAULTS = frozenset({1, 4, 6, 7, 8})
"""The faults a look-up (a GET) can meet: it executes nothing."""


class Host(Protocol):
    """What a process's wire asks of the world around it."""

    faults: bool

    def boundary(self, what: str) -> None: ...

    def pick(self, weights: list[float]) -> int: ...

    def tell(self, line: str) -> None: ...

    def waited(self, seconds: float) -> None: ...


class Network(httpx.BaseTransport):
    """One process's transport to the provider."""

    def __init__(
        self, host: Host, provider: ProviderModel, timeout: float, sender: tuple[str, bool]
    ) -> None:
        self._host = host
        self._sender = sender
        self._provider = provider
        self._timeout = timeout

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        host = self._host
        named = f"{request.method} {request.url.path}"
        if request.method == "GET":
            named += f"?{request.url.query.decode()}"
        host.boundary(f"sends {named}")
        fault = 0
        if host.faults:
            mutating = request.method == "POST"
            weights = [40.0] + [
                1.0 if mutating or n in _READ_FAULTS else 0.0 for n in range(1, len(FAULTS))
            ]
            if request.method == "HEAD":
                weights = [40.0, 1.0] + [0.0] * (len(FAULTS) - 2)
            fault = host.pick(weights)
        provider = self._provider
        provider.sender = self._sender
        if fault == 1:
            host.tell(f"{named}: {FAULTS[1]}")
            raise httpx.ConnectError("simulated: connection refused", request=request)
        if fault == 8:
            host.tell(f"{named}: {FAULTS[8]}")
            return httpx.Response(401, json={"error": {"type": "authentication_error"}})
        if fault == 9:
            host.tell(f"{named}: {FAULTS[9]}")
            return httpx.Response(
                403, headers={"content-type": "text/html"}, text="<html>no</html>"
            )
        if fault in (4, 6):
            host.tell(f"{named}: {FAULTS[fault]}")
            status = 503 if fault == 4 else 429
            extra = {"retry-after": "1"} if fault == 6 else {}
            return httpx.Response(status, headers=extra, json={"error": {"type": "api_error"}})
        if fault == 3:
            response = provider.handle(request, busy_for=self._timeout + 15.0)
            host.tell(f"{named}: answered {response.status_code}, {FAULTS[3]}")
            host.waited(self._timeout)
            raise httpx.ReadTimeout("simulated: read timed out", request=request)
        response = provider.handle(request)
        if fault == 0:
            host.tell(f"{named}: answered {response.status_code}{_replayed(response)}")
            return response
        host.tell(f"{named}: answered {response.status_code}, {FAULTS[fault]}")
        if fault == 2:
            raise httpx.ReadError("simulated: connection reset", request=request)
        if fault == 5:
            return httpx.Response(503, json={"error": {"type": "api_error"}})
        return httpx.Response(200, headers={"content-type": "text/html"}, text="<html>ok</html>")


def _replayed(response: httpx.Response) -> str:
    return " (replayed)" if response.headers.get("idempotent-replayed") else ""
