"""An Adyen ``http_client`` over a payonce client's transport."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, NoReturn

import httpx
from Adyen import exceptions as adyen_errors

from ..errors import (
    ConfigurationError,
    CredentialMismatch,
    IntentError,
    IntentMismatch,
    PayonceError,
)
from ._sdk_errors import about, carry
from ._transports import OutsideIntent, TransportSource, sync_transport, transport_options

__all__ = ["TransportHTTPClient", "use_transport"]

DEFAULT_TIMEOUT = 60.0


class TransportHTTPClient:
    """What Adyen's ``AdyenClient`` calls as ``http_client.request(...)``, sent over httpx."""

    def __init__(
        self, transport: httpx.BaseTransport, *, user_agent: str, timeout: float | None = None
    ) -> None:
        self.user_agent = user_agent
        self.timeout = timeout
        self._http = httpx.Client(transport=transport, timeout=timeout or DEFAULT_TIMEOUT)

    def request(
        self,
        method: str,
        url: str,
        json: Any = None,
        data: Any = None,
        username: str = "",
        password: str = "",
        xapikey: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> tuple[str, Any, int, httpx.Headers]:
        # The same headers and body as Adyen's own requests-based client sends.
        sent = dict(headers or {})
        if username and password:
            token = base64.b64encode(f"{username}:{password}".encode()).decode()
            sent["Authorization"] = f"Basic {token}"
        elif xapikey:
            sent["x-api-key"] = xapikey
        sent["User-Agent"] = self.user_agent
        try:
            response = self._http.request(method, url, json=json, data=data, headers=sent)
        except ConfigurationError:
            raise  # a programming error, not a network one: never presented as retryable
        except (PayonceError, httpx.TransportError) as exc:
            _raise_adyen_error(exc, url)
        return response.text, json, response.status_code, response.headers

    def close(self) -> None:
        self._http.close()


def use_transport(
    adyen: Any,
    client: TransportSource,
    *,
    timeout: float | None = None,
    sdk_keys: str | None = None,
    outside_intent: OutsideIntent | None = None,
) -> None:
    """Send every call of ``adyen`` (an ``Adyen.Adyen`` or its ``AdyenClient``) through
    ``client.transport()``.

    The keys Adyen's callers give (``idempotency_key=``) are kept unless
    ``sdk_keys="replace"``: pass it when your code makes a ``uuid4()`` per call, which a
    process run again would not make the same. ``outside_intent="refuse"`` refuses a call
    outside any intent block instead of journaling it as a one-shot intent."""
    adyen_client = getattr(adyen, "client", adyen)
    # AdyenClient builds its HTTP client lazily, unless told it has one (http_init).
    user_agent = f"{adyen_client.USER_AGENT_SUFFIX}{adyen_client.LIB_VERSION}"
    if adyen_client.application_name:
        user_agent = f"{adyen_client.application_name} {user_agent}"
    adyen_client.http_client = TransportHTTPClient(
        sync_transport(
            client, **transport_options(sdk_keys=sdk_keys, outside_intent=outside_intent)
        ),
        user_agent=user_agent,
        timeout=timeout or adyen_client.http_timeout,
    )
    adyen_client.http_init = True


def _raise_adyen_error(exc: Exception, url: str) -> NoReturn:
    error: adyen_errors.AdyenError
    if isinstance(exc, httpx.TransportError):
        message = f"Unable to communicate with Adyen: {type(exc).__name__}: {exc}"
        error = adyen_errors.AdyenAPICommunicationError(message, url=url)
    elif isinstance(exc, IntentMismatch | CredentialMismatch):  # nothing sent: a caller bug
        error = adyen_errors.AdyenAPIUnprocessableEntity(f"{exc}{about(exc)}", url=url)
    elif isinstance(exc, IntentError):
        # OutcomeUnknown, IntentInFlight, ProviderUnavailable: Adyen's word for "no answer".
        error = adyen_errors.AdyenAPICommunicationError(f"payonce: {exc}{about(exc)}", url=url)
    else:
        error = adyen_errors.AdyenError(f"payonce: {exc}", url=url)
    carry(error, exc)
    raise error from exc
