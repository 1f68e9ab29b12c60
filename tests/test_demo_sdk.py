"""``payonce demo --sdk stripe``: the same stripe-python checkout killed after its steps
and run again, alone (duplicates) and through payonce.integrations.stripe (none)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

import payonce
from helpers.cli import run_cli
from helpers.processes import python_output
from payonce import _demo
from payonce._demo import SdkResult, SdkScenario, SdkStats, run_sdk_demo


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=120), out


@pytest.mark.slow  # eight worker processes, each importing stripe-python
def test_stripe_python_alone_duplicates_where_the_same_code_through_payonce_does_not() -> None:
    console, out = _console()
    # Killed after order 0's create answered, then after order 1's confirm answered.
    result = run_sdk_demo(SdkScenario(orders=3, kills=2), console)

    plain, through = result.plain, result.payonce
    # Alone: each run again made order 0 a second PaymentIntent, and order 1 a second one,
    # confirmed: a double charge.
    assert (plain.created, plain.duplicates, plain.charged) == (5, 2, 4)
    assert (plain.charged_twice, plain.missing) == (1, 0)
    # Through payonce: each step replayed from the journal on the run again.
    assert (through.created, through.duplicates, through.charged) == (3, 0, 3)
    assert (through.charged_twice, through.missing) == (0, 0)
    assert result.ok
    report = out.getvalue()
    assert "stripe-python alone: 2 duplicate PaymentIntent(s), 1 order(s) charged twice" in report
    assert "OK through payonce: 0 duplicates, 3 orders each created and confirmed once" in report


@pytest.mark.slow
def test_the_demo_command_runs_the_sdk_scenario_with_its_own_defaults() -> None:
    result = run_cli(["demo", "--sdk", "stripe", "--kills", "1"], columns=120)
    assert result.exit_code == 0, result.output
    assert "6 orders: create a PaymentIntent, then confirm it" in result.stdout
    assert "1 SIGKILL, each after a step answered" in result.stdout
    assert "duplicate PaymentIntents" in result.stdout
    assert "OK through payonce" in result.stdout
    assert "network faults" not in result.stdout  # the batch scenarios did not run


def test_more_kills_than_orders_is_refused() -> None:
    with pytest.raises(payonce.ConfigurationError, match="3 kills for 2 orders"):
        SdkScenario(orders=2, kills=3)
    result = run_cli(["demo", "--sdk", "stripe", "--orders", "2", "--kills", "3"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")
    assert "3 kills for 2 orders" in result.stderr


def test_an_sdk_without_a_demo_is_refused_by_name() -> None:
    result = run_cli(["demo", "--sdk", "paypal"])
    assert result.exit_code == 2
    assert "'paypal' is not 'stripe'" in result.output


def test_the_demo_command_fails_when_payonce_duplicates(monkeypatch: pytest.MonkeyPatch) -> None:
    # The exit status is what CI relies on: a broken payonce must turn it red.
    scenario = SdkScenario(orders=2, kills=1)
    twice = SdkStats(orders=2, kills=1, created=3, charged=3, charged_twice=1, missing=0, seconds=1)
    broken = SdkResult(scenario, payonce=twice, plain=twice)

    def fake_run_sdk_demo(*args: object, **kwargs: object) -> SdkResult:
        return broken

    monkeypatch.setattr(_demo, "run_sdk_demo", fake_run_sdk_demo)
    result = run_cli(["demo", "--sdk", "stripe"])
    assert result.exit_code == 1
    assert not broken.ok


def test_without_stripe_python_the_sdk_demo_names_the_extra_to_install() -> None:
    script = (
        "import sys\n"
        "sys.modules['stripe'] = None  # as if it were not installed\n"
        "import payonce, payonce.demo\n"
        "try:\n"
        "    payonce.demo.run_sdk_demo('stripe', orders=1, kills=0)\n"
        "except payonce.ConfigurationError as exc:\n"
        "    print(exc)\n"
    )
    assert "pip install 'payonce[stripe]'" in python_output(script)
