"""mollie-api-python's requests session mounted on a payonce client's transport."""

from __future__ import annotations

from typing import Any

import requests
import requests.exceptions

from .._requests_adapter import TransportAdapter
from ..errors import PayonceError
from ._transports import TransportSource, about, sync_transport

__all__ = ["use_transport"]


class _MollieAdapter(TransportAdapter):
    """Turns a payonce error into the requests error mollie-api-python wraps as its own
    ``RequestError``, the one exception its callers catch for "no answer"."""

    def send(
        self, request: requests.PreparedRequest, *args: Any, **kwargs: Any
    ) -> requests.Response:
        try:
            return super().send(request, *args, **kwargs)
        except PayonceError as exc:
            message = f"payonce: {exc}{about(exc)}"
            error = requests.exceptions.ConnectionError(message, request=request)
            error.payonce_error = exc  # type: ignore[attr-defined]
            raise error from exc


def use_transport(mollie_client: Any, client: TransportSource) -> requests.Session:
    """Send every call of ``mollie_client`` (a ``mollie.api.client.Client``) through
    ``client.transport(sdk_keys="replace")``; returns the session it now uses."""
    adapter = _MollieAdapter(sync_transport(client, sdk_keys="replace"))
    # The SDK creates its session lazily (and mounts its retrying adapter on it then); one
    # already there is reused. An OAuth client's session is mounted too.
    session = getattr(mollie_client, "_client", None) or requests.Session()
    session.verify = True
    for scheme in ("https://", "http://"):
        session.mount(scheme, adapter)
    mollie_client._client = session
    oauth = getattr(mollie_client, "_oauth_client", None)
    if oauth is not None:
        for scheme in ("https://", "http://"):
            oauth.mount(scheme, adapter)
    return session
