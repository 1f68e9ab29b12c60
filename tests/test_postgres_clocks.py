"""Hosts sharing a PostgreSQL journal judge its leases and dates by one clock, the server's.

The red team's case: host A pays a reference; host B, its wall clock 105 s ahead (or 4
minutes behind), pays the same reference a moment later and retries while A's attempt is
still being processed by a provider that does not guard a duplicate in flight (the
sandbox's ``racy`` idempotency). By B's own clock A's lease had run out (or was too far
ahead to be trusted): B took the intent over and resent it, and the payment executed
twice. Each host now reads the journal's clock (its own corrected by the offset of the
database server's, measured on each new connection): B waits, told ``IntentInFlight``,
until A's real lease ends with A's settle, and then gets A's answer.

Both hosts are real child processes, B under libfaketime; the journal a real PostgreSQL
server; the provider the sandbox on loopback.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

import payonce
from helpers.faketime import libfaketime_env
from helpers.processes import python_env
from payonce.sandbox import SandboxServer

# A host paying one reference, told IntentInFlight at once (in_flight_wait=0) and trying
# again every half second, as a service retrying its caller's request would. Each refusal
# touches a file, for the test to know it was told. Its read timeout outlasts any hold.
_PAY = """
import json, logging, select, sys, time
from pathlib import Path

import payonce
from payonce.sandbox import DEFAULT_API_KEY

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
url, journal, reference, refused = sys.argv[1:]
client = payonce.Client(
    base_url=url, provider="sandbox", account="acct_demo", api_key=DEFAULT_API_KEY,
    journal=journal, in_flight_wait=0, lease_seconds=30, timeout=120,
)
told_in_flight = 0
give_up = time.monotonic() + 60
while True:
    try:
        response = client.post(
            "/v1/payments", json={"amount": 4200, "currency": "eur"}, reference=reference
        )
    except payonce.IntentInFlight:
        told_in_flight += 1
        Path(refused).touch()
        if time.monotonic() > give_up:
            raise
        select.select([], [], [], 0.5)  # libfaketime's time.sleep fails (EINVAL)
        continue
    break
print(json.dumps({"id": response.json()["id"], "in_flight": told_in_flight}), flush=True)
client.close()
"""


def _host(
    sandbox: SandboxServer, journal: str, env: dict[str, str], refused: Path
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _PAY, sandbox.url, journal, "sl1", str(refused)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_until_sent(journal: str, host: subprocess.Popen[str]) -> None:
    """Until A's first attempt is journaled as sent (its request is on its way)."""
    give_up = time.monotonic() + 60
    with psycopg.connect(journal, autocommit=True) as conn:
        while time.monotonic() < give_up and host.poll() is None:
            try:
                row = conn.execute(
                    "SELECT count(*) FROM intents WHERE first_sent_at IS NOT NULL"
                ).fetchone()
            except psycopg.errors.UndefinedTable:
                row = None
            if row is not None and row[0] == 1:
                return
            time.sleep(0.05)
    _, err = host.communicate(timeout=30)
    pytest.fail(f"host A never sent its payment:\n{err[-3000:]}")


def _wait_until_refused(refused: Path, host: subprocess.Popen[str], sandbox: SandboxServer) -> None:
    """Until B has been told IntentInFlight while A's attempt is held at the provider."""
    give_up = time.monotonic() + 60
    while time.monotonic() < give_up and host.poll() is None and not refused.exists():
        # A second request held is B's resend: it took A's intent over.
        assert sandbox.held < 2, "B resent A's payment while A's attempt was in flight"
        time.sleep(0.05)
    if not refused.exists():
        host.kill()
        _, err = host.communicate(timeout=30)
        pytest.fail(f"host B was never told A's payment is in flight:\n{err[-3000:]}")


def _finished(host: subprocess.Popen[str], name: str) -> tuple[dict[str, object], str]:
    out, err = host.communicate(timeout=120)
    assert host.returncode == 0, f"host {name} failed:\n{err[-3000:]}"
    return json.loads(out.strip().splitlines()[-1]), err


@pytest.mark.slow
@pytest.mark.parametrize(
    ("skew", "words"), [("+105", "105s ahead of"), ("-240", "240s behind")], ids=["ahead", "behind"]
)
def test_a_host_whose_clock_is_off_waits_for_the_real_lease_and_pays_once(
    make_sandbox: Callable[..., SandboxServer],
    postgres_url: str,
    tmp_path: Path,
    skew: str,
    words: str,
) -> None:
    sandbox = make_sandbox(idempotency="racy")
    # A's payment stays at the provider until B, however slowly it starts, has tried it.
    with sandbox.holding():
        host_a = _host(sandbox, postgres_url, python_env(), tmp_path / "a-refused")
        _wait_until_sent(postgres_url, host_a)
        assert sandbox.wait_held(1), "A's payment never reached the provider"
        host_b = _host(
            sandbox, postgres_url, {**python_env(), **libfaketime_env(skew)}, tmp_path / "b-refused"
        )
        _wait_until_refused(tmp_path / "b-refused", host_b, sandbox)

    paid_a, _ = _finished(host_a, "A")
    paid_b, said_b = _finished(host_b, "B")

    sandbox.wait_idle()
    assert list(sandbox.store.executions().values()) == [1], "the payment executed twice"
    assert paid_b["id"] == paid_a["id"], "B got another payment than A's"
    assert paid_b["in_flight"], "B did not wait for A's lease"
    # B was told that its clock is off the journal database's, by about the skew.
    assert f"this host's clock is {words} the clock of the journal database" in said_b, said_b


_READ_CLOCKS = """
import json, logging, sys, time

import payonce

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
with payonce.open_journal(sys.argv[1]) as journal:
    print(json.dumps({"journal": journal.now(), "host": time.time()}), flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("skew", [105.0, -240.0], ids=["ahead", "behind"])
def test_the_journal_clock_of_a_host_whose_clock_is_off_is_the_servers(
    postgres_url: str, skew: float
) -> None:
    read = subprocess.run(
        [sys.executable, "-c", _READ_CLOCKS, postgres_url],
        env={**python_env(), **libfaketime_env(f"{skew:+.0f}")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert read.returncode == 0, read.stderr[-3000:]
    clocks = json.loads(read.stdout)
    now = time.time()  # this process's clock is the server's: one host
    assert abs(clocks["host"] - skew - now) < 30, "the child's clock was not off"
    assert abs(clocks["journal"] - now) < 30, "the journal's clock is the host's, not the server's"
    off = f"{abs(skew):.0f}s {'ahead of' if skew > 0 else 'behind'} the clock of the journal"
    assert f"WARNING:payonce:this host's clock is {off}" in read.stderr, read.stderr


_STEP_OWN_CLOCK = """
import json, select, sys, time
from pathlib import Path

import payonce

with payonce.open_journal(sys.argv[1]) as journal:
    before = {"journal": journal.now(), "host": time.time()}
    # The host's clock is stepped while the journal's connection lives (an NTP step, an
    # operator fixing a clock payonce warned about): libfaketime reads this file anew.
    Path(sys.argv[2]).write_text(sys.argv[3])
    select.select([], [], [], 0.2)
    after = {"journal": journal.now(), "host": time.time()}
print(json.dumps({"before": before, "after": after}), flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("step", [105.0, -240.0], ids=["forward", "back"])
def test_a_host_clock_stepped_while_connected_does_not_move_the_journal_clock(
    postgres_url: str, tmp_path: Path, step: float
) -> None:
    # The red-team's case: a clock stepped after the offset was measured made the host's
    # journal clock wrong by the step until its next connection (an hour, pooled), and a
    # lease dated by it was taken over by another host: paid twice.
    stepped = tmp_path / "faketime"
    stepped.write_text("+0")
    env = {**python_env(), **libfaketime_env("+0")}
    del env["FAKETIME"]
    env |= {"FAKETIME_TIMESTAMP_FILE": str(stepped), "FAKETIME_NO_CACHE": "1"}
    read = subprocess.run(
        [sys.executable, "-c", _STEP_OWN_CLOCK, postgres_url, str(stepped), f"{step:+.0f}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert read.returncode == 0, read.stderr[-3000:]
    clocks = json.loads(read.stdout)
    now = time.time()  # the server's clock: one host
    assert abs(clocks["after"]["host"] - step - now) < 30, "the child's clock was not stepped"
    assert abs(clocks["before"]["journal"] - now) < 30
    assert abs(clocks["after"]["journal"] - now) < 30, "the step moved the journal's clock"


def test_a_database_clock_that_moves_between_connections_is_warned_about(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A step on the server, or a failover to a server whose clock differs: leases dated by
    # the old clock are judged by the new one. Nothing can tell which was right; say it.
    with payonce.open_journal(postgres_url) as journal:
        engine = journal._engine
        now = time.time()
        with caplog.at_level("WARNING", logger="payonce"):
            engine._clock_read(now + 0.01, now, now)  # type: ignore[attr-defined]
            assert "moved by" not in caplog.text
            engine._clock_read(now + 200.0, now, now)  # type: ignore[attr-defined]
        assert "the clock of the journal database" in caplog.text
        assert "moved by +200s since this host last read it" in caplog.text
        assert abs(journal.now() - (time.time() + 200.0)) < 5
