"""``payonce abandon`` and ``payonce ack``: the operator's decisions about intents."""

from __future__ import annotations

from collections.abc import Sequence

import click

import payonce

from ._common import (
    CliError,
    JournalLocation,
    NotFound,
    Refused,
    existing_journal,
    journal_option,
    say_damaged,
    shown,
)
from ._intent_views import print_intents

__all__ = ["abandon", "ack"]


def _one_intent(journal: payonce.Journal, key_or_reference: str) -> payonce.IntentRecord:
    """The intent with this key, or the one intent with this reference."""
    record = journal.get(key_or_reference)
    if record is not None:
        return record
    named = journal.find(key_or_reference)
    if len(named) == 1:
        return named[0]
    if not named:
        raise NotFound(f"no intent with key or reference {key_or_reference!r}")
    keys = "; ".join(f"{r.key} ({r.account}, {r.method} {shown(r.url)})" for r in named)
    raise CliError(
        f"reference {key_or_reference!r} names {len(named)} intents (one per account "
        f"and endpoint): give the key of the one you mean: {keys}"
    )


def _reference(record: payonce.IntentRecord) -> str:
    return f" (reference {shown(record.reference)})" if record.reference else ""


@click.command(short_help="Close a pending or unknown intent for good.")
@click.argument("key_or_reference")
@click.option(
    "--reason",
    required=True,
    help="Why, kept in the journal with the intent: e.g. the ticket of the manual check.",
)
@journal_option
def abandon(key_or_reference: str, reason: str, journal_path: JournalLocation | None) -> None:
    """Close a pending or unknown intent for good: kept, and never sent again.

    An operator's decision, once the payment has been checked at the provider by hand.
    KEY_OR_REFERENCE names one intent: a reference shared by several (one per account or
    endpoint) is refused with their keys. Only pending and unknown intents can be
    abandoned: succeeded, failed and abandoned ones are final. Exits 1 if the intent is
    not there, is final, or is being sent; 2 if the reference names several.
    """
    reason = reason.strip()
    if not reason:
        raise click.BadParameter("must not be empty", param_hint="--reason")
    with existing_journal(journal_path) as journal:
        record = _one_intent(journal, key_or_reference)
        try:
            journal.abandon(record.key, reason=reason, now=journal.now())
        except (payonce.IntentStateError, payonce.IntentInFlight) as exc:
            raise Refused(str(exc)) from exc
    click.echo(f"abandoned intent {record.key}{_reference(record)}: it will never be sent again")


@click.command(short_help="Acknowledge settled intents, or list those not acknowledged.")
@click.argument("keys_or_references", nargs=-1)
@click.option(
    "--list", "listing", is_flag=True, help="List the settled intents not acknowledged yet."
)
@click.option("--account", help="With --list: only this account's intents.")
@journal_option
@click.option("--json", "as_json", is_flag=True, help="With --list: print a JSON array.")
def ack(
    keys_or_references: Sequence[str],
    listing: bool,
    account: str | None,
    journal_path: JournalLocation | None,
    as_json: bool,
) -> None:
    """Acknowledge settled intents: the caller has recorded their outcome.

    A succeeded or failed intent stays unacknowledged until the caller confirms it has
    recorded the outcome on its side (a client-side outbox): after a crash, `payonce ack
    --list` shows what it may have missed. Only succeeded and failed intents can be
    acknowledged. Each of KEYS_OR_REFERENCES names one intent. Exits 1 if one is not there
    or not settled, 2 if a reference names several intents (their keys are listed).
    """
    if listing == bool(keys_or_references):
        raise click.UsageError("give the keys or references to acknowledge, or --list")
    if not listing and (as_json or account is not None):
        raise click.UsageError("--json and --account go with --list")
    if listing:
        with existing_journal(journal_path, read_only=True) as journal:
            _list_unacknowledged(journal, account, as_json=as_json)
        return
    with existing_journal(journal_path) as journal:
        worst = 0
        for named in keys_or_references:
            try:
                record = _one_intent(journal, named)
                done = journal.acknowledge(record.key, now=journal.now())
            except CliError as exc:
                click.echo(f"error: {exc.format_message()}", err=True)
                worst = max(worst, exc.exit_code)
                continue
            except payonce.IntentStateError as exc:
                click.echo(f"error: {exc}", err=True)
                worst = max(worst, 1)
                continue
            already = record.acknowledged_at is not None
            click.echo(
                f"{'already acknowledged' if already else 'acknowledged'}: intent {record.key}"
                f"{_reference(done)}, {done.state.value}"
            )
    if worst:
        raise click.exceptions.Exit(worst)


def _list_unacknowledged(journal: payonce.Journal, account: str | None, *, as_json: bool) -> None:
    records = journal.unacknowledged(account=account)
    print_intents(
        records,
        as_json=as_json,
        nothing="no unacknowledged intents" + (f" of account {account}" if account else ""),
        title=f"{len(records)} settled intent(s) not acknowledged yet, oldest first",
    )
    say_damaged(records.damaged)  # a settled outcome it may hide: named, exit 1
    if records.damaged:
        raise click.exceptions.Exit(1)
