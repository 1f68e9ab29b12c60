"""The ``payonce`` command: inspect and repair the journal, manage API keys in the OS
keyring, run the sandbox provider, run the demo.

A thin client of the public API (its formatting lives in ``payonce._cli``). It never prints
an API key and never takes one on the command line; it prints stored request and response
payloads only when asked to (``--body``).

Exit status: 0 when everything went well; 1 when something needs attention (not found, not
allowed in the intent's state, intents still unknown or unsent after ``resume`` or
``reconcile``, a damaged journal); 2 when the configuration, the journal or the command
line needs fixing.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable
from urllib.parse import urlsplit

import click
from rich.text import Text

import payonce

from ._cli._common import (
    JOURNAL_ENV,
    CliError,
    Damaged,
    JournalLocation,
    NotFound,
    Refused,
    echo_json,
    existing_journal,
    existing_journal_target,
    journal_option,
)
from ._cli._common import console as _console
from ._cli._intents import (
    STATES,
    attempt_json,
    intent_detail,
    intent_json,
    intents_table,
    payload_json,
    reconciliation_json,
)
from ._cli._prune import prune
from ._cli._recovery import (
    Row,
    progress,
    reconcile_row,
    resume_row,
    rows_table,
    summary,
    watching,
)
from ._cli._report import report_json, report_view
from ._cli._sandbox import demo, sandbox

__all__ = ["JOURNAL_ENV", "CliError", "NotFound", "Refused", "cli", "main"]

F = TypeVar("F", bound=Callable[..., Any])

_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
_results_json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print a JSON array of results instead of a table; no progress bar, and the summary "
    "line goes to stderr.",
)


class _Cli(click.Group):
    """Turns every ``PayonceError`` a command lets through into a ``CliError``."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except payonce.PayonceError as exc:
            # Journal and configuration problems are the user's to fix, not crashes.
            raise CliError(str(exc)) from exc


@click.group(cls=_Cli)
@click.version_option(payonce.__version__, prog_name="payonce")
def cli() -> None:
    """payonce: payments that take effect exactly once over an at-least-once network."""


# -- intents ----------------------------------------------------------------------------------


@cli.group()
def intents() -> None:
    """Inspect the intents in the journal."""


@intents.command("list")
@click.option(
    "--state",
    "states",
    type=click.Choice(STATES, case_sensitive=False),
    multiple=True,
    help=f"Only intents in this state (repeatable): {', '.join(STATES)}.",
)
@click.option("--limit", type=click.IntRange(min=1), help="At most this many intents.")
@journal_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array instead of a table.")
def list_intents(
    states: Sequence[str], limit: int | None, journal_path: JournalLocation | None, as_json: bool
) -> None:
    """List intents, newest first, with their leases and why unknown ones are unknown.

    Pending and unknown intents are highlighted: unknown ones need reconciliation.
    """
    wanted = [payonce.IntentState(s.lower()) for s in states] or None
    with existing_journal(journal_path, read_only=True) as journal:
        records = journal.list_intents(states=wanted, limit=limit)
    if as_json:
        echo_json([intent_json(r) for r in records])
        return
    console = _console()
    if not records:
        console.print("no intents" + (f" in state {', '.join(states)}" if states else ""))
        return
    console.print(intents_table(records, width=console.width))


@intents.command("show")
@click.argument("key_or_reference")
@journal_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option(
    "--body",
    "with_body",
    is_flag=True,
    help="Also print the stored request and response (headers and bodies).",
)
def show_intent(
    key_or_reference: str, journal_path: JournalLocation | None, as_json: bool, with_body: bool
) -> None:
    """Show the intent(s) with this key or reference, with their attempts."""
    with existing_journal(journal_path, read_only=True) as journal:
        records = journal.find(key_or_reference)
        attempts = {r.key: list(journal.attempts(r.key)) for r in records}
        reconciliations = {r.key: list(journal.reconciliations(r.key)) for r in records}
    if not records:
        raise NotFound(f"no intent with key or reference {key_or_reference!r}")
    if as_json:
        documents = []
        for record in records:
            document = intent_json(record)
            document["attempts"] = [attempt_json(a) for a in attempts[record.key]]
            document["reconciliations"] = [
                reconciliation_json(entry) for entry in reconciliations[record.key]
            ]
            if with_body:
                document |= payload_json(record)
            documents.append(document)
        echo_json(documents)
        return
    console = _console()
    for record in records:
        console.print(
            intent_detail(
                record, attempts[record.key], reconciliations[record.key], with_body=with_body
            )
        )


# -- after a crash: resume and reconcile ------------------------------------------------------


def _client_options(command: F) -> F:
    """What a command that talks to the provider needs. The API key is never an option:
    it comes from PAYONCE_API_KEY or the OS keyring (``payonce keys set``)."""
    options = [
        click.option(
            "--base-url",
            envvar="PAYONCE_BASE_URL",
            show_envvar=True,
            required=True,
            help="The provider's API root, e.g. https://api.stripe.com.",
        ),
        click.option(
            "--provider",
            envvar="PAYONCE_PROVIDER",
            show_envvar=True,
            default="generic",
            show_default=True,
            help="The provider profile the intents were sent with (stripe, adyen, mollie, "
            "sandbox, generic, or one your code registered).",
        ),
        click.option(
            "--account",
            envvar="PAYONCE_ACCOUNT",
            show_envvar=True,
            default="default",
            show_default=True,
            help="The account whose intents to drive; also picks its key in the keyring.",
        ),
        journal_option,
    ]
    for option in reversed(options):
        command = option(command)
    return command


@contextmanager
def _client(
    base_url: str, provider: str, account: str, journal_path: JournalLocation | None
) -> Iterator[payonce.Client]:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        # Not quoted back: whatever was pasted there by mistake may be a secret.
        raise CliError("--base-url must be an http(s) URL")
    journal = existing_journal_target(journal_path)  # never create one to resume from
    with payonce.Client(
        base_url=base_url, provider=provider, account=account, journal=journal
    ) as client:
        yield client


def _show_progress(as_json: bool) -> bool:
    return not as_json and _console().is_terminal


def _finish(rows: Sequence[Row], *, verb: str, title: str, nothing: str, as_json: bool) -> None:
    """Print the results and the summary line; exit 1 if an intent still needs attention."""
    line = summary(verb, rows) if rows else nothing
    if as_json:
        echo_json([row.to_json() for row in rows])
        click.echo(line, err=True)  # stdout stays pure JSON
    else:
        console = _console()
        if rows:
            console.print(rows_table(rows, title=title))
        console.print(Text(line))
    if any(row.needs_attention for row in rows):
        raise click.exceptions.Exit(1)


@cli.command(short_help="Resend the pending intents dead workers left behind.")
@_client_options
@_results_json_option
def resume(
    base_url: str,
    provider: str,
    account: str,
    journal_path: JournalLocation | None,
    as_json: bool,
) -> None:
    """Finish the pending intents that crashed or killed workers left behind.

    Each pending intent of the account and provider that no live worker holds is resent
    with its journaled bytes under its own key: the provider executes it at most once. One
    that may have reached the provider longer ago than the provider keeps keys is not
    resent: it goes unknown, for `payonce reconcile`.

    Exits 1 if an intent is still pending (the provider was unreachable) or unknown.
    """
    show = _show_progress(as_json)
    with _client(base_url, provider, account, journal_path) as client:
        journal, profile = client.journal, client.provider.name

        def pending() -> int:
            return len(journal.pending(account=client.account, provider=profile))

        total = pending()
        with (
            progress(_console(), "resuming", total, enabled=show) as update,
            watching(lambda: total - pending(), update, enabled=show),
        ):
            results = client.resume()
        rows = [resume_row(result, journal) for result in results]
    _finish(
        rows,
        verb="resumed",
        title=f"{len(rows)} resumed intent(s)",
        nothing=f"nothing to resume: no pending intent of account {account!r} "
        f"(provider {provider!r})",
        as_json=as_json,
    )


def _reconcile_one(client: payonce.Client, record: payonce.IntentRecord) -> list[Row]:
    """Reconcile one intent; a provider refusing the look-up stops only this one."""
    started = time.time()
    try:
        return [reconcile_row(result) for result in client.reconcile(record.key)]
    except payonce.IntentError as exc:
        journal = client.journal
        now = journal.get(record.key)
        # What the journal wrote down names no key, so the same cause groups in the summary.
        written = [e.detail for e in journal.reconciliations(record.key) if e.at >= started]
        detail = written[-1] if written else f"{type(exc).__name__}: {exc}"
        result = payonce.records.ReconcileResult(
            record.key,
            record.reference,
            record.state,
            now.state if now else record.state,
            "error",
            detail,
        )
        return [reconcile_row(result)]


def _reconcile_targets(
    client: payonce.Client, key_or_reference: str | None
) -> list[payonce.IntentRecord]:
    """Unknown intents of the client's account and provider (oldest first), or the named ones."""
    journal, profile = client.journal, client.provider.name

    def ours(record: payonce.IntentRecord) -> bool:
        return record.account == client.account and record.provider == profile

    if key_or_reference is None:
        unknown = journal.list_intents(states=[payonce.IntentState.UNKNOWN])
        return [record for record in reversed(unknown) if ours(record)]
    found = journal.find(key_or_reference)
    if not found:
        raise NotFound(f"no intent with key or reference {key_or_reference!r}")
    mine = [record for record in found if ours(record)]
    if not mine:
        others = ", ".join(
            sorted({f"--account {r.account} --provider {r.provider}" for r in found})
        )
        raise NotFound(
            f"no intent with key or reference {key_or_reference!r} for account "
            f"{client.account!r} and provider {profile!r}; it was sent with: {others}"
        )
    return mine


@cli.command(short_help="Ask the provider what became of unknown intents.")
@click.argument("key_or_reference", required=False)
@click.option(
    "--all", "every", is_flag=True, help="Every unknown intent of the account and provider."
)
@_client_options
@_results_json_option
def reconcile(
    key_or_reference: str | None,
    every: bool,
    base_url: str,
    provider: str,
    account: str,
    journal_path: JournalLocation | None,
    as_json: bool,
) -> None:
    """Ask the provider what became of unknown intents, instead of guessing.

    Give one KEY_OR_REFERENCE, or --all for every unknown intent of the account and
    provider, oldest first. Per intent: the provider has it (settled: succeeded or
    failed); it has not and the key is still valid (back to pending: `payonce resume`
    sends it once); or it cannot tell (still unknown, with the reason: check by hand,
    then `payonce abandon`). Intents in other states are skipped.

    Exits 1 if an intent is still unknown.
    """
    if (key_or_reference is None) == (not every):
        raise click.UsageError("give either one KEY_OR_REFERENCE or --all")
    show = every and _show_progress(as_json)
    rows: list[Row] = []
    with _client(base_url, provider, account, journal_path) as client:
        targets = _reconcile_targets(client, key_or_reference)
        with progress(_console(), "reconciling", len(targets), enabled=show) as update:
            for done, record in enumerate(targets, start=1):
                rows += _reconcile_one(client, record)
                update(done)
    _finish(
        rows,
        verb="reconciled",
        title=f"{len(rows)} reconciled intent(s)",
        nothing=f"nothing to reconcile: no unknown intent of account {account!r} "
        f"(provider {provider!r})",
        as_json=as_json,
    )


# -- operator decisions: abandon, acknowledge -------------------------------------------------


def _by_key(journal: payonce.Journal, key: str) -> payonce.IntentRecord:
    record = journal.get(key)
    if record is not None:
        return record
    named = journal.find(key)
    if named:
        keys = ", ".join(r.key for r in named)
        raise NotFound(f"{key!r} is a reference, not a key; its intent(s): {keys}")
    raise NotFound(f"no intent with key {key!r}")


def _reference(record: payonce.IntentRecord) -> str:
    return f" (reference {record.reference})" if record.reference else ""


@cli.command(short_help="Close a pending or unknown intent for good.")
@click.argument("key")
@click.option(
    "--reason",
    required=True,
    help="Why, kept in the journal with the intent: e.g. the ticket of the manual check.",
)
@journal_option
def abandon(key: str, reason: str, journal_path: JournalLocation | None) -> None:
    """Close a pending or unknown intent for good: kept, and never sent again.

    An operator's decision, once the payment has been checked at the provider by hand.
    Only pending and unknown intents can be abandoned: succeeded, failed and abandoned
    ones are final. Exits 1 if the intent is not there, is final, or is being sent.
    """
    reason = reason.strip()
    if not reason:
        raise click.BadParameter("must not be empty", param_hint="--reason")
    with existing_journal(journal_path) as journal:
        record = _by_key(journal, key)
        try:
            journal.abandon(key, reason=reason, now=time.time())
        except (payonce.IntentStateError, payonce.IntentInFlight) as exc:
            raise Refused(str(exc)) from exc
    click.echo(f"abandoned intent {key}{_reference(record)}: it will never be sent again")


@cli.command(short_help="Acknowledge settled intents, or list those not acknowledged.")
@click.argument("keys", nargs=-1)
@click.option(
    "--list", "listing", is_flag=True, help="List the settled intents not acknowledged yet."
)
@click.option("--account", help="With --list: only this account's intents.")
@journal_option
@click.option("--json", "as_json", is_flag=True, help="With --list: print a JSON array.")
def ack(
    keys: Sequence[str],
    listing: bool,
    account: str | None,
    journal_path: JournalLocation | None,
    as_json: bool,
) -> None:
    """Acknowledge settled intents: the caller has recorded their outcome.

    A succeeded or failed intent stays unacknowledged until the caller confirms it has
    recorded the outcome on its side (a client-side outbox): after a crash, `payonce ack
    --list` shows what it may have missed. Only succeeded and failed intents can be
    acknowledged. Exits 1 if a KEY is not there or not settled.
    """
    if listing == bool(keys):
        raise click.UsageError("give the KEYs to acknowledge, or --list")
    if not listing and (as_json or account is not None):
        raise click.UsageError("--json and --account go with --list")
    with existing_journal(journal_path) as journal:
        if listing:
            _list_unacknowledged(journal, account, as_json=as_json)
            return
        failed = False
        for key in keys:
            try:
                record = _by_key(journal, key)
                done = journal.acknowledge(key, now=time.time())
            except (NotFound, payonce.IntentStateError) as exc:
                click.echo(f"error: {exc}", err=True)
                failed = True
                continue
            already = record.acknowledged_at is not None
            click.echo(
                f"{'already acknowledged' if already else 'acknowledged'}: intent {key}"
                f"{_reference(done)}, {done.state.value}"
            )
    if failed:
        raise click.exceptions.Exit(1)


def _list_unacknowledged(journal: payonce.Journal, account: str | None, *, as_json: bool) -> None:
    records = journal.unacknowledged(account=account)
    if as_json:
        echo_json([intent_json(r) for r in records])
        return
    console = _console()
    if not records:
        console.print("no unacknowledged intents" + (f" of account {account}" if account else ""))
        return
    title = f"{len(records)} settled intent(s) not acknowledged yet, oldest first"
    console.print(intents_table(records, width=console.width, title=title))


# -- the journal itself -----------------------------------------------------------------------


@runtime_checkable
class _Checkable(Protocol):
    def check(self) -> payonce.journal.JournalReport: ...


@cli.group("journal")
def journal_group() -> None:
    """Check the journal's integrity and back it up."""


@journal_group.command("check")
@journal_option
@_json_option
def check_journal(journal_path: JournalLocation | None, as_json: bool) -> None:
    """Read the whole journal through and report its health and what it holds.

    Integrity, schema version, intents by state, unacknowledged intents, size on disk.
    Exits 1 if the journal is damaged.
    """
    with existing_journal(journal_path) as journal:
        if not isinstance(journal, _Checkable):
            raise CliError(f"the journal at {journal.location} cannot be checked by payonce")
        try:
            report = journal.check()
        except payonce.JournalBusy:
            raise
        except payonce.JournalError as exc:
            raise Damaged(f"the journal is damaged: {exc}") from exc
    if as_json:
        echo_json(report_json(report))
    else:
        _console().print(report_view(report))
    if not report.ok:
        raise click.exceptions.Exit(1)


def _is_postgres(location: JournalLocation | None) -> bool:
    return isinstance(location, str) and urlsplit(location).scheme in ("postgresql", "postgres")


_PG_DUMP = "back a PostgreSQL journal up with pg_dump (e.g. pg_dump -Fc -f payonce.dump DBNAME)"


@journal_group.command("backup")
@click.argument("destination", type=click.Path(path_type=Path))
@journal_option
def backup_journal(destination: Path, journal_path: JournalLocation | None) -> None:
    """Copy the SQLite journal to DESTINATION, a new file, while payonce keeps running.

    Through SQLite's backup API: the copy is consistent and holds every committed row,
    also those still only in the -wal file beside the journal (a copy of the .db file
    alone can miss them). DESTINATION must not exist: a backup never overwrites anything.
    """
    if _is_postgres(journal_path):
        raise CliError(_PG_DUMP)
    with existing_journal(journal_path) as journal:
        if not isinstance(journal, payonce.journal.SQLiteJournal):
            raise CliError(f"the journal at {journal.location} is not a SQLite file: {_PG_DUMP}")
        target = journal.backup(destination)
    size = target.stat().st_size
    click.echo(f"backed up {journal.location} to {target} ({size} bytes)")


# -- API keys in the OS keyring ---------------------------------------------------------------

_KEYS_NOTE = (
    "note: PAYONCE_API_KEY is set in this environment, and takes precedence over the "
    "keyring for every account"
)


def _note_environment_key() -> None:
    if os.environ.get("PAYONCE_API_KEY"):
        click.echo(_KEYS_NOTE, err=True)


@cli.group(short_help="Store, list and delete API keys in the OS keyring.")
def keys() -> None:
    """Manage the API keys payonce keeps in the OS keyring (service "payonce").

    A client without an explicit key uses PAYONCE_API_KEY if set, else its account's entry
    in the keyring. Backends that store nothing or would prompt are refused; a plaintext
    file (keyrings.alt) only with PAYONCE_ALLOW_PLAINTEXT_KEYRING=1.
    """


def _read_secret(account: str) -> str:
    stdin = sys.stdin
    if stdin is None:  # e.g. started by a service manager with no standard input at all
        raise CliError("no API key on standard input")
    if stdin.isatty():
        secret: str = click.prompt(
            f"API key for account {account}",
            hide_input=True,
            confirmation_prompt=True,
            err=True,
        )
        return secret.strip()
    lines = stdin.read().splitlines()
    if not lines or not lines[0].strip():
        raise CliError("no API key on standard input")
    if len(lines) > 1:
        raise CliError("standard input holds more than one line: give just the API key")
    return lines[0].strip()


@keys.command("set", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("account")
@click.pass_context
def set_key(ctx: click.Context, account: str) -> None:
    """Store (or replace) the API key of ACCOUNT in the OS keyring.

    The key is prompted for with hidden input, twice; when standard input is not a
    terminal it is read from there instead (echo "$KEY" | payonce keys set ACCOUNT). It is
    never taken from the command line, where shell history and ps would show it.
    """
    if ctx.args:
        # Not click's usual message: it would quote the arguments, perhaps a key.
        raise click.UsageError(
            "keys set takes only ACCOUNT: an API key is never accepted on the command line "
            "(shell history and ps would show it); it is prompted for, or read from stdin",
            ctx,
        )
    secret = _read_secret(account)
    where = payonce.credentials.store_api_key(account, secret)
    click.echo(f"stored the API key of account {account!r} in {where}")
    if "Plaintext" in where:
        click.echo("warning: that keyring is a plaintext file, as you opted in to", err=True)
    _note_environment_key()


@keys.command("delete")
@click.argument("account")
def delete_key(account: str) -> None:
    """Delete the API key of ACCOUNT from the OS keyring. Exits 1 if there is none."""
    if not payonce.credentials.delete_api_key(account):
        raise NotFound(f"no API key stored in the keyring for account {account!r}")
    click.echo(f"deleted the API key of account {account!r}")


@keys.command("list")
@_json_option
def list_keys(as_json: bool) -> None:
    """List the accounts with an API key stored by payonce: names only, never a key."""
    accounts = payonce.credentials.stored_accounts()
    if as_json:
        echo_json([{"account": account} for account in accounts])
    elif accounts:
        for account in accounts:
            click.echo(account)
    else:
        click.echo("no API keys stored by payonce in the keyring")
    _note_environment_key()


# -- the sandbox provider and the demo --------------------------------------------------------

cli.add_command(sandbox)
cli.add_command(demo)
cli.add_command(prune)


def main() -> None:
    """The ``payonce`` console script."""
    cli(prog_name="payonce")


if __name__ == "__main__":
    main()
