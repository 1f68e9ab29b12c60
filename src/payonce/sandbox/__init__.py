"""A reference payment provider over real HTTP, with injectable faults.

It keeps the server side of the Idempotency-Key contract and counts every real execution,
which is how the test-suite, the examples and the demo prove no payment ran twice.
"""

from __future__ import annotations

from payonce.sandbox._app import create_app
from payonce.sandbox._config import (
    DEFAULT_ACCOUNT,
    DEFAULT_API_KEY,
    MOLLIE_TEST_API_KEY,
    SandboxConfig,
)
from payonce.sandbox._faults import Faults
from payonce.sandbox._server import SandboxServer, serve
from payonce.sandbox._store import SandboxStore
from payonce.sandbox._webhooks import WebhookAttempt, WebhookConfig, event_id_for

__all__ = [
    "DEFAULT_ACCOUNT",
    "DEFAULT_API_KEY",
    "MOLLIE_TEST_API_KEY",
    "Faults",
    "SandboxConfig",
    "SandboxServer",
    "SandboxStore",
    "WebhookAttempt",
    "WebhookConfig",
    "create_app",
    "event_id_for",
    "serve",
]
