"""The demo: payonce executes each payment at most once where a naive client double-charges."""

from __future__ import annotations

import io
from pathlib import Path

import attrs
import pytest
from rich.console import Console

import payonce
from helpers.cli import run_cli
from payonce import _demo
from payonce._demo import DemoResult, run_demo
from payonce.sandbox import Faults

# Harsher than the default mix, so that 40 payments reliably show the naive client's
# duplicates, with a few slow answers that time out at the client and still execute.
HARSH = Faults(
    fail_before_rate=0.1,
    fail_after_rate=0.3,
    drop_after_rate=0.2,
    rate_limit_rate=0.05,
    retry_after_seconds=0.0,
    delay_rate=0.05,
    delay_seconds=0.4,
)


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=120), out


def _intents(path: Path) -> list[payonce.IntentRecord]:
    journal = payonce.open_journal(path)
    try:
        return journal.list_intents()
    finally:
        journal.close()


@pytest.mark.slow
def test_payonce_executes_once_where_the_naive_client_duplicates(tmp_path: Path) -> None:
    console, out = _console()
    journal = tmp_path / "demo.db"
    result = run_demo(40, 7, journal, console, faults=HARSH)

    assert result.ok, result.payonce.problems
    p = result.payonce
    assert p.problems == ()
    assert p.intents == 40
    assert p.duplicates == 0
    assert p.charged_twice == 0
    assert p.settled + p.unknown + p.pending == 40
    assert p.executions_of_settled == p.settled
    assert p.executions == p.settled + p.unknown_executed
    assert p.unknown_executed <= p.unknown
    assert p.retries > 0
    assert p.attempts >= 40 + p.retries
    assert p.provider_replays > 0  # executed, answer lost, replayed by key on the retry
    assert p.journal_replays == p.settled  # the second pass never reached the provider
    assert result.faults.seed == 7

    n = result.naive
    assert n.duplicates > 0
    assert n.charged_twice > 0
    assert n.executions > 40

    # The journal is kept where asked, and holds what the report says.
    assert result.journal == journal
    records = _intents(journal)
    assert {r.reference for r in records} == {f"demo-order-{i:04d}" for i in range(1, 41)}
    assert sum(r.attempt_count for r in records) == p.attempts

    report = out.getvalue()
    assert "duplicate executions" in report
    assert "OK payonce" in report
    assert f"{n.duplicates} duplicate execution(s)" in report


def test_default_journal_is_temporary_and_a_calm_network_has_no_duplicates() -> None:
    console, _ = _console()
    # No fault delays anything: a timeout here could only be this machine's load.
    result = run_demo(5, 0, None, console, faults=Faults(), client_timeout=10.0)
    assert result.ok
    assert result.journal is None
    assert result.payonce.succeeded == 5
    assert result.payonce.executions == 5
    assert result.payonce.retries == 0
    assert result.naive.executions == 5
    assert result.naive.duplicates == 0


def test_ambiguous_failures_end_unknown_and_never_executed(tmp_path: Path) -> None:
    # Every answer is a 503: payonce cannot tell whether it executed, so it gives up as
    # unknown, and the provider (which executed nothing) proves it never guessed.
    console, _ = _console()
    result = run_demo(3, 1, tmp_path / "j.db", console, faults=Faults(fail_before_rate=1.0))
    assert result.ok
    assert result.payonce.unknown == 3
    assert result.payonce.executions == 0
    assert result.payonce.unknown_executed == 0
    assert result.naive.gave_up == 3


def test_requests_that_never_arrived_stay_pending(tmp_path: Path) -> None:
    console, _ = _console()
    faults = Faults(rate_limit_rate=1.0, retry_after_seconds=0.0)
    # Every answer is a prompt 429: a timeout here could only be this machine's load, and
    # would make an attempt ambiguous.
    result = run_demo(3, 1, tmp_path / "j.db", console, faults=faults, client_timeout=10.0)
    assert result.ok
    assert result.payonce.pending == 3
    assert result.payonce.executions == 0
    assert {r.state for r in _intents(tmp_path / "j.db")} == {payonce.IntentState.PENDING}


def test_an_existing_journal_is_refused_untouched(tmp_path: Path) -> None:
    journal = tmp_path / "old.db"
    journal.write_bytes(b"precious")
    console, _ = _console()
    with pytest.raises(payonce.ConfigurationError, match="already exists"):
        run_demo(3, 0, journal, console)
    assert journal.read_bytes() == b"precious"


@pytest.mark.slow
def test_demo_command(tmp_path: Path) -> None:
    journal = tmp_path / "demo.db"
    args = ["demo", "--payments", "6", "--seed", "3", "--journal", str(journal)]
    args += ["--orders", "4", "--workers", "2", "--kills", "1", "--processing", "0.05"]
    result = run_cli(args, columns=120)
    assert result.exit_code == 0, result.output
    assert "payonce demo: 6 payments" in result.stdout
    assert "executions at the provider" in result.stdout
    assert "4 orders paid by 2 worker processes, 1 SIGKILL at random moments" in result.stdout
    assert "duplicate executions / missing orders" in result.stdout

    listed = run_cli(["intents", "list", "--journal", str(journal)], columns=120)
    assert listed.exit_code == 0
    assert "demo-order-0006" in listed.stdout

    again = run_cli(args, columns=120)
    assert again.exit_code == 2
    assert again.stderr.startswith("error: ")
    assert "already exists" in again.stderr


def test_demo_command_fails_when_payonce_double_executes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The exit status is what `make demo` and CI rely on; a broken payonce must turn it red.
    real = run_demo(2, 0, None, _console()[0], faults=Faults())
    broken = attrs.evolve(
        real,
        payonce=attrs.evolve(real.payonce, duplicates=1, problems=("demo-order-0001 twice",)),
    )

    def fake_run_demo(*args: object, **kwargs: object) -> DemoResult:
        return broken

    monkeypatch.setattr(_demo, "run_demo", fake_run_demo)
    result = run_cli(["demo", "--payments", "2"])
    assert result.exit_code == 1
    assert not broken.ok
