"""httpx transports the async benchmark compares: each keeps the httpx API for the caller.

Bounded   at most ``limit`` requests in the pool at once, the rest wait on a semaphore
          (the pool's own queue is what grows with the square of its length:
          encode/httpx#3215); connections kept alive up to the same limit
Spread    requests handed round-robin to several pools, each with its own limits
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence

import httpx

__all__ = ["Bounded", "Spread", "pool"]


def pool(connections: int) -> httpx.AsyncHTTPTransport:
    """An httpx transport keeping alive as many connections as it may open."""
    return httpx.AsyncHTTPTransport(
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    )


class _Releasing(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, release: asyncio.Semaphore) -> None:
        self._inner = inner
        self._release: asyncio.Semaphore | None = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            if self._release is not None:
                self._release.release()
                self._release = None


class Bounded(httpx.AsyncBaseTransport):
    """At most ``limit`` requests in flight through ``inner`` (until the body is read)."""

    def __init__(self, limit: int, inner: httpx.AsyncBaseTransport | None = None) -> None:
        self._inner = inner if inner is not None else pool(limit)
        self._slots = asyncio.Semaphore(limit)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await self._slots.acquire()
        try:
            response = await self._inner.handle_async_request(request)
        except BaseException:
            self._slots.release()
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _Releasing(response.stream, self._slots)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class Spread(httpx.AsyncBaseTransport):
    """Requests spread round-robin over several transports (several pools)."""

    def __init__(self, transports: Sequence[httpx.AsyncBaseTransport]) -> None:
        self._transports = list(transports)
        self._next = itertools.cycle(self._transports)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await next(self._next).handle_async_request(request)

    async def aclose(self) -> None:
        for transport in self._transports:
            await transport.aclose()
