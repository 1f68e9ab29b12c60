"""A reference payment provider over real HTTP, with injectable faults.

It keeps the server side of the Idempotency-Key contract and counts every real execution,
which is how the test-suite, the examples and the demo prove no payment ran twice.
"""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console

from payonce.sandbox._app import create_app
from payonce.sandbox._config import DEFAULT_ACCOUNT, DEFAULT_API_KEY, SandboxConfig
from payonce.sandbox._faults import Faults
from payonce.sandbox._server import SandboxServer, serve
from payonce.sandbox._store import SandboxStore
from payonce.sandbox._webhooks import WebhookAttempt, WebhookConfig, event_id_for

__all__ = [
    "DEFAULT_ACCOUNT",
    "DEFAULT_API_KEY",
    "Faults",
    "SandboxConfig",
    "SandboxServer",
    "SandboxStore",
    "WebhookAttempt",
    "WebhookConfig",
    "create_app",
    "event_id_for",
    "run_demo",
    "serve",
]


def run_demo(
    payments: int = 300, *, seed: int = 0, journal: str | os.PathLike[str] | None = None
) -> bool:
    """Run ``payonce demo``: the same payments through payonce and through a naive client.

    Both meet the same seeded faults of a fresh sandbox provider; the report goes to
    standard output.

    Args:
        payments: how many payments each client sends.
        seed: the seed of the faults.
        journal: a new file to keep payonce's journal in (default: a temporary one).

    Returns:
        True when payonce executed no payment twice and every count adds up.

    Raises:
        payonce.ConfigurationError: ``journal`` already exists, or ``payments`` < 1.
    """
    # Imported when called: the demo imports this package, and the whole client with it.
    from payonce import _demo

    path = None if journal is None else Path(journal)
    return _demo.run_demo(payments, seed, path, Console(highlight=False)).ok
