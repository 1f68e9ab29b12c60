"""mollie-api-python's requests session mounted on a payonce client's transport."""

from __future__ import annotations

from typing import Any

import requests
import requests.exceptions
from mollie.api.error import RequestError
from mollie.api.resources.base import ResourceBase

from .._requests_adapter import TransportAdapter
from ..errors import ConfigurationError, PayonceError
from ._sdk_errors import about, carry
from ._transports import (
    DrawnKeys,
    OutsideIntent,
    TransportSource,
    sync_transport,
    transport_options,
)

__all__ = ["use_transport"]


# mollie-api-python draws a uuid4 per create/update/delete with
# ``ResourceBase._generate_idempotency_key`` unless the caller passes ``idempotency_key=``.
_DRAWN = DrawnKeys(
    ResourceBase,
    "_generate_idempotency_key",
    sdk="mollie-api-python",
    supported="mollie-api-python>=4 (pip install 'payonce[mollie]')",
    static=True,
)


class _MollieAdapter(TransportAdapter):
    """Replaces the keys mollie-api-python drew (a caller's own key is the step's), and
    turns a payonce error into the requests error mollie-api-python wraps as its own
    ``RequestError``, the one exception its callers catch for "no answer"."""

    def send(
        self, request: requests.PreparedRequest, *args: Any, **kwargs: Any
    ) -> requests.Response:
        key = request.headers.get("Idempotency-Key")
        if key is not None and _DRAWN.drawn(key):
            request = request.copy()
            del request.headers["Idempotency-Key"]
        try:
            return super().send(request, *args, **kwargs)
        except ConfigurationError:
            # A programming error, not a network one: raised as itself (mollie-api-python
            # wraps only requests' errors as its RequestError).
            raise
        except PayonceError as exc:
            message = f"payonce: {exc}{about(exc)}"
            error = requests.exceptions.ConnectionError(message, request=request)
            carry(error, exc)
            raise error from exc


def _carrying(mollie_client: Any) -> None:
    """Make the ``RequestError`` mollie-api-python raises for a payonce error carry that
    error's key, reference and step as attributes (``carry``), as the other SDKs' do: the
    SDK raises it while handling the requests error the adapter raised, with its message
    only."""
    perform = mollie_client.perform_http_call
    if getattr(perform, "_payonce_carrying", False):
        return  # plugged in already

    def perform_http_call(*args: Any, **kwargs: Any) -> Any:
        try:
            return perform(*args, **kwargs)
        except RequestError as error:
            cause = error.__context__
            if isinstance(getattr(cause, "payonce_error", None), PayonceError):
                assert cause is not None
                carry(error, cause.payonce_error)  # type: ignore[attr-defined]
            raise

    perform_http_call._payonce_carrying = True  # type: ignore[attr-defined]
    mollie_client.perform_http_call = perform_http_call


def use_transport(
    mollie_client: Any, client: TransportSource, *, outside_intent: OutsideIntent | None = None
) -> requests.Session:
    """Send every call of ``mollie_client`` (a ``mollie.api.client.Client``) through
    ``client.transport()``, mollie-api-python's own keys replaced by the steps' (a key the
    caller passes as ``idempotency_key=`` is kept); returns the session it now uses.
    ``outside_intent="refuse"`` refuses a call outside any intent block instead of
    journaling it as a one-shot intent."""
    options = transport_options(outside_intent=outside_intent)
    adapter = _MollieAdapter(sync_transport(client, **options))
    # The SDK creates its session lazily (and mounts its retrying adapter on it then); one
    # already there is reused. An OAuth client's session is mounted too.
    session = getattr(mollie_client, "_client", None) or requests.Session()
    session.verify = True
    for scheme in ("https://", "http://"):
        session.mount(scheme, adapter)
    mollie_client._client = session
    _carrying(mollie_client)
    oauth = getattr(mollie_client, "_oauth_client", None)
    if oauth is not None:
        for scheme in ("https://", "http://"):
            oauth.mount(scheme, adapter)
    return session
