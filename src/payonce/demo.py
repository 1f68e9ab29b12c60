"""``payonce demo`` from Python: the demo's public front door.

Needs payonce's sandbox extra, as the sandbox provider does. The demo itself is in
``payonce._demo``; this module is its front door, above both the demo and
``payonce.sandbox``, so the sandbox provider never imports the demo that uses it.
"""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console

from payonce import _demo

__all__ = ["run_demo", "run_sdk_demo"]


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
    path = None if journal is None else Path(journal)
    scenario = _demo.KillScenario(
        orders=orders, workers=workers, kills=kills, processing=processing, seed=seed
    )
    return _demo.run_demo(payments, seed, path, Console(highlight=False), kills=scenario).ok


def run_sdk_demo(sdk: str = "stripe", *, orders: int = 6, kills: int = 3) -> bool:
    """Run ``payonce demo --sdk stripe``: a stripe-python checkout killed and run again.

    The same checkout code (create a PaymentIntent, then confirm it) pays ``orders``
    orders in a worker process SIGKILLed ``kills`` times after a step answered and run
    again each time: with stripe-python alone, then through
    ``payonce.integrations.stripe.HTTPClient``. The report goes to standard output.

    Returns:
        True when, through payonce, every order was created and charged exactly once.

    Raises:
        payonce.ConfigurationError: an SDK other than ``"stripe"``, ``orders`` < 1, more
            kills than orders, or stripe-python is not installed (extra ``stripe``).
    """
    scenario = _demo.SdkScenario(sdk=sdk, orders=orders, kills=kills)
    return _demo.run_sdk_demo(scenario, Console(highlight=False)).ok
