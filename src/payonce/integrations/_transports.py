"""What every integration needs of a payonce client: ``client.transport()``."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

import httpx

from ..errors import ConfigurationError

__all__ = [
    "DrawnKeys",
    "OutsideIntent",
    "TransportSource",
    "async_transport",
    "sync_transport",
    "transport_options",
]

OutsideIntent = Literal["journal", "refuse"]
"""``client.transport(outside_intent=...)``: a mutating request outside any intent block is
journaled as a one-shot intent, or refused."""


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


def transport_options(
    *, sdk_keys: str | None = None, outside_intent: OutsideIntent | None = None
) -> dict[str, Any]:
    """What an integration's caller chose of ``client.transport()``'s options (the rest is
    the transport's default)."""
    chosen = {"sdk_keys": sdk_keys, "outside_intent": outside_intent}
    return {name: value for name, value in chosen.items() if value is not None}


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


class DrawnKeys:
    """The idempotency keys an SDK drew itself (a fresh one per call when the caller gives
    none): disposable, so payonce puts the step's key in their place. A key the caller
    chose is never one of them and is kept: replacing it could pay twice where the SDK
    alone would not (the same key under two references, or an order begun before payonce
    under a key of its own).

    On the wire both look alike, so the SDK's key-drawing function (``owner.attribute``,
    looked up at each call) is wrapped to remember what it drew. The newest ``KEPT`` are
    remembered: a drawn key is sent within its own call.
    """

    KEPT = 100_000

    def __init__(
        self, owner: Any, attribute: str, *, sdk: str, supported: str, static: bool = False
    ) -> None:
        self._keys: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._lock = threading.Lock()
        draw: Callable[[], str] | None = getattr(owner, attribute, None)
        if draw is None:
            raise ImportError(
                f"payonce cannot tell {sdk}'s own idempotency keys from its callers' in this "
                f"version of {sdk} (no {attribute}): install a version payonce supports, "
                f"{supported}"
            )

        def drawn_by_the_sdk() -> str:
            key = draw()
            with self._lock:
                self._keys[key] = None
                if len(self._keys) > self.KEPT:
                    self._keys.popitem(last=False)
            return key

        setattr(owner, attribute, staticmethod(drawn_by_the_sdk) if static else drawn_by_the_sdk)

    def drawn(self, key: str) -> bool:
        """Whether the SDK drew ``key`` (forgotten once asked: it is sent once)."""
        with self._lock:
            return self._keys.pop(key, 0) is None

    def without_drawn(self, headers: Mapping[str, str] | None) -> dict[str, str]:
        """``headers`` without a key the SDK drew (a caller's own key stays)."""
        kept = dict(headers or {})
        for name in [name for name in kept if name.lower() == "idempotency-key"]:
            if self.drawn(kept[name]):
                del kept[name]
        return kept
