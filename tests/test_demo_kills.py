"""The demo's kill scenario: worker processes SIGKILLed mid-batch and restarted.

payonce's workers, sharing one journal, charge every order exactly once; the stripe-python
pattern (a key per call, in memory) charges again the order a killed worker was paying.
The counts the demo reports are checked against the provider's own store, read here after
the demo is done with it.
"""

from __future__ import annotations

import io
import re
from collections import Counter
from pathlib import Path

import attrs
import pytest
from rich.console import Console

import payonce
from helpers.cli import run_cli
from payonce._demo import KillScenario, KillStats
from payonce._demo._kill_report import print_kill_report
from payonce._demo._kills import run_kill_scenario
from payonce.sandbox import SandboxConfig, SandboxServer, SandboxStore

# A few orders, a few kills, and a provider slow enough that nearly every kill catches a
# payment between its request and its answer.
SMALL = KillScenario(orders=8, workers=2, kills=4, processing=0.3, seed=11)


def _counted_at_the_provider(store_path: Path, orders: int) -> dict[str, int]:
    store = SandboxStore(store_path)
    try:
        by_reference = Counter(payment["reference"] for payment in store.payments())
    finally:
        store.close()
    references = [f"demo-order-{n:04d}" for n in range(1, orders + 1)]
    assert set(by_reference) <= set(references)
    return {
        "executions": sum(by_reference.values()),
        "duplicates": sum(count - 1 for count in by_reference.values() if count > 1),
        "charged_twice": sum(count > 1 for count in by_reference.values()),
        "missing": sum(by_reference[reference] == 0 for reference in references),
    }


def _reported(stats: KillStats) -> dict[str, int]:
    return {
        "executions": stats.executions,
        "duplicates": stats.duplicates,
        "charged_twice": stats.charged_twice,
        "missing": stats.missing,
    }


@pytest.mark.slow
def test_killed_workers_charge_once_with_payonce_and_again_with_the_stripe_pattern(
    tmp_path: Path,
) -> None:
    # Each provider keeps its store in a file, so that it can be read after the demo.
    stores: list[Path] = []

    def provider(config: SandboxConfig) -> SandboxServer:
        stores.append(tmp_path / f"provider-{len(stores)}.db")
        return SandboxServer(attrs.evolve(config, store_path=str(stores[-1])))

    out = io.StringIO()
    console = Console(file=out, width=120)
    result = run_kill_scenario(SMALL, console, provider=provider)
    print_kill_report(console, result)
    report = out.getvalue()

    payonce_store, stripe_store = stores
    assert _reported(result.payonce) == _counted_at_the_provider(payonce_store, SMALL.orders)
    assert _reported(result.stripe) == _counted_at_the_provider(stripe_store, SMALL.orders)

    assert result.payonce.kills == result.stripe.kills == SMALL.kills
    assert result.payonce.duplicates == 0
    assert result.payonce.missing == 0
    assert result.payonce.executions == SMALL.orders
    assert result.payonce.cut_off is not None
    assert result.payonce.cut_off > 0
    assert result.ok

    # The stripe-python pattern double-charges only through kills: lost answers are
    # retried under the same key, and a kill re-charges at most the order it interrupted.
    assert 0 < result.stripe.duplicates <= SMALL.kills
    assert result.stripe.missing == 0
    assert result.stripe.cut_off is None

    stripe_line = re.search(
        r"stripe-python pattern: (\d+) duplicate execution\(s\), (\d+) missing order\(s\)",
        report,
    )
    assert stripe_line is not None, report
    assert int(stripe_line[1]) == result.stripe.duplicates
    assert int(stripe_line[2]) == result.stripe.missing
    assert f"each executed exactly once through {SMALL.kills} kills" in report


def test_each_worker_pays_its_own_slice_of_the_batch() -> None:
    assert KillScenario(orders=7, workers=3).slices() == [(0, 3), (3, 2), (5, 2)]
    assert KillScenario(orders=2, workers=2).slices() == [(0, 1), (1, 1)]


def test_a_scenario_with_more_workers_than_orders_is_refused() -> None:
    with pytest.raises(payonce.ConfigurationError, match="3 workers for 2 orders"):
        KillScenario(orders=2, workers=3)


def test_the_demo_command_refuses_kill_numbers_that_do_not_fit(tmp_path: Path) -> None:
    # Refused before any payment is sent: nothing is left behind, not even the journal.
    journal = tmp_path / "demo.db"
    args = ["demo", "--orders", "2", "--workers", "3", "--journal", str(journal)]
    result = run_cli(args)
    assert result.exit_code == 2
    assert "3 workers for 2 orders" in result.stderr
    assert not journal.exists()


def test_the_demo_command_documents_the_kill_knobs() -> None:
    result = run_cli(["demo", "--help"], columns=120)
    assert result.exit_code == 0
    for knob in ("--seed", "--orders", "--workers", "--kills", "--processing"):
        assert knob in result.stdout
    assert "SIGKILL" in result.stdout
    assert "stripe-python" in result.stdout
