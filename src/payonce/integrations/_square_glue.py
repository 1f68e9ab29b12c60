"""httpx clients for Square's SDK over a payonce client's transport."""

from __future__ import annotations

import re
from typing import Any, NoReturn

import httpx
from square.core.api_error import ApiError

from ..errors import ConfigurationError, PayonceError
from ._sdk_errors import about, carry
from ._transports import (
    OutsideIntent,
    TransportSource,
    async_transport,
    sync_transport,
    transport_options,
)

__all__ = ["async_httpx_client", "httpx_client"]


def _code(exc: PayonceError) -> str:
    # OutcomeUnknown -> PAYONCE_OUTCOME_UNKNOWN
    return "PAYONCE_" + re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).upper()


def _raise_square_error(exc: PayonceError) -> NoReturn:
    detail = {"category": "API_ERROR", "code": _code(exc), "detail": f"{exc}{about(exc)}"}
    error = ApiError(status_code=None, body={"errors": [detail]})
    carry(error, exc)
    raise error from exc


class _Translating(httpx.BaseTransport):
    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return self.inner.handle_request(request)
        except ConfigurationError:
            raise  # a programming error, not a network one: never presented as retryable
        except PayonceError as exc:
            _raise_square_error(exc)

    def close(self) -> None:
        self.inner.close()


class _AsyncTranslating(httpx.AsyncBaseTransport):
    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self.inner.handle_async_request(request)
        except ConfigurationError:
            raise  # a programming error, not a network one: never presented as retryable
        except PayonceError as exc:
            _raise_square_error(exc)

    async def aclose(self) -> None:
        await self.inner.aclose()


def httpx_client(
    client: TransportSource,
    *,
    sdk_keys: str | None = None,
    outside_intent: OutsideIntent | None = None,
    **options: Any,
) -> httpx.Client:
    """An ``httpx.Client`` for ``Square(httpx_client=...)`` that sends through
    ``client.transport()``; ``options`` go to ``httpx.Client`` (``timeout=``...).

    The key a caller puts in the body is kept unless ``sdk_keys="replace"``: pass it when
    your code makes a ``uuid4()`` per call (Square's examples do), which a process run
    again would not make the same; keep the default if you use your keys afterwards
    (``payments.cancel_by_idempotency_key``). ``outside_intent="refuse"`` refuses a call
    outside any intent block instead of journaling it as a one-shot intent."""
    options.setdefault("timeout", 60.0)  # Square's own default
    chosen = transport_options(sdk_keys=sdk_keys, outside_intent=outside_intent)
    return httpx.Client(transport=_Translating(sync_transport(client, **chosen)), **options)


def async_httpx_client(
    client: TransportSource,
    *,
    sdk_keys: str | None = None,
    outside_intent: OutsideIntent | None = None,
    **options: Any,
) -> httpx.AsyncClient:
    """The same for ``AsyncSquare(httpx_client=...)`` over an ``AsyncClient``."""
    options.setdefault("timeout", 60.0)
    chosen = transport_options(sdk_keys=sdk_keys, outside_intent=outside_intent)
    transport = async_transport(client, **chosen)
    return httpx.AsyncClient(transport=_AsyncTranslating(transport), **options)
