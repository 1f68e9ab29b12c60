"""``payonce worker``: the long-running recovery process, with real processes, a real
sandbox (faults included), real SQLite and PostgreSQL journals.

Every claim is read from the sandbox's store (what it executed, how often) and from the
journal, never from the worker's own words alone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

import payonce
from helpers.cli import PYTHON_M_PAYONCE, run_cli, run_cli_process
from helpers.payments import PAYMENT, MakeClient, make_unknown
from helpers.pending import enqueue_pending
from helpers.processes import python_env
from helpers.proxies import Page, pages_in_front_of
from payonce.hooks import IntentEscalated, WorkerPassEnded
from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY, Faults, SandboxServer
from payonce.worker import Worker
from test_otel import Telemetry
from test_otel import telemetry as telemetry_fixture

# The environment key is sent only for the account it is named with.
KEY_ENV = {"PAYONCE_API_KEY": DEFAULT_API_KEY, "PAYONCE_ACCOUNT": DEFAULT_ACCOUNT}
telemetry = telemetry_fixture  # OpenTelemetry's in-memory exporters, as test_otel has them
MAINTENANCE = Page(503, "application/json", b'{"error": {"type": "maintenance"}}')


def _worker_args(url: str, journal: str | Path, *more: str) -> list[str]:
    return ["worker", "--base-url", url, "--journal", str(journal), *more]


def _states(journal: str | Path) -> dict[str, payonce.IntentState]:
    with payonce.open_journal(journal) as opened:
        return {r.key: r.state for r in opened.list_intents()}


def _held(journal: str | Path) -> list[str]:
    """The intents whose lease someone still holds."""
    with payonce.open_journal(journal) as opened:
        return [r.key for r in opened.list_intents() if r.lease_owner is not None]


# -- one pass ----------------------------------------------------------------------------------


def test_once_sends_every_pending_intent_once_and_exits_0(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    keys = enqueue_pending(make_client(), 12)

    result = run_cli_process(_worker_args(sandbox.url, journal_path, "--once"), env=KEY_ENV)

    assert result.exit_code == 0, result.output
    assert sandbox.wait_idle()
    assert sandbox.store.executions() == dict.fromkeys(keys, 1)
    assert set(_states(journal_path).values()) == {payonce.IntentState.SUCCEEDED}
    assert (
        "12 sent, 12 settled, 0 still pending, 0 still unknown, 0 escalated, 0 failed"
        in result.stderr
    )
    assert _held(journal_path) == []


@pytest.mark.slow
def test_once_exits_1_while_an_unknown_intent_stays_unknown(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    unknown = make_unknown(make_client, sandbox, "order-lost", "drop_after")

    # Due or not yet on its schedule, the provider's status endpoint (down) cannot tell.
    with pages_in_front_of(sandbox.url, [MAINTENANCE] * 20) as down:
        result = run_cli_process(_worker_args(down.url, journal_path, "--once"), env=KEY_ENV)

    assert result.exit_code == 1, result.output
    assert "0 sent, 0 settled, 0 still pending, 1 still unknown, 0 escalated" in result.stderr
    assert _states(journal_path) == {unknown.key: payonce.IntentState.UNKNOWN}
    assert sandbox.wait_idle()
    assert sandbox.store.executions() == {unknown.key: 1}  # never resent


@pytest.mark.slow
def test_no_api_key_for_any_account_exits_2_and_its_intents_stay_pending(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    keys = enqueue_pending(make_client(), 3)

    for once in (["--once"], []):  # running, it stops at once too: nothing is recovered
        result = run_cli_process(_worker_args(sandbox.url, journal_path, *once))

        assert result.exit_code == 2, result.output
        assert "account 'acct_demo' of provider 'sandbox' not driven: no API key" in (result.stderr)
        assert (
            "0 sent, 0 settled, 3 still pending, 0 still unknown, 0 escalated, 0 failed, "
            "1 account(s) not driven" in result.stderr
        )
        assert "no account could be driven" in result.stderr
    assert _states(journal_path) == dict.fromkeys(keys, payonce.IntentState.PENDING)
    assert sandbox.store.executions() == {}


def test_a_missing_base_url_is_a_usage_error_and_the_journal_is_untouched(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    keys = enqueue_pending(make_client(), 2)

    result = run_cli(["worker", "--once", "--journal", str(journal_path)], env=KEY_ENV)

    assert result.exit_code == 2
    assert "--base-url is required" in result.stderr
    assert _states(journal_path) == dict.fromkeys(keys, payonce.IntentState.PENDING)


@pytest.mark.slow
def test_a_postgresql_journal_that_does_not_exist_is_refused_never_created(
    make_client: MakeClient, sandbox: SandboxServer, postgres_url: str
) -> None:
    # The service's journal lives in schema shop; the worker is given the database
    # without its ?schema=, or with a mistyped one.
    journal_url = f"{postgres_url}?schema=shop"
    keys = enqueue_pending(make_client(journal=journal_url), 1)

    for wrong in (postgres_url, f"{postgres_url}?schema=shpo"):
        result = run_cli_process(_worker_args(sandbox.url, wrong, "--once"), env=KEY_ENV)

        assert result.exit_code == 2, result.output
        assert "not a payonce journal yet" in result.stderr
    with psycopg.connect(postgres_url) as connection:
        schemas = connection.execute(
            "SELECT DISTINCT table_schema FROM information_schema.tables"
            " WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
        ).fetchall()
    assert schemas == [("shop",)]  # nothing created in public nor in shpo
    assert _states(journal_url) == dict.fromkeys(keys, payonce.IntentState.PENDING)
    assert sandbox.store.executions() == {}


# A second provider's intents sent to the first's URL fail there for good; a second
# account's sent with the first's key pay on the wrong merchant account.
SECOND_PROVIDER = ({"provider": "generic"}, "several providers: generic (1), sandbox (1)")
SECOND_ACCOUNT = (
    {"account": "acct_other"},
    "no API key for account 'acct_other': PAYONCE_API_KEY is set, but is never sent for it: "
    "no account was named",
)


@pytest.mark.slow
@pytest.mark.parametrize(("second", "said"), [SECOND_PROVIDER, SECOND_ACCOUNT])
def test_one_plain_url_or_environment_key_for_several_is_refused_and_nothing_is_sent(
    make_client: MakeClient,
    sandbox: SandboxServer,
    journal_path: Path,
    second: dict[str, str],
    said: str,
) -> None:
    ours = enqueue_pending(make_client(), 1)
    theirs = enqueue_pending(make_client(**second), 1, prefix="order-second")

    # The key given alone, with no account named: whose it is is not known.
    key_alone = {"PAYONCE_API_KEY": DEFAULT_API_KEY}
    result = run_cli_process(_worker_args(sandbox.url, journal_path, "--once"), env=key_alone)

    assert result.exit_code == 2, result.output
    assert said in result.stderr
    assert _states(journal_path) == dict.fromkeys(ours + theirs, payonce.IntentState.PENDING)
    assert sandbox.store.executions() == {}


def test_a_running_worker_sends_with_its_plain_url_only_what_it_first_saw(
    make_client: MakeClient,
    sandbox: SandboxServer,
    journal_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    said = "no base URL for provider 'generic': give it one (the plain"
    monkeypatch.setenv("PAYONCE_API_KEY", DEFAULT_API_KEY)
    first = enqueue_pending(make_client(), 1)
    with Worker(journal=journal_path, base_url=sandbox.url, account=DEFAULT_ACCOUNT) as worker:
        worker.run_pass()  # the sandbox's URL and the key, for account acct_demo
        theirs = enqueue_pending(make_client(provider="generic"), 1, prefix="order-second")
        late = enqueue_pending(make_client(), 1, prefix="order-late")

        ended = worker.run_pass()

    assert (ended.sent, ended.not_driven, ended.pending) == (1, 1, 1)
    assert said in caplog.text
    assert sandbox.wait_idle()
    assert sandbox.store.executions() == dict.fromkeys(first + late, 1)
    assert _states(journal_path)[theirs[0]] is payonce.IntentState.PENDING


def test_the_environment_key_is_never_sent_for_a_journal_s_only_account_not_named(
    make_client: MakeClient,
    sandbox: SandboxServer,
    journal_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The journal holds intents of acct_demo alone, but the key could be any account's.
    monkeypatch.setenv("PAYONCE_API_KEY", DEFAULT_API_KEY)
    keys = enqueue_pending(make_client(), 2)
    with Worker(journal=journal_path, base_url=sandbox.url) as worker:
        unnamed = worker.run_pass()
    assert (unnamed.sent, unnamed.not_driven, unnamed.pending) == (0, 1, 2)
    assert f"set PAYONCE_ACCOUNT={DEFAULT_ACCOUNT} (or --account" in caplog.text
    assert _states(journal_path) == dict.fromkeys(keys, payonce.IntentState.PENDING)
    assert sandbox.store.executions() == {}

    with Worker(journal=journal_path, base_url=sandbox.url, account=DEFAULT_ACCOUNT) as worker:
        named = worker.run_pass()
    assert (named.sent, named.not_driven) == (2, 0)
    assert sandbox.wait_idle()
    assert sandbox.store.executions() == dict.fromkeys(keys, 1)


def test_a_group_that_cannot_be_driven_is_said_once_not_every_pass(
    make_client: MakeClient,
    sandbox: SandboxServer,
    journal_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.delenv("PAYONCE_API_KEY", raising=False)
    keys = enqueue_pending(make_client(), 3)
    with Worker(journal=journal_path, base_url=sandbox.url) as worker:
        passes = [worker.run_pass() for _ in range(3)]

    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, caplog.text
    assert "not driven: no API key for account 'acct_demo'" in errors[0].getMessage()
    assert [(p.pending, p.not_driven, p.driven) for p in passes] == [(3, 1, 0)] * 3
    assert _states(journal_path) == dict.fromkeys(keys, payonce.IntentState.PENDING)


HOLDS = "the journal holds some of --provider sandbox --account acct_demo (2)"


@pytest.mark.parametrize(
    ("option", "code", "said"),
    [
        (["--provider", "nosuch"], 2, "--provider: unknown provider 'nosuch'"),
        (["--provider", "nosuch", "--account", "acct_demo"], 2, "unknown provider 'nosuch'"),
        (["--provider", "stripe"], 0, HOLDS),
        (["--account", "nosuch"], 0, HOLDS),
        (["--provider", "sandbox", "--account", "x"], 0, HOLDS),
    ],
)
def test_a_mistyped_provider_or_account_says_what_the_journal_holds(
    make_client: MakeClient,
    sandbox: SandboxServer,
    journal_path: Path,
    option: list[str],
    code: int,
    said: str,
) -> None:
    keys = enqueue_pending(make_client(), 2)

    result = run_cli_process(
        _worker_args(sandbox.url, journal_path, "--once", *option), env=KEY_ENV
    )

    assert result.exit_code == code, result.output
    assert said in result.stderr
    assert _states(journal_path) == dict.fromkeys(keys, payonce.IntentState.PENDING)
    assert sandbox.store.executions() == {}


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--concurrency", "0", "Invalid value for '--concurrency'"),
        ("--interval", "-1", "Invalid value for '--interval'"),
        ("--log-level", "loud", "Invalid value for '--log-level'"),
    ],
)
def test_a_bad_option_is_a_usage_error_and_nothing_is_sent(
    make_client: MakeClient,
    sandbox: SandboxServer,
    journal_path: Path,
    option: str,
    value: str,
    said: str,
) -> None:
    keys = enqueue_pending(make_client(), 2)

    result = run_cli(_worker_args(sandbox.url, journal_path, "--once", option, value), env=KEY_ENV)

    assert result.exit_code == 2
    assert said in result.stderr
    assert _states(journal_path) == dict.fromkeys(keys, payonce.IntentState.PENDING)
    assert sandbox.store.executions() == {}


def test_a_worker_of_no_concurrency_is_refused() -> None:
    with pytest.raises(payonce.ConfigurationError, match="concurrency must be"):
        Worker(journal=":memory:", base_url="https://psp.example", concurrency=0)


def test_intents_of_a_profile_this_process_does_not_know_are_said_and_the_rest_are_sent(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    # The service registered its own profile; the worker process was not told about it.
    acme = payonce.ProviderProfile(name="acme-payments")
    (foreign,) = enqueue_pending(make_client(provider=acme), 1, prefix="order-acme")
    keys = enqueue_pending(make_client(), 3)

    # Each provider its URL: a plain one would serve one of them only.
    acme_url = ("--base-url", f"acme-payments={sandbox.url}")
    args = _worker_args(f"sandbox={sandbox.url}", journal_path, "--once", *acme_url)
    result = run_cli_process(args, env=KEY_ENV)

    assert result.exit_code == 1
    assert "provider 'acme-payments' not driven: unknown provider 'acme-payments'" in (
        result.stderr
    )
    assert (
        "3 sent, 3 settled, 1 still pending, 0 still unknown, 0 escalated, 0 failed, "
        "1 account(s) not driven" in result.stderr
    )
    assert sandbox.wait_idle()
    assert sandbox.store.executions() == dict.fromkeys(keys, 1)
    assert _states(journal_path)[foreign] is payonce.IntentState.PENDING


@pytest.mark.slow
def test_two_workers_at_once_on_one_sqlite_journal_send_each_intent_once(
    make_client: MakeClient,
    sandbox: SandboxServer,
    journal_path: Path,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    keys = enqueue_pending(make_client(), 40)
    sandbox.set_faults(Faults(seed=7, fail_before_rate=0.1, retry_after_seconds=0))

    workers = [
        start_worker(sandbox.url, journal_path, "--once", "--concurrency", "3") for _ in range(2)
    ]
    codes = [worker.ended(timeout=120) for worker in workers]

    assert codes == [0, 0], [w.stderr for w in workers]
    assert sandbox.wait_idle()
    assert sandbox.store.executions() == dict.fromkeys(keys, 1)
    assert set(_states(journal_path).values()) == {payonce.IntentState.SUCCEEDED}


# -- draining ----------------------------------------------------------------------------------


class WorkerProcess:
    """``payonce worker`` as a process of its own; its stderr in a file (a pipe no one
    reads would fill, and stall it)."""

    def __init__(
        self, log: Path, url: str, journal: str | Path, *more: str, crash_at: str = ""
    ) -> None:
        self.log = log
        with log.open("w") as stderr:
            self.process = subprocess.Popen(
                [*PYTHON_M_PAYONCE, *_worker_args(url, journal, *more)],
                # PAYONCE_CRASH_AT="point:visit": it SIGKILLs itself there (payonce._crash).
                env=python_env(**KEY_ENV, PAYONCE_CRASH_AT=crash_at),
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )

    def ended(self, timeout: float = 60) -> int:
        return self.process.wait(timeout=timeout)

    @property
    def stderr(self) -> str:
        return self.log.read_text()


@pytest.fixture
def start_worker(tmp_path: Path, closing: contextlib.ExitStack) -> Callable[..., WorkerProcess]:
    """Starts worker processes; any still running at the end is killed and reaped."""
    started: list[WorkerProcess] = []

    def start(url: str, journal: str | Path, *more: str, crash_at: str = "") -> WorkerProcess:
        log = tmp_path / f"worker-{len(started)}.log"
        worker = WorkerProcess(log, url, journal, *more, crash_at=crash_at)
        started.append(worker)
        return worker

    def reap() -> None:
        for worker in started:
            if worker.process.poll() is None:
                worker.process.kill()
            worker.process.wait()

    closing.callback(reap)
    return start


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_pass_drains_the_worker_holding_nothing_and_exits_0(
    make_client: MakeClient,
    make_sandbox: Callable[..., SandboxServer],
    journal_path: Path,
    start_worker: Callable[..., WorkerProcess],
    sig: signal.Signals,
) -> None:
    slow = make_sandbox(processing_seconds=0.2)  # a pass of 40 takes 4 s at 2 at once
    keys = enqueue_pending(make_client(base_url=slow.url), 40)
    worker = start_worker(slow.url, journal_path, "--concurrency", "2", "--interval", "60")
    _wait_for(lambda: len(slow.store.executions()) >= 4, "four payments executed")

    worker.process.send_signal(sig)
    code = worker.ended(timeout=30)

    assert code == 0, worker.stderr
    assert f"{sig.name}: draining" in worker.stderr
    # Ctrl-C can be pressed again; systemd's SIGTERM is not followed by a second one.
    assert ("Ctrl-C again" in worker.stderr) is (sig is signal.SIGINT)
    assert _held(journal_path) == []
    assert slow.wait_idle()
    states = _states(journal_path)
    executed = slow.store.executions()
    # What it had started, it finished; what it had not, it left for the next worker.
    assert all(count == 1 for count in executed.values())
    assert {k for k, s in states.items() if s is payonce.IntentState.SUCCEEDED} == set(executed)
    assert {k for k, s in states.items() if s is payonce.IntentState.PENDING} == (
        set(keys) - set(executed)
    )
    assert len(executed) < len(keys)


@pytest.mark.slow
def test_a_second_sigint_stops_at_once_leaving_the_payment_for_the_next_worker(
    make_client: MakeClient,
    make_sandbox: Callable[..., SandboxServer],
    journal_path: Path,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    slow = make_sandbox()
    (key,) = enqueue_pending(make_client(base_url=slow.url), 1)
    # The worker's payment stays at the provider until the worker has stopped.
    with slow.holding():
        worker = start_worker(slow.url, journal_path, "--interval", "60")

        def sending() -> bool:
            with payonce.open_journal(journal_path) as journal:
                return len(journal.attempts(key)) == 2  # the write-ahead's, then the worker's

        _wait_for(sending, "the worker sending the payment")
        assert slow.wait_held(1), "the worker's payment never reached the provider"

        worker.process.send_signal(signal.SIGINT)
        _wait_for(lambda: "SIGINT: draining" in worker.stderr, "the worker draining")
        worker.process.send_signal(signal.SIGINT)

        assert worker.ended(timeout=30) == 130, worker.stderr
    assert "SIGINT again: stopping at once" in worker.stderr
    assert _states(journal_path) == {key: payonce.IntentState.PENDING}
    # Once the provider is done with the request the dead worker sent, the next worker
    # takes the intent at once (its owner is gone) and sends it again under its key.
    assert slow.wait_idle()
    result = run_cli_process(_worker_args(slow.url, journal_path, "--once"), env=KEY_ENV)
    assert result.exit_code == 0, result.output
    assert slow.wait_idle()
    assert slow.store.executions() == {key: 1}
    assert _states(journal_path) == {key: payonce.IntentState.SUCCEEDED}


def _opened_by(process: subprocess.Popen[bytes], path: Path) -> bool:
    """Whether the process holds ``path`` open: what it does first once it starts working."""
    try:
        fds = list(Path(f"/proc/{process.pid}/fd").iterdir())
    except FileNotFoundError:  # it has exited
        return True
    with contextlib.suppress(OSError):
        return any(fd.readlink() == path for fd in fds)
    return False


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/PID/fd")
@pytest.mark.slow
def test_sigterm_as_the_worker_starts_working_drains_it_and_exits_0(
    make_client: MakeClient,
    sandbox: SandboxServer,
    journal_path: Path,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """systemd or Kubernetes may stop a worker the moment it starts (a rollout undone): the
    signal drains it from its first instant, never kills it. The moment: when it first
    opens the journal, the first thing it does once its command runs."""
    keys = enqueue_pending(make_client(), 3)
    worker = start_worker(sandbox.url, journal_path.resolve(), "--interval", "60")
    _wait_for(lambda: _opened_by(worker.process, journal_path.resolve()), "the journal opened")

    worker.process.send_signal(signal.SIGTERM)
    code = worker.ended(timeout=30)

    assert code == 0, worker.stderr
    assert "SIGTERM: draining" in worker.stderr
    assert _held(journal_path) == []
    assert _states(journal_path) == dict.fromkeys(keys, payonce.IntentState.PENDING)
    assert sandbox.store.executions() == {}


# -- a journal not created yet -----------------------------------------------------------------


@pytest.mark.slow
def test_a_worker_started_before_the_journal_exists_waits_for_it_then_sends(
    make_client: MakeClient,
    sandbox: SandboxServer,
    postgres_url: str,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """Deployments start the worker beside the service, or before it: on a fresh database
    the journal is not there until the service's first client opens it."""
    journal_url = f"{postgres_url}?schema=shop"
    worker = start_worker(sandbox.url, journal_url, "--interval", "0.5")
    _wait_for(lambda: "not a payonce journal yet" in worker.stderr, "the worker waiting")
    assert worker.process.poll() is None, worker.stderr

    keys = enqueue_pending(make_client(journal=journal_url), 2)  # the service starts
    _wait_for(lambda: sandbox.store.executions() == dict.fromkeys(keys, 1), "both sent")
    worker.process.send_signal(signal.SIGTERM)

    assert worker.ended(timeout=30) == 0, worker.stderr
    assert worker.stderr.count("not a payonce journal yet") == 1  # said once, not every look
    assert _states(journal_url) == dict.fromkeys(keys, payonce.IntentState.SUCCEEDED)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["sqlite", "postgres"])
def test_sigterm_while_waiting_for_the_journal_exits_0_and_creates_nothing(
    where: str,
    sandbox: SandboxServer,
    postgres_url: str,
    tmp_path: Path,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    journal = tmp_path / "not-yet.db" if where == "sqlite" else f"{postgres_url}?schema=shop"
    worker = start_worker(sandbox.url, journal, "--interval", "60")
    _wait_for(lambda: "not a payonce journal yet" in worker.stderr, "the worker waiting")

    worker.process.send_signal(signal.SIGTERM)

    assert worker.ended(timeout=30) == 0, worker.stderr
    assert "SIGTERM: draining" in worker.stderr
    if where == "sqlite":
        assert list(tmp_path.glob("not-yet.db*")) == []
    else:
        with psycopg.connect(postgres_url) as connection:
            found = connection.execute(
                "SELECT 1 FROM pg_namespace WHERE nspname = 'shop'"
            ).fetchall()
        assert found == []


@pytest.mark.slow
def test_journal_init_creates_the_journal_once_and_keeps_what_it_holds(
    make_client: MakeClient, sandbox: SandboxServer, postgres_url: str, tmp_path: Path
) -> None:
    for journal in (str(tmp_path / "journal.db"), f"{postgres_url}?schema=shop"):
        created = run_cli(["journal", "init", "--journal", journal])
        assert created.exit_code == 0, created.output
        assert created.stdout.startswith("created the journal ")

        keys = enqueue_pending(make_client(journal=journal), 1)
        again = run_cli(["journal", "init", "--journal", journal])
        assert again.exit_code == 0, again.output
        assert "is a payonce journal already" in again.stdout
        assert "nothing to do" in again.stdout
        assert _states(journal) == dict.fromkeys(keys, payonce.IntentState.PENDING)

        sent = run_cli_process(_worker_args(sandbox.url, journal, "--once"), env=KEY_ENV)
        assert sent.exit_code == 0, sent.output
        assert _states(journal) == dict.fromkeys(keys, payonce.IntentState.SUCCEEDED)


def test_journal_init_in_a_directory_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    result = run_cli(["journal", "init", "--journal", str(tmp_path / "typo" / "journal.db")])

    assert result.exit_code == 2, result.output
    assert not (tmp_path / "typo").exists()


# -- the reconcile schedule, end to end --------------------------------------------------------


class Recorded(payonce.Hooks):
    def __init__(self) -> None:
        self.escalations: list[IntentEscalated] = []
        self.passes: list[WorkerPassEnded] = []

    def escalated(self, event: IntentEscalated) -> None:
        self.escalations.append(event)

    def worker_pass(self, event: WorkerPassEnded) -> None:
        self.passes.append(event)


class Clock:
    """The worker's time, moved by the test instead of slept through."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_an_intent_the_provider_cannot_tell_about_is_looked_up_on_schedule_then_escalated(
    make_client: MakeClient,
    sandbox: SandboxServer,
    journal_path: Path,
    caplog: pytest.LogCaptureFixture,
    telemetry: Telemetry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lost = make_unknown(make_client, sandbox, "order-lost", "drop_after")
    assert sandbox.wait_idle()
    monkeypatch.setenv("PAYONCE_API_KEY", DEFAULT_API_KEY)
    with payonce.open_journal(journal_path) as journal:
        went_unknown = journal.attempts(lost.key)[-1].ended_at
    assert went_unknown is not None
    # The worker's clock starts as the intent goes unknown, and moves only when told.
    recorded, clock = Recorded(), Clock(went_unknown)
    schedule = payonce.providers.get_profile("sandbox").reconcile_schedule  # 0.5, 1, 2: 3 tries
    one_try = payonce.RetryPolicy(max_attempts=1)

    # The provider's status endpoint is down for maintenance: no look-up can tell.
    with (
        pages_in_front_of(sandbox.url, [MAINTENANCE] * 100) as down,
        Worker(
            journal=journal_path,
            account=DEFAULT_ACCOUNT,  # whose key PAYONCE_API_KEY is
            base_url=down.url,
            hooks=[recorded, telemetry.hooks],
            retry=one_try,
            clock=clock,
        ) as worker,
        caplog.at_level(logging.INFO, logger="payonce.worker"),
    ):

        def looked_up() -> int:
            return 100 - len(down.pages)

        worker.run_pass()  # not due yet
        assert looked_up() == 0
        clock.advance(schedule.first_after + 0.01)
        worker.run_pass()
        assert looked_up() == 1
        clock.advance(schedule.interval - 0.25)
        worker.run_pass()  # the second one is not due yet
        assert looked_up() == 1
        clock.advance(0.3)
        worker.run_pass()
        clock.advance(schedule.interval * schedule.backoff + 0.05)
        worker.run_pass()  # the third and last: the schedule is spent
        assert looked_up() == 3
        assert [e.key for e in recorded.escalations] == [lost.key]
        clock.advance(3600)
        worker.run_pass()  # given up: never asked again, never said again
        assert looked_up() == 3
        with Worker(
            journal=journal_path,
            account=DEFAULT_ACCOUNT,
            base_url=down.url,
            hooks=recorded,
            clock=clock,
        ) as restarted:
            restarted.run_pass()  # a worker (re)started asks nothing, and says nothing again
        assert looked_up() == 3

    (escalation,) = recorded.escalations
    assert (escalation.tries, escalation.reference) == (3, "order-lost")
    assert "503" in escalation.reason
    assert [p.escalated for p in recorded.passes] == [0, 0, 0, 0, 1, 0, 0]
    assert {p.unknown for p in recorded.passes} == {1}
    said = [r.levelno for r in caplog.records if r.getMessage().startswith("worker pass:")]
    # A pass that did nothing and found nothing new to wait for is said only at DEBUG.
    assert said == [logging.INFO] * 5
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage().split(":")[0] for r in errors] == [f"intent {lost.key} escalated"]
    assert getattr(errors[0], "key", None) == lost.key
    assert telemetry.total("payonce.escalations") == 1
    assert telemetry.total("payonce.worker.intents", outcome="escalated") == 1
    assert telemetry.total("payonce.worker.intents", outcome="failed") == 3
    assert [value for _, value in telemetry.points("payonce.worker.unknown")] == [1]
    with payonce.open_journal(journal_path) as journal:
        assert journal.get(lost.key).state is payonce.IntentState.UNKNOWN  # type: ignore[union-attr]
        assert [r.outcome for r in journal.reconciliations(lost.key)] == ["error"] * 3
        (journaled,) = journal.escalations(lost.key)
        assert (journaled.tries, journaled.reason) == (3, escalation.reason)
    assert sandbox.store.executions() == {lost.key: 1}  # never resent

    # The provider answers again: the operator's reconcile settles it.
    with payonce.Client(
        base_url=sandbox.url, provider="sandbox", account="acct_demo", journal=journal_path
    ) as client:
        (found,) = client.reconcile(lost.key)
    assert found.after is payonce.IntentState.SUCCEEDED


def test_an_intent_dated_by_a_clock_since_set_back_is_looked_up_at_once_then_on_schedule(
    make_client: MakeClient,
    sandbox: SandboxServer,
    journal_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The host's clock was a day ahead when the payment went unknown, and was then set
    # right. A red-team's case: after the first look-up by the right clock, the worker
    # looked it up again on every pass and spent the schedule's tries in seconds.
    def day_ahead() -> float:
        return time.time() + 86_400

    lost = make_unknown(make_client, sandbox, "order-ahead", "drop_after", clock=day_ahead)
    assert sandbox.wait_idle()
    monkeypatch.setenv("PAYONCE_API_KEY", DEFAULT_API_KEY)
    schedule = payonce.providers.get_profile("sandbox").reconcile_schedule  # 0.5, 1, 2: 3 tries
    recorded, clock = Recorded(), Clock(time.time())

    with (
        pages_in_front_of(sandbox.url, [MAINTENANCE] * 100) as down,
        Worker(
            journal=journal_path,
            account=DEFAULT_ACCOUNT,  # whose key PAYONCE_API_KEY is
            base_url=down.url,
            hooks=recorded,
            retry=payonce.RetryPolicy(max_attempts=1),
            clock=clock,
        ) as worker,
    ):

        def looked_up() -> int:
            return 100 - len(down.pages)

        worker.run_pass()  # dated a day ahead: asked at once, not a day later
        assert looked_up() == 1
        for _ in range(5):
            clock.advance(0.1)
            worker.run_pass()  # then on the schedule, from the look-up this clock made
        assert looked_up() == 1
        clock.advance(schedule.interval)
        worker.run_pass()
        assert looked_up() == 2
        assert recorded.escalations == []
    with payonce.open_journal(journal_path) as journal:
        assert journal.get(lost.key).state is payonce.IntentState.UNKNOWN  # type: ignore[union-attr]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_an_escalation_is_said_by_one_worker_process_once_not_again_by_the_next(
    make_client: MakeClient, sandbox: SandboxServer, location: str
) -> None:
    # A restarted worker said every escalation again (its hooks fired, its ERROR lines
    # repeated): each was said once per process. Now the journal keeps it, also where
    # several hosts share it (PostgreSQL).
    lost = make_unknown(make_client, sandbox, "order-given-up", "drop_after", journal=location)
    assert sandbox.wait_idle()
    schedule = payonce.providers.get_profile("sandbox").reconcile_schedule
    with pages_in_front_of(sandbox.url, [MAINTENANCE] * 20) as down:
        operator = make_client(base_url=down.url, journal=location)
        for _ in range(schedule.max_tries):  # the provider cannot tell: the schedule is spent
            operator.reconcile(lost.key)
        first = run_cli_process(_worker_args(down.url, location, "--once"), env=KEY_ENV)
        second = run_cli_process(_worker_args(down.url, location, "--once"), env=KEY_ENV)

    said = f"intent {lost.key} escalated"
    assert (first.exit_code, second.exit_code) == (1, 1), first.output + second.output
    assert said in first.stderr
    assert "1 still unknown, 1 escalated" in first.stderr
    assert said not in second.stderr
    assert "1 still unknown, 0 escalated" in second.stderr
    with payonce.open_journal(location) as journal:
        (escalation,) = journal.escalations(lost.key)
        assert escalation.tries == schedule.max_tries
        assert len(journal.reconciliations(lost.key)) == schedule.max_tries  # none since
    shown = run_cli(["intents", "show", lost.key, "--json", "--journal", location])
    assert [e["tries"] for e in json.loads(shown.stdout)[0]["escalations"]] == [3]


@pytest.mark.slow
def test_an_intent_reconciled_as_never_sent_is_sent_in_the_same_pass(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    # 503 before executing, on every attempt: unknown to payonce, yet nothing was executed.
    lost = make_unknown(make_client, sandbox, "order-unsent", "fail_before", "fail_before")
    assert sandbox.store.executions() == {}
    time.sleep(payonce.providers.get_profile("sandbox").reconcile_schedule.first_after)

    result = run_cli_process(_worker_args(sandbox.url, journal_path, "--once"), env=KEY_ENV)

    assert result.exit_code == 0, result.output
    assert sandbox.wait_idle()
    assert sandbox.store.executions() == {lost.key: 1}
    assert _states(journal_path) == {lost.key: payonce.IntentState.SUCCEEDED}
    assert (
        "1 sent, 1 settled, 0 still pending, 0 still unknown, 0 escalated, 0 failed"
        in result.stderr
    )


def test_an_intent_a_failing_provider_keeps_sending_back_is_escalated_after_the_give_up_time(
    make_client: MakeClient,
    make_sandbox: Callable[..., SandboxServer],
    journal_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every request is refused with a 503 before it is executed: each send goes unknown,
    # each look-up finds it never executed and sends it back to pending, to be sent again.
    failing = make_sandbox(faults=Faults(fail_before_rate=1.0, retry_after_seconds=0))
    (key,) = enqueue_pending(make_client(base_url=failing.url), 1)
    monkeypatch.setenv("PAYONCE_API_KEY", DEFAULT_API_KEY)
    schedule = payonce.providers.get_profile("sandbox").reconcile_schedule  # gives up: 60 s
    recorded, clock = Recorded(), Clock(time.time())
    one_try = payonce.RetryPolicy(max_attempts=1)

    with Worker(
        journal=journal_path,
        account=DEFAULT_ACCOUNT,
        base_url=failing.url,
        hooks=recorded,
        retry=one_try,
        clock=clock,
    ) as worker:
        worker.run_pass()
        assert _states(journal_path) == {key: payonce.IntentState.UNKNOWN}
        for _ in range(int(schedule.give_up_after / schedule.first_after) + 10):
            clock.advance(schedule.first_after + 0.01)
            worker.run_pass()
        with payonce.open_journal(journal_path) as journal:
            attempts = len(journal.attempts(key))
        clock.advance(3600)
        worker.run_pass()  # given up: never sent again

    assert [e.key for e in recorded.escalations] == [key]
    assert _states(journal_path) == {key: payonce.IntentState.UNKNOWN}
    with payonce.open_journal(journal_path) as journal:
        assert len(journal.attempts(key)) == attempts
    assert failing.store.executions() == {}


OTEL_RUN = """
import json, sys
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

reader = InMemoryMetricReader()  # what an SDK configured by opentelemetry-instrument does
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
from payonce.cli import cli

try:
    cli(sys.argv[1:], prog_name="payonce")
except SystemExit as exit:
    code = exit.code
totals = {}
for resource in reader.get_metrics_data().resource_metrics:
    for scope in resource.scope_metrics:
        for metric in scope.metrics:
            for point in metric.data.data_points:
                outcome = dict(point.attributes or {}).get("payonce.outcome", "")
                name = f"{metric.name} {outcome}".strip()
                totals[name] = totals.get(name, 0) + getattr(point, "value", 0)
print(json.dumps(totals))
sys.exit(code)
"""


def test_otel_reports_the_pass_through_opentelemetrys_global_providers(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    enqueue_pending(make_client(), 3)

    arguments = _worker_args(sandbox.url, journal_path, "--once", "--otel")
    done = subprocess.run(
        [sys.executable, "-c", OTEL_RUN, *arguments],
        env=python_env(**KEY_ENV),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    totals = json.loads(done.stdout)
    assert totals["payonce.worker.intents sent"] == 3
    assert totals["payonce.worker.intents settled"] == 3
    assert totals["payonce.worker.unknown"] == 0
    assert totals["payonce.intents"] == 3  # the clients' own metrics, through the same hooks


# -- many workers, one PostgreSQL journal, faults, a death -------------------------------------


@pytest.mark.slow
def test_two_workers_and_a_killed_third_send_200_enqueued_intents_exactly_once(
    make_client: MakeClient,
    make_sandbox: Callable[..., SandboxServer],
    postgres_url: str,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    faulty = make_sandbox(
        faults=Faults(
            seed=18,
            fail_before_rate=0.05,
            fail_after_rate=0.05,
            drop_after_rate=0.05,
            rate_limit_rate=0.05,
            retry_after_seconds=0.05,
        )
    )
    # The outbox: the service enqueued 200 payments in its own transaction, sent nothing.
    client = make_client(base_url=faulty.url, journal=postgres_url)
    with psycopg.connect(postgres_url) as connection, connection.transaction():
        keys = [
            client.enqueue(
                "POST", "/v1/payments", reference=f"order-{n}", json=PAYMENT, connection=connection
            ).key
            for n in range(200)
        ]

    options = ("--concurrency", "4", "--interval", "0.2")
    workers = [start_worker(faulty.url, postgres_url, *options) for _ in range(2)]
    # The third is SIGKILLed mid-pass, at its 25th answer, before journaling it: the
    # provider executed that payment and the journal does not know; it and the intents
    # its other threads were sending stay leased by a dead process.
    doomed = start_worker(faulty.url, postgres_url, *options, crash_at="after_response:25")
    assert doomed.ended(timeout=120) == -signal.SIGKILL, doomed.stderr  # reaped: no zombie

    def settled() -> bool:
        states = _states(postgres_url).values()
        return all(s is payonce.IntentState.SUCCEEDED for s in states)

    _wait_for(settled, "every intent settled", timeout=240)
    for worker in workers:
        worker.process.send_signal(signal.SIGTERM)
    codes = [worker.ended(timeout=60) for worker in workers]

    assert codes == [0, 0], [w.stderr[-2000:] for w in workers]
    assert faulty.wait_idle()
    assert faulty.store.executions() == dict.fromkeys(keys, 1)
    assert _held(postgres_url) == []
