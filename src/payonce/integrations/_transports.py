"""What every integration needs of a payonce client: ``client.transport()``."""

from __future__ import annotations

from typing import Any, Literal, Protocol

import httpx

from ..errors import ConfigurationError, IntentError, PayonceError

__all__ = ["TransportSource", "about", "async_transport", "sync_transport"]


class TransportSource(Protocol):
    """A payonce ``Client`` (or ``AsyncClient``): anything whose ``transport()`` gives an
    httpx transport that sends through it, with ``Client.transport``'s options (spelled
    here, not imported: the integrations never reach into the runtime)."""

    def transport(
        self,
        *,
        sdk_keys: Literal["honour", "replace"] = ...,
        outside_intent: Literal["journal", "refuse"] = ...,
    ) -> httpx.BaseTransport | httpx.AsyncBaseTransport: ...


def sync_transport(client: TransportSource, **options: Any) -> httpx.BaseTransport:
    transport = client.transport(**options)
    if not isinstance(transport, httpx.BaseTransport):
        raise ConfigurationError(
            f"{type(client).__name__}.transport() gave {type(transport).__name__}, not a "
            "synchronous httpx transport: pass a payonce.Client here (an AsyncClient's "
            "transport serves async SDK calls only)"
        )
    return transport


def async_transport(client: TransportSource, **options: Any) -> httpx.AsyncBaseTransport:
    transport = client.transport(**options)
    if not isinstance(transport, httpx.AsyncBaseTransport):
        raise ConfigurationError(
            f"{type(client).__name__}.transport() gave {type(transport).__name__}, not an "
            "async httpx transport: pass a payonce.AsyncClient for async SDK calls"
        )
    return transport


def about(exc: PayonceError) -> str:
    """What an SDK's error adds to payonce's message: the key and the reference, for the
    caller to resume or reconcile with. A step of a block has no reference of its own (its
    key, ``KEY-stepN``, names its intent's)."""
    if not isinstance(exc, IntentError):
        return ""
    if exc.reference is None:
        return f" (idempotency key {exc.key!r})"
    return f" (idempotency key {exc.key!r}, reference {exc.reference!r})"
