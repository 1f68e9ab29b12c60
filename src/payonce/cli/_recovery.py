"""``payonce resume`` and ``payonce reconcile``: after a crash, finish and settle intents.

Both drive the library's own batch runner (``Client.resume``, ``Client.reconcile``,
``Client.reconcile_all``): the same targets, the same isolation of each intent; the
command only shows the results as they come.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import attrs
import click
from rich.text import Text

import payonce

from ._common import (
    CliError,
    JournalLocation,
    NotFound,
    console,
    echo_json,
    existing_journal,
    existing_journal_target,
    iso,
    journal_option,
)
from ._recovery_views import Row, print_rows, progress, reconcile_row, resume_row, summary
from ._targets import BaseUrls, Target, choose, elsewhere, holdings, sent_origins

__all__ = ["Connection", "connection_options", "reconcile", "resume"]

_results_json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print a JSON array of results instead of a table; no progress bar, and the summary "
    "line goes to stderr.",
)


@attrs.frozen
class Connection:
    """Where the intents were sent, and the journal they are in: what clients are built from.
    ``provider`` and ``account`` are None when not given: then the journal says (``_targets``)."""

    base_url: tuple[str, ...]
    """``--base-url`` as given: parsed (and refused) only once the command's own arguments
    are known to be right, so that a usage error is reported first."""
    provider: str | None
    account: str | None
    journal: JournalLocation | None

    @property
    def urls(self) -> BaseUrls:
        return BaseUrls.parse(self.base_url)

    def targets(
        self, records: Callable[[payonce.Journal], payonce.journal.Intents], what: str
    ) -> tuple[list[Target], Counter[Target]]:
        """The groups to drive, and what every group holds of ``records``."""
        if not self.base_url:
            raise CliError(self.missing_base_url(records))
        urls = self.urls  # a bad --base-url before the journal
        with existing_journal(self.journal, read_only=True) as journal:
            held = holdings(records(journal))
        return choose(held, self.provider, self.account, what=what, urls=urls), held

    def missing_base_url(
        self, records: Callable[[payonce.Journal], list[payonce.IntentRecord]]
    ) -> str:
        """ "--base-url is required", with all the journal tells of what a run needs, so
        that the next run is the one that works: where each provider's intents were sent
        (the origin: the journal keeps each request's URL, whose path a resend keeps), and
        which accounts have no API key here, with how to give each its key."""
        plain = "--base-url is required (or PAYONCE_BASE_URL)"
        try:
            with existing_journal(self.journal, read_only=True) as journal:
                sent = [
                    record
                    for record in records(journal)
                    if self.provider in (None, record.provider)
                    and self.account in (None, record.account)
                ]
        except (payonce.PayonceError, CliError, OSError):
            return plain  # the journal's own error comes once a base URL is given
        origins = sent_origins(sent)
        if not origins:
            return plain
        where = "; ".join(
            f"provider {provider!r} at {', '.join(sorted(urls))}"
            for provider, urls in origins.items()
        )
        if all(len(urls) == 1 for urls in origins.values()):
            given = (
                [next(iter(urls)) for urls in origins.values()]
                if len(origins) == 1
                else [f"{provider}={next(iter(urls))}" for provider, urls in origins.items()]
            )
            add = " ".join(f"--base-url {url}" for url in given)
            fix = (
                f"add {add} (or the API root the provider answers at now, with its path if "
                "it has one)"
            )
        else:
            fix = (
                "give the API root you send them to, e.g. --base-url PROVIDER=https://host"
                "[/path] (a failover endpoint works too: the journaled path is sent there)"
            )
        return f"{plain}. The journal says these intents were sent to {where}: {fix}" + (
            _keyless(sorted({record.account for record in sent}), named=self.account)
        )

    def unknown_waiting(self, reported: Iterable[str]) -> int:
        """How many unknown intents of the options' provider and account (every one, without
        them) the journal holds besides the ``reported`` keys."""
        reported = set(reported)
        unknown = [payonce.IntentState.UNKNOWN]
        with existing_journal(self.journal, read_only=True) as journal:
            records = journal.list_intents(states=unknown)
        return sum(
            record.key not in reported
            and self.provider in (None, record.provider)
            and self.account in (None, record.account)
            for record in records
        )

    def unheard(self, rows: Sequence[Row]) -> int:
        """How many of the intents these rows settled no application has acknowledged: the
        code that made them died before it heard (and recorded) their outcome."""
        settled = {row.key for row in rows if row.category == "settled"}
        if not settled:
            return 0
        with existing_journal(self.journal, read_only=True) as journal:
            return sum(record.key in settled for record in journal.unacknowledged())

    def held_by_live_workers(self, reported: Iterable[str]) -> list[payonce.IntentRecord]:
        """The pending intents of the options' provider and account (every one, without
        them) besides the ``reported`` keys that a live worker's lease still holds: resume
        skips them (their worker may be sending them right now)."""
        reported = set(reported)
        pending = [payonce.IntentState.PENDING]
        with existing_journal(self.journal, read_only=True) as journal:
            records = journal.list_intents(states=pending)
            now = journal.now()  # leases are dated by the journal's clock
        return [
            record
            for record in records
            if record.key not in reported
            and self.provider in (None, record.provider)
            and self.account in (None, record.account)
            and record.lease_owner is not None
            and (record.lease_expires_at or 0.0) > now
            and not payonce.journal.owner_is_dead(record.lease_owner)
        ]

    @contextmanager
    def client(self, target: Target, base_url: str) -> Iterator[payonce.Client]:
        journal = existing_journal_target(self.journal)  # never create one to resume from
        # PAYONCE_API_KEY only for the account named with --account (PAYONCE_ACCOUNT); else
        # the account's key in the keyring: whose key the variable holds is never guessed.
        # Each intent is sent (and looked up) only with the key of its own fingerprint.
        api_key = payonce.credentials.recovery_api_key(
            target.account, named=self.account, wanted=self._credentials_wanted(target)
        )
        with payonce.Client(
            base_url=base_url,
            provider=target.provider,
            account=target.account,
            api_key=api_key,
            journal=journal,
        ) as client:
            yield client

    def _credentials_wanted(self, target: Target) -> list[str | None]:
        """The credential fingerprints the group's pending and unknown intents journaled."""
        waiting = [payonce.IntentState.PENDING, payonce.IntentState.UNKNOWN]
        with existing_journal(self.journal, read_only=True) as journal:
            records = journal.list_intents(states=waiting)
        return [
            r.credential
            for r in records
            if r.provider == target.provider and r.account == target.account
        ]

    def drive_each(
        self, targets: Sequence[Target], drive: Callable[[payonce.Client], list[Row]]
    ) -> tuple[list[Row], list[str]]:
        """Rows from every group, and why a group could not be driven (no API key for its
        account, a profile this process does not know). One group named by the options
        fails as before: the error, exit status 2."""
        rows: list[Row] = []
        undriven: list[str] = []
        urls = self.urls
        for target in targets:
            base_url = urls.of(target.provider)
            if base_url is None:
                if len(targets) == 1:
                    raise CliError(f"no --base-url for provider {target.provider!r}")
                undriven.append(
                    f"{target.label}: no base URL for it: add --base-url {target.provider}=URL"
                )
                continue
            try:
                with self.client(target, base_url) as client:
                    rows += drive(client)
            except payonce.ConfigurationError as exc:
                if len(targets) == 1:
                    raise
                undriven.append(f"{target.label}: {exc}")
        return rows, undriven


def _keyless(accounts: Sequence[str], *, named: str | None) -> str:
    """The end of the "--base-url is required" line when accounts to drive have no API
    key here: said now, not one run later."""
    keyless = []
    for account in accounts:
        try:
            payonce.credentials.recovery_api_key(account, named=named)
        except payonce.ConfigurationError:
            keyless.append(account)
    if not keyless:
        return ""
    if len(keyless) == 1:
        (account,) = keyless
        return (
            f"; and account {account!r} has no API key here: set PAYONCE_ACCOUNT={account} "
            f"alongside PAYONCE_API_KEY holding its key, or run `payonce keys set {account}`"
        )
    names = ", ".join(repr(account) for account in keyless)
    return (
        f"; and accounts {names} have no API key here: store each one's with `payonce keys "
        "set ACCOUNT`, or run once per account with PAYONCE_ACCOUNT=ACCOUNT alongside "
        "PAYONCE_API_KEY holding its key"
    )


def connection_options(command: Callable[..., None]) -> Callable[..., None]:
    """What a command that talks to the provider needs, handed over as one ``connection``.

    The API key is never an option: it comes from PAYONCE_API_KEY for the account named
    with --account (PAYONCE_ACCOUNT) only; every other account's from its
    entry in the OS keyring (``payonce keys set``): ``payonce.credentials.recovery_api_key``.
    """

    @functools.wraps(command)
    def with_connection(
        base_url: tuple[str, ...],
        provider: str,
        account: str,
        journal_path: JournalLocation | None,
        **rest: Any,
    ) -> None:
        command(connection=Connection(base_url, provider, account, journal_path), **rest)

    options = [
        click.option(
            "--base-url",
            envvar="PAYONCE_BASE_URL",
            show_envvar=True,
            multiple=True,
            help="The provider's API root, e.g. https://api.stripe.com; with intents of "
            "several providers, PROVIDER=URL for each (repeat the option).",
        ),
        click.option(
            "--provider",
            envvar="PAYONCE_PROVIDER",
            show_envvar=True,
            help="The provider profile the intents were sent with (stripe, adyen, mollie, "
            "square, sandbox, generic, or one your code registered). Default: every "
            "provider whose intents the journal holds, each at its --base-url PROVIDER=URL.",
        ),
        click.option(
            "--account",
            envvar="PAYONCE_ACCOUNT",
            show_envvar=True,
            help="The account whose intents to drive; also picks its key in the keyring. "
            "Default: every account with intents to drive.",
        ),
        journal_option,
    ]
    decorated: Callable[..., None] = with_connection
    for option in reversed(options):
        decorated = option(decorated)
    return decorated


def _show_progress(as_json: bool) -> bool:
    return not as_json and console().is_terminal


def _finish(
    rows: Sequence[Row],
    undriven: Sequence[str],
    *,
    verb: str,
    title: str,
    nothing: str,
    as_json: bool,
    waiting: str = "",
    unheard: int = 0,
) -> None:
    """Print the results, what could not be driven, and the summary line (``waiting`` at its
    end: what else waits for the operator), then once, last, how many settled intents no
    application heard of (``unheard``); exit 1 unless everything targeted is settled and
    nothing waits."""
    line = (summary(verb, rows) if rows else nothing) + waiting
    if as_json:
        echo_json([row.to_json() for row in rows])
        click.echo(line, err=True)  # stdout stays pure JSON
    else:
        out = console()
        if rows:
            print_rows(out, rows, title=title)
        if out.is_terminal:
            out.print(Text(line))
        else:
            click.echo(line, err=True)  # piped, stdout holds the records alone, as with --json
    for reason in undriven:
        click.echo(f"error: not driven: {reason}", err=True)
    if unheard:
        click.echo(_unheard(unheard), err=True)
    if undriven or waiting or any(row.needs_attention for row in rows):
        raise click.exceptions.Exit(1)


@click.command(short_help="Resend the pending intents dead workers left behind.")
@connection_options
@_results_json_option
def resume(connection: Connection, as_json: bool) -> None:
    """Finish the pending intents that crashed or killed workers left behind.

    Each pending intent of the account and provider that no live worker holds is resent
    with its journaled bytes under its own key: the provider executes it at most once. One
    that may have reached the provider longer ago than the provider keeps keys is not
    resent: it goes unknown, for `payonce reconcile`.

    Without --provider and --account, every account of every provider whose pending
    intents the journal holds, each provider at its --base-url PROVIDER=URL.

    Unknown intents are never resent: the summary says how many wait, and to run
    `payonce reconcile --all`.

    Pending intents a live worker's lease holds are skipped, and counted in the summary
    with the time the last lease runs out.

    Exits 0 when everything it targeted is settled and no unknown intent waits; 1 if an
    intent is still pending (the provider was unreachable, or refused the API key, or a
    live worker's lease holds it) or unknown (left unknown by this run or before it), or an
    account could not be driven (no API key, a profile this process does not know); 2 on a
    usage error.

    """
    pending = [payonce.IntentState.PENDING]
    targets, held = connection.targets(lambda j: j.list_intents(states=pending), "pending intents")

    def drive(client: payonce.Client) -> list[Row]:
        waiting = client.journal.pending(account=client.account, provider=client.provider.name)
        total = len(waiting) + len(waiting.damaged)  # each damaged row is a result too
        with progress(console(), "resuming", total, enabled=_show_progress(as_json)) as advance:
            results = client.resume(on_result=lambda _: advance())
        return [resume_row(result, client.journal) for result in results]

    rows, undriven = connection.drive_each(targets, drive)
    leased = connection.held_by_live_workers(row.key for row in rows)
    nothing = (
        f"nothing resumed of {_labels(targets)}"
        if leased or undriven
        else f"nothing to resume: no pending intent of {_labels(targets)}"
    )
    _finish(
        rows,
        undriven,
        verb="resumed",
        title=f"{len(rows)} resumed intent(s)",
        nothing=nothing + elsewhere(held, targets),
        as_json=as_json,
        waiting=_held_waiting(leased, rows)
        + _unknown_waiting(connection.unknown_waiting(row.key for row in rows), rows),
        unheard=connection.unheard(rows),
    )


def _unheard(count: int) -> str:
    """Settled here, but the application that made them never heard how: it has not
    recorded the outcome (an order still unpaid in its own database)."""
    intents = "intent is" if count == 1 else "intents are"
    return (
        f"note: {count} settled {intents} unacknowledged: the code that made "
        f"{'it' if count == 1 else 'them'} never heard the outcome. Run it again for the "
        "same reference (the outcome replays), or record it and `payonce ack KEY` (`ack --list`)"
    )


def _held_waiting(leased: Sequence[payonce.IntentRecord], rows: Sequence[Row]) -> str:
    """The end of resume's summary when live workers' leases kept it off pending intents
    (right after a failover, their settles lost with the old primary): they are not done,
    so "nothing to resume" would read as "all clear"."""
    if not leased:
        return ""
    last = iso(max(record.lease_expires_at or 0.0 for record in leased), precise=False)
    intents = "intent" if len(leased) == 1 else "intents"
    return (
        f"; {len(leased)} {'other ' if rows else ''}pending {intents} held by live workers "
        f"(leases until {last} at the latest), skipped: their workers may be sending them "
        f"now. Run `payonce resume` again after {last}"
    )


def _unknown_waiting(count: int, rows: Sequence[Row]) -> str:
    """The end of resume's summary when unknown intents it did not touch wait: resume never
    resends an unknown intent, so "0 still unknown" alone would read as "all clear"."""
    if not count:
        return ""
    intents = "intent waits" if count == 1 else "intents wait"
    return (
        f"; {count} {'other ' if rows else ''}unknown {intents} for reconciliation (resume "
        "never resends an unknown intent): run `payonce reconcile --all`, then `payonce resume`"
    )


def _labels(targets: Sequence[Target]) -> str:
    return ", ".join(target.label for target in targets) or "any account in the journal"


def _check_named(client: payonce.Client, key_or_reference: str) -> None:
    """Say why, when no intent of this account and provider has this key or reference."""
    found = client.journal.find(key_or_reference)
    mine = (client.account, client.provider.name)
    if any((r.account, r.provider) == mine for r in [*found, *found.damaged]):
        return  # a damaged row of theirs too: the pass names it
    if not found:
        raise NotFound(f"no intent with key or reference {key_or_reference!r}")
    others = ", ".join(sorted({f"--account {r.account} --provider {r.provider}" for r in found}))
    raise NotFound(
        f"no intent with key or reference {key_or_reference!r} for account "
        f"{client.account!r} and provider {client.provider.name!r}; it was sent with: {others}"
    )


@click.command(
    short_help="Ask the provider what became of unknown intents (or resend under their keys)."
)
@click.argument("key_or_reference", required=False)
@click.option(
    "--all", "every", is_flag=True, help="Every unknown intent of the account and provider."
)
@click.option(
    "--resend",
    is_flag=True,
    help="Where the provider profile has no status look-up and its key lifetime is assumed "
    "(square, generic): resend within 90% of that lifetime, not only within 15 minutes of "
    "the first send. You take the risk that the provider kept the key that long.",
)
@connection_options
@_results_json_option
def reconcile(
    key_or_reference: str | None,
    every: bool,
    resend: bool,
    connection: Connection,
    as_json: bool,
) -> None:
    """Ask the provider what became of unknown intents, instead of guessing; where it
    cannot be asked, this may resend the intent under the same key.

    Give one KEY_OR_REFERENCE, or --all for every unknown intent of the account and
    provider, oldest first. Per intent: the provider has it (settled: succeeded or
    failed); it has not and the key is still valid (back to pending: `payonce resume`
    sends it once); or it cannot tell (still unknown, with the reason: check by hand,
    then `payonce abandon`). Intents in other states are skipped.

    A provider profile without a status look-up (square, generic; adyen and mollie
    without one) cannot be asked: while the provider surely still remembers the key, the
    intent is resent under the same key, and the provider replays what it executed or
    executes it once (outcome `resent`). Where the key lifetime is assumed, not documented
    (square, generic), that is only within 15 minutes of the first send, unless --resend.

    Without --provider and --account: the groups the named intent belongs to, or for --all
    every account of every provider whose unknown intents the journal holds, each provider
    at its --base-url PROVIDER=URL.

    Exits 0 when everything it targeted is settled; 1 if an intent is still unknown, went
    back to pending (run `payonce resume`), or an account could not be driven; 2 on a
    usage error.
    """
    if (key_or_reference is None) == (not every):
        raise click.UsageError("give either one KEY_OR_REFERENCE or --all")
    show = every and _show_progress(as_json)
    if key_or_reference is not None:
        named = key_or_reference
        targets, held = connection.targets(lambda j: j.find(named), f"intents named {named!r}")
        if not targets:
            raise NotFound(f"no intent with key or reference {named!r}")
    else:
        unknown = [payonce.IntentState.UNKNOWN]
        targets, held = connection.targets(
            lambda j: j.list_intents(states=unknown), "unknown intents"
        )

    def drive(client: payonce.Client) -> list[Row]:
        if key_or_reference is not None:
            _check_named(client, key_or_reference)
            results = client.reconcile(key_or_reference, resend=resend)
        else:
            unknown = client.unknown()
            total = len(unknown) + len(unknown.damaged)
            with progress(console(), "reconciling", total, enabled=show) as advance:
                results = client.reconcile_all(resend=resend, on_result=lambda _: advance())
        return [reconcile_row(result) for result in results]

    rows, undriven = connection.drive_each(targets, drive)
    _finish(
        rows,
        undriven,
        verb="reconciled",
        title=f"{len(rows)} reconciled intent(s)",
        nothing=(
            f"nothing reconciled of {_labels(targets)}"
            if undriven
            else f"nothing to reconcile: no unknown intent of {_labels(targets)}"
            + elsewhere(held, targets)
        ),
        as_json=as_json,
        unheard=connection.unheard(rows),
    )
