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
    payments: int = 300,
    *,
    seed: int = 0,
    journal: str | os.PathLike[str] | None = None,
    orders: int = 60,
    workers: int = 3,
    kills: int = 10,
    processing: float = 0.15,
) -> bool:
    """Run ``payonce demo``: payonce against the usual alternatives, in two scenarios.

    First the same payments through payonce and through a naive client (a fresh key per
    attempt), meeting the same seeded faults of a fresh sandbox provider. Then a batch of
    orders paid by worker processes that are SIGKILLed at random moments and restarted,
    through payonce and through the stripe-python pattern (a key per call, in memory).
    The report goes to standard output.

    Args:
        payments: how many payments each client sends over the faulty network.
        seed: the seed of the faults, and of the moments and victims of the kills.
        journal: a new file to keep the network scenario's journal in (default: a
            temporary one).
        orders: how many orders the killed workers pay, per client.
        workers: how many worker processes pay them.
        kills: how many SIGKILLs each client's workers get.
        processing: seconds the provider takes per payment of the batch.

    Returns:
        True when payonce executed no payment twice, every count adds up, and through the
        kills it charged every order exactly once.

    Raises:
        payonce.ConfigurationError: ``journal`` already exists, ``payments`` < 1, or the
            kill scenario's numbers do not fit (more workers than orders, ...).
    """
    # Imported when called: the demo imports this package, and the whole client with it.
    from payonce import _demo

    path = None if journal is None else Path(journal)
    scenario = _demo.KillScenario(
        orders=orders, workers=workers, kills=kills, processing=processing, seed=seed
    )
    return _demo.run_demo(payments, seed, path, Console(highlight=False), kills=scenario).ok
