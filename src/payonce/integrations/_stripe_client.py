"""The stripe-python HTTP client over a payonce client's transport."""

from __future__ import annotations

from collections.abc import AsyncIterable, Mapping
from typing import Any, NoReturn

import httpx
import stripe
from stripe import _api_requestor

from ..errors import (
    ConfigurationError,
    CredentialMismatch,
    IntentMismatch,
    OutcomeUnknown,
    PayonceError,
)
from ._sdk_errors import about, carry
from ._transports import DrawnKeys, OutsideIntent, TransportSource, async_transport, sync_transport

__all__ = ["HTTPClient"]

Answer = tuple[bytes, int, Mapping[str, str]]
DEFAULT_TIMEOUT = 80.0  # stripe-python's own default


# stripe-python draws its keys with ``_api_requestor._generate_idempotency_key`` (16 random
# bytes per call) unless the caller passes ``idempotency_key``.
_DRAWN = DrawnKeys(
    _api_requestor,
    "_generate_idempotency_key",
    sdk="stripe-python",
    supported="stripe>=16 (pip install 'payonce[stripe]' 'stripe>=16')",
)


class HTTPClient(stripe.HTTPClient):
    """A ``stripe.HTTPClient`` that sends through ``client.transport()``.

    ``client`` is a ``payonce.Client`` (sync calls: ``request``) or ``payonce.AsyncClient``
    (``request_async``); give the other kind as ``async_client``/``client`` to serve both.
    Inside ``with client.intent(...)`` each POST is a step under payonce's key, unless the
    caller gave stripe-python a key of its own (``options={"idempotency_key": ...}``): that
    one is the step's key. The keys stripe-python draws itself are replaced.

    ``outside_intent``: a POST outside any intent block of the payonce client it goes
    through is journaled as a one-shot intent (``"journal"``, the default) or refused
    (``"refuse"``, nothing sent), as ``client.transport(outside_intent=...)`` says. Either
    way, one made while another payonce client's block is open is refused: open the block
    on the client that carries the call (the ``async_client`` for ``…_async`` methods).
    Every such one-shot is journaled as drawn per call, under stripe-python's own key
    (taken out: payonce draws one for that call) or the caller's ``idempotency_key`` alike,
    for payonce cannot tell a key the code names again from a uuid4: retried and verified by
    that call (code run again under the same key continues it), never resent by a resume or
    a worker, since the code run again may have paid under another key. One sent from a
    thread pool inside a block (which does not inherit it) is warned of as it is sent.
    """

    name = "payonce"

    def __init__(
        self,
        client: TransportSource | None = None,
        *,
        async_client: TransportSource | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        outside_intent: OutsideIntent = "journal",
    ) -> None:
        super().__init__()
        self._sync: httpx.Client | None = None
        self._async: httpx.AsyncClient | None = None
        if client is not None:
            transport = client.transport(outside_intent=outside_intent)
            if isinstance(transport, httpx.AsyncBaseTransport) and async_client is None:
                self._async = httpx.AsyncClient(transport=transport, timeout=timeout)
            else:
                if isinstance(transport, httpx.AsyncBaseTransport):
                    transport = sync_transport(client, outside_intent=outside_intent)
                self._sync = httpx.Client(transport=transport, timeout=timeout)
        if async_client is not None:
            transport_async = async_transport(async_client, outside_intent=outside_intent)
            self._async = httpx.AsyncClient(transport=transport_async, timeout=timeout)
        if self._sync is None and self._async is None:
            raise TypeError("HTTPClient needs a payonce client: HTTPClient(client)")

    def _should_retry(
        self,
        response: Any,
        api_connection_error: Any,
        num_retries: int,
        max_network_retries: int | None,
    ) -> bool:
        # payonce retried already, under the step's key; an SDK retry would be a new step.
        return False

    # -- sync ------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None,
        post_data: Any = None,
        *,
        _usage: list[str] | None = None,
    ) -> tuple[Any, int, Mapping[str, str]]:
        if self._sync is None:
            # A wiring mistake: payonce's own error, never a network error one might retry.
            raise ConfigurationError(
                "this payonce HTTPClient was built over an AsyncClient: use the async "
                "methods (…_async), or pass a payonce.Client too; nothing was sent"
            )
        try:
            response = self._sync.request(
                method, url, headers=_DRAWN.without_drawn(headers), content=post_data
            )
        except ConfigurationError:
            raise  # a programming error, not a network one: never presented as retryable
        except (PayonceError, httpx.TransportError) as exc:
            _raise_stripe_error(exc)
        return response.content, response.status_code, response.headers

    def request_stream(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None,
        post_data: Any = None,
        *,
        _usage: list[str] | None = None,
    ) -> tuple[Any, int, Mapping[str, str]]:
        content, status, answer_headers = self.request(method, url, headers, post_data)
        return [content], status, answer_headers

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()

    # -- async -----------------------------------------------------------------------------

    async def request_async(
        self, method: str, url: str, headers: Mapping[str, str], post_data: Any = None
    ) -> Answer:
        if self._async is None:
            raise ConfigurationError(
                "this payonce HTTPClient was built over a Client: pass a payonce.AsyncClient "
                "as async_client= for async calls; nothing was sent"
            )
        try:
            response = await self._async.request(
                method, url, headers=_DRAWN.without_drawn(headers), content=post_data
            )
        except ConfigurationError:
            raise  # a programming error, not a network one: never presented as retryable
        except (PayonceError, httpx.TransportError) as exc:
            _raise_stripe_error(exc)
        return response.content, response.status_code, response.headers

    async def request_stream_async(
        self, method: str, url: str, headers: Mapping[str, str], post_data: Any = None
    ) -> tuple[AsyncIterable[bytes], int, Mapping[str, str]]:
        content, status, answer_headers = await self.request_async(method, url, headers, post_data)

        async def chunks() -> Any:
            yield content

        return chunks(), status, answer_headers

    async def close_async(self) -> None:
        if self._async is not None:
            await self._async.aclose()


def _raise_stripe_error(exc: Exception) -> NoReturn:
    """The stripe error a stripe-python caller expects for what payonce or the network said."""
    error: stripe.StripeError
    if isinstance(exc, httpx.TransportError):
        error = _connection_error(
            f"Unexpected error communicating with Stripe: {type(exc).__name__}: {exc}"
        )
    elif isinstance(exc, OutcomeUnknown):
        error = _connection_error(
            f"payonce could not learn whether Stripe executed this request{about(exc)}: "
            f"{_sentence(str(exc))} Do not retry it under a new key: resume or reconcile the "
            "intent."
        )
    elif isinstance(exc, IntentMismatch | CredentialMismatch):  # nothing sent: a caller bug
        error = stripe.IdempotencyError(f"{exc}{about(exc)}")
    else:
        assert isinstance(exc, PayonceError)
        error = _connection_error(f"payonce: {exc}{about(exc)}")
    # The payonce error itself, its key, reference and step, for callers that want them.
    carry(error, exc)
    raise error from exc


def _sentence(text: str) -> str:
    """``text`` ending as a sentence, so that the advice after it reads as another."""
    return text if text.endswith((".", "!", "?")) else f"{text}."


def _connection_error(message: str) -> stripe.StripeError:
    # should_retry=False: stripe-python must not send the request again on its own.
    return stripe.APIConnectionError(message, should_retry=False)  # type: ignore[no-untyped-call]
