"""``payonce abandon`` and ``payonce ack``: the operator's decisions about intents."""

from __future__ import annotations

import time
from collections.abc import Sequence

import click

import payonce

from ._common import (
    JournalLocation,
    NotFound,
    Refused,
    existing_journal,
    journal_option,
    shown,
)
from ._intent_views import print_intents

__all__ = ["abandon", "ack"]


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
    return f" (reference {shown(record.reference)})" if record.reference else ""


@click.command(short_help="Close a pending or unknown intent for good.")
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


@click.command(short_help="Acknowledge settled intents, or list those not acknowledged.")
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
    print_intents(
        records,
        as_json=as_json,
        nothing="no unacknowledged intents" + (f" of account {account}" if account else ""),
        title=f"{len(records)} settled intent(s) not acknowledged yet, oldest first",
    )
