"""stripe-python over a payonce client, as a shop's process builds it (the one added line)."""

from __future__ import annotations

import contextlib

import stripe

import payonce
from payonce.integrations import stripe as stripe_integration
from payonce.sandbox import DEFAULT_API_KEY, SandboxServer


def stripe_over(
    client: payonce.Client, server: SandboxServer, closing: contextlib.ExitStack
) -> stripe.StripeClient:
    """stripe-python pointed at ``server`` through ``client``, its own retries off; its
    HTTP client closed with ``closing``."""
    http_client = stripe_integration.HTTPClient(client)
    closing.callback(http_client.close)
    return stripe.StripeClient(
        DEFAULT_API_KEY,
        base_addresses={"api": server.url},
        http_client=http_client,
        max_network_retries=0,
    )
