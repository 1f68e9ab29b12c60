"""``payonce worker``: send pending and reconcile unknown intents, pass after pass.

A thin shell around ``payonce.worker.Worker``: the options, the log lines, and the signals
that drain it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import click

import payonce
from payonce.hooks import Hooks
from payonce.providers import get_profile
from payonce.worker import Worker, WorkerPassEnded

from ._common import CliError, JournalLocation, existing_journal, existing_journal_target
from ._recovery import Connection, connection_options
from ._targets import Target, choose, elsewhere, holdings
from ._warnings import log_lines

__all__ = ["worker"]

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}

logger = logging.getLogger("payonce.worker")


class _Drain:
    """What SIGTERM and SIGINT ask for, from the worker command's first instant: before the
    journal is open (or exists), a signal stops the start; once the ``Worker`` runs, it
    drains it."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.running: Worker | None = None

    def attach(self, running: Worker) -> None:
        self.running = running
        if self.requested.is_set():
            running.stop()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.requested.is_set() and signum == signal.SIGINT:
            # Ctrl-C twice: stop now, as a kill would, which payonce is built to survive.
            # Closing the clients under the threads still sending would be worse: their
            # attempts would end in errors of this process's making. The intents being
            # sent stay pending, for the next worker: at once on this host (their owner
            # is gone), once their leases expire elsewhere.
            logger.warning("SIGINT again: stopping at once; what was being sent stays pending")
            os._exit(130)
        # Only Ctrl-C is pressed twice: under systemd or Kubernetes, SIGTERM is followed by
        # SIGKILL once their own stop timeout is spent.
        logger.warning(
            "%s: draining: no new intent is taken; the ones being sent are finished%s",
            signal.Signals(signum).name,
            " (Ctrl-C again to stop at once)" if signum == signal.SIGINT else "",
        )
        self.requested.set()
        if self.running is not None:
            self.running.stop()


@contextlib.contextmanager
def _draining_on_signals() -> Iterator[_Drain]:
    """SIGTERM (systemd, Kubernetes) and SIGINT (Ctrl-C) drain the worker instead of
    killing it mid-intent; the handlers in place before come back afterwards."""
    drain = _Drain()
    previous = {sig: signal.signal(sig, drain) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield drain
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _otel_hooks() -> list[Hooks]:
    try:
        from payonce.otel import OpenTelemetryHooks
    except ImportError as exc:
        raise CliError(str(exc)) from None
    return [OpenTelemetryHooks()]


@click.command(short_help="Send pending and reconcile unknown intents, pass after pass.")
@connection_options
@click.option(
    "--once",
    is_flag=True,
    help="One pass, then exit (for cron): 0 when nothing is left unknown or unsent.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.0, max=86400.0),
    default=5.0,
    show_default=True,
    help="Seconds between the end of a pass and the start of the next.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1, max=256),
    default=4,
    show_default=True,
    help="How many intents are sent or looked up at once.",
)
@click.option(
    "--otel",
    is_flag=True,
    help="Spans and metrics through OpenTelemetry (payonce[otel]; configure the SDK, "
    "e.g. with `opentelemetry-instrument payonce worker --otel`).",
)
@click.option(
    "--log-level",
    type=click.Choice(sorted(_LEVELS)),
    default="warning",
    show_default=True,
    help="payonce's log lines on stderr from this level up; the pass lines are always "
    "shown, escalations are errors.",
)
def worker(
    connection: Connection,
    once: bool,
    interval: float,
    concurrency: int,
    otel: bool,
    log_level: str,
) -> None:
    """Send the pending intents and reconcile the unknown ones of a journal, pass after
    pass, until SIGTERM or SIGINT.

    Each pass, for every provider and account whose intents the journal holds (or the
    --provider and --account given), each provider at its --base-url PROVIDER=URL (one
    plain URL serves one provider), each account's API key from PAYONCE_API_KEY (only for
    the --account given, or PAYONCE_ACCOUNT: whose key it is is never guessed, one
    account's key is never sent for another's intents) or else the account's entry in the
    OS keyring:

    \b
    - looks up the unknown intents that are due on the provider profile's schedule
      (first look-up after a while, then at growing intervals); one whose schedule is
      spent stays unknown and is escalated: an ERROR line naming it, the `escalated`
      hook, the payonce.escalations metric;
    - sends the pending intents no live worker holds, --concurrency at once (the ones a
      look-up found unsent among them), as `payonce resume` does.

    Several workers, on one host or several sharing a PostgreSQL journal, share the work:
    leases keep any intent from being sent by two at once. One line per pass says what
    it did (sent, settled, still pending, still unknown, escalated, failed, accounts not
    driven). Each worker process escalates an intent once: N workers, up to N times.

    SIGTERM or SIGINT drains it, from its start on: no intent is taken after it, the ones
    being sent are finished and their leases given back, then it exits 0. A second SIGINT
    (Ctrl-C twice) stops it at once, exit status 130: what it was sending stays pending,
    for the next worker.

    A journal not created yet (a database without payonce's tables, no file yet) is waited
    for, said once, and looked for again every --interval: the service's first client
    creates it, or `payonce journal init`. The worker never creates it; with --once it is
    refused (exit status 2). So are an unknown --provider and one plain --base-url for
    work of several providers. Exit 2 as well
    when the first pass can drive no account at all (no API key: an account takes PAYONCE_API_KEY
    only when named with --account or PAYONCE_ACCOUNT). With --once:
    one pass, then exit 0 when no intent it drives is left unknown (escalated or not yet
    due) or unsent, 1 otherwise (or when an account could not be driven: no API key, no
    base URL of its own, or a pending or unknown row no longer decodes).

    A row that no longer decodes (`payonce journal check` names each) is skipped, never
    sent, and said on an ERROR line (again after an hour); the other intents go on.
    """
    # Before anything else: from here on SIGTERM drains (a worker stopped while it starts
    # exits 0, having taken nothing), rather than killing the process.
    with _draining_on_signals() as drain, log_lines(_LEVELS[log_level]):
        last = _work(drain, connection, once, interval, concurrency, otel)
    if once and last is not None and _left_over(last):
        raise click.exceptions.Exit(1)


def _work(
    drain: _Drain,
    connection: Connection,
    once: bool,
    interval: float,
    concurrency: int,
    otel: bool,
) -> WorkerPassEnded | None:
    """The worker's passes until drained; the last pass's counts (None: none was run)."""
    waiting = [payonce.IntentState.PENDING, payonce.IntentState.UNKNOWN]
    if not connection.base_url:
        raise CliError(connection.missing_base_url(lambda j: j.list_intents(states=waiting)))
    urls = connection.urls  # a bad --base-url before the journal
    if connection.provider is not None:
        try:
            get_profile(connection.provider)  # a mistyped name recovers nothing: say so now
        except payonce.ConfigurationError as exc:
            raise CliError(f"--provider: {exc}") from None
    held = _holdings_once_created(connection.journal, once, interval, drain)
    if held is None:
        logger.info("worker stopped while waiting for the journal: it took nothing")
        return None
    what = "pending or unknown intents"
    targets = choose(held, connection.provider, connection.account, what=what, urls=urls)
    hint = elsewhere(held, targets)
    if hint and not set(targets) & set(held):
        click.echo(f"warning: no {what} of the --provider/--account given{hint}", err=True)
    journal = existing_journal_target(connection.journal)
    hooks = _otel_hooks() if otel else []
    with Worker(
        journal=journal,
        base_url=urls.plain,
        base_urls=urls.by_provider,
        provider=connection.provider,
        account=connection.account,
        concurrency=concurrency,
        hooks=hooks,
    ) as running:
        drain.attach(running)
        if running.stopping:
            logger.info("worker stopped before its first pass: it took nothing")
            return None
        logger.info(
            "worker started (concurrency %d, %s)",
            concurrency,
            "one pass" if once else f"a pass every {interval:g} s",
        )
        first = running.run_pass()
        if first.not_driven and not first.driven:
            raise CliError("no account could be driven (said above): nothing is being recovered")
        last = running.run(interval=interval, start_after=interval) if not once else first
        if not once:
            logger.info("worker stopped: every intent it held is finished and released")
    return last


_LEAST_WAIT = 0.5
"""Seconds between two looks for a journal not created yet, whatever --interval says."""


def _holdings_once_created(
    location: JournalLocation | None, once: bool, interval: float, drain: _Drain
) -> Counter[Target] | None:
    """What the journal holds for the worker to drive, read-only, as `resume` reads it: a
    journal that does not exist is never created here (a PostgreSQL URL without its
    ?schema=, or a mistyped one). Without --once, one not created yet (no payonce tables
    in the database, no file yet where its directory is) is waited for, as deployments
    start the worker beside (or before) the service whose first client creates it; None
    when a signal stopped the wait."""
    waited = False
    while True:
        if once or not _not_created(location):
            with existing_journal(location, read_only=True) as existing:
                if once or existing.schema_version > 0:
                    waiting = [payonce.IntentState.PENDING, payonce.IntentState.UNKNOWN]
                    held = holdings(existing.list_intents(states=waiting))
                    if waited:
                        logger.warning("worker: the journal %s exists now", existing.location)
                    return held
                shown = existing.location
        else:
            shown = str(_file(location))
        if not waited:
            logger.warning(
                "worker: %s is not a payonce journal yet (no payonce tables): waiting for "
                "it, looking again every %g s. The service's first client creates it, or "
                "`payonce journal init`; if the service's journal is elsewhere (another "
                "?schema=, another path), stop this worker and give it that one",
                shown,
                max(interval, _LEAST_WAIT),
            )
            waited = True
        if drain.requested.wait(max(interval, _LEAST_WAIT)):
            return None


def _file(location: JournalLocation | None) -> Path:
    if isinstance(location, Path):
        return location.expanduser()
    return payonce.journal.default_journal_path()


def _not_created(location: JournalLocation | None) -> bool:
    """A journal file not there yet, where a client may create it: its directory exists
    (payonce never creates the directory of a path given: a missing one is a typo), or it
    is the default location, whose directory is created on demand."""
    if isinstance(location, str):
        return False  # a URL: the database says whether the journal is there
    path = _file(location)
    return not path.exists() and (location is None or path.parent.is_dir())


def _left_over(last: WorkerPassEnded) -> bool:
    # Not ``pending``: intents another live worker is sending right now count there.
    return bool(last.unknown or last.failed or last.not_driven or last.damaged)
