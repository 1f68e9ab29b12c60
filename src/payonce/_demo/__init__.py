"""``payonce demo``: what one key per payment, journaled, saves you from.

Two scenarios, each against fresh sandbox providers with the same seeded faults:

- a faulty network: payonce retries under one key per payment; the naive client retries
  with a fresh key per attempt, as code that "adds an idempotency key" per request does;
- worker processes SIGKILLed mid-batch and restarted (``_kills``): payonce's workers find
  each order's key again in their shared journal; the stripe-python pattern keeps a key
  per call in memory, safe for retries but lost with the process.

A third, on its own (``payonce demo --sdk stripe``, ``_sdk``): a stripe-python checkout
killed after its steps and run again, alone and through ``payonce.integrations.stripe``.

The provider counts executions, so the difference is measured, not claimed.
"""

from __future__ import annotations

import tempfile
from contextlib import ExitStack
from pathlib import Path

import attrs
from rich.console import Console

import payonce
from payonce._demo._kill_report import print_kill_intro, print_kill_report, print_summary
from payonce._demo._kills import KillScenario, run_kill_scenario
from payonce._demo._naive import run_naive
from payonce._demo._payonce import run_payonce
from payonce._demo._report import print_intro, print_report
from payonce._demo._results import DemoResult, KillResult, KillStats, NaiveStats, PayonceStats
from payonce._demo._scenario import CLIENT_TIMEOUT, DEMO_FAULTS, DEMO_RETRY, plan
from payonce._demo._sdk import SdkResult, SdkScenario, SdkStats, run_sdk_demo
from payonce.sandbox import Faults

__all__ = [
    "CLIENT_TIMEOUT",
    "DEMO_FAULTS",
    "DEMO_RETRY",
    "DemoResult",
    "KillResult",
    "KillScenario",
    "KillStats",
    "NaiveStats",
    "PayonceStats",
    "SdkResult",
    "SdkScenario",
    "SdkStats",
    "run_demo",
    "run_sdk_demo",
]


def run_demo(
    payments: int,
    seed: int,
    journal: Path | None,
    console: Console,
    *,
    faults: Faults | None = None,
    kills: KillScenario | None = None,
    client_timeout: float = CLIENT_TIMEOUT,
) -> DemoResult:
    """Run the demo and print its report on ``console``.

    ``faults`` replaces the default fault mix; its seed is always replaced by ``seed``, so
    both clients meet the same faults. ``journal`` must not exist yet: the demo's counts
    only make sense on a fresh journal. ``kills`` adds the kill scenario (its seed, too,
    replaced by ``seed``); None leaves it out. ``client_timeout``: both clients' timeout,
    shorter than the injected delay so that a slow answer is a lost success.
    """
    if payments < 1:
        raise payonce.ConfigurationError("the demo needs at least one payment")
    if journal is not None and journal.exists():
        raise payonce.ConfigurationError(
            f"{journal} already exists; the demo writes a fresh journal: choose a new path"
        )
    faults = attrs.evolve(faults or DEMO_FAULTS, seed=seed)
    payment_plan = plan(payments)
    print_intro(console, payments, faults, client_timeout)
    with ExitStack() as stack:
        if journal is None:
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="payonce-demo-"))
            journal_path = Path(directory) / "journal.db"
        else:
            journal_path = journal
        payonce_stats = run_payonce(payment_plan, faults, journal_path, console, client_timeout)
    naive_stats = run_naive(payment_plan, faults, console, client_timeout)
    result = DemoResult(payments, faults, journal, payonce=payonce_stats, naive=naive_stats)
    print_report(console, result)
    if kills is not None:
        kills = attrs.evolve(kills, seed=seed)
        print_kill_intro(console, kills)
        killed = run_kill_scenario(kills, console)
        print_kill_report(console, killed)
        result = attrs.evolve(result, kills=killed)
        print_summary(console, result)
    return result
