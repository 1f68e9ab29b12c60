"""``payonce intents list`` and ``payonce intents show``: look into the journal."""

from __future__ import annotations

import time
from collections.abc import Sequence

import click

import payonce

from ._common import (
    JournalLocation,
    NotFound,
    console,
    echo_json,
    existing_journal,
    journal_option,
    say_damaged,
    shown,
)
from ._intent_views import (
    STATES,
    attempt_json,
    escalation_json,
    intent_json,
    payload_json,
    print_intent_detail,
    print_intents,
    reconciliation_json,
)
from ._leases import lease_status

__all__ = ["intents"]


@click.group()
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

    Pending and unknown intents are highlighted: unknown ones need reconciliation. A row
    that no longer decodes is left out of the list and named on stderr, with what is
    wrong; the command then exits 1 (`payonce journal check` lists every such row).
    """
    wanted = [payonce.IntentState(s.lower()) for s in states] or None
    with existing_journal(journal_path, read_only=True) as journal:
        records = journal.list_intents(states=wanted, limit=limit)
    nothing = "no intents" + (f" in state {', '.join(states)}" if states else "")
    if records.damaged and not records:
        nothing = "no intent that reads"
    print_intents(records, as_json=as_json, nothing=nothing)
    say_damaged(records.damaged)
    if records.damaged:
        raise click.exceptions.Exit(1)


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
    """Show the intent(s) with this key or reference, with their attempts.

    One whose row no longer decodes is named on stderr with what is wrong, and the command
    exits 1."""
    with existing_journal(journal_path, read_only=True) as journal:
        found = journal.find(key_or_reference)
        damaged = found.damaged
        # An intent of several steps is shown with its steps 2, 3… after it.
        steps = {r.key: journal.steps(r.key) for r in found}
        records = [each for r in found for each in (r, *steps[r.key])]
        position = {s.key: (n, r.key) for r in found for n, s in enumerate(steps[r.key], 2)}
        intents_of = {r.key: r for r in found}
        for record in found:
            if record.key not in position and (found_step := _intent_of_step(journal, record)):
                number, intent = found_step
                position[record.key] = (number, intent.key)
                intents_of[intent.key] = intent
        attempts = {r.key: list(journal.attempts(r.key)) for r in records}
        reconciliations = {r.key: list(journal.reconciliations(r.key)) for r in records}
        escalations = {r.key: list(journal.escalations(r.key)) for r in records}
    if not records and not damaged:
        raise NotFound(f"no intent with key or reference {key_or_reference!r}")
    try:
        _show(
            records,
            steps,
            position,
            intents_of,
            attempts,
            reconciliations,
            escalations,
            as_json=as_json,
            with_body=with_body,
        )
    finally:
        say_damaged(damaged)
    if damaged:
        raise click.exceptions.Exit(1)


def _show(
    records: list[payonce.IntentRecord],
    steps: dict[str, list[payonce.IntentRecord]],
    position: dict[str, tuple[int, str]],
    intents_of: dict[str, payonce.IntentRecord],
    attempts: dict[str, list[payonce.journal.AttemptRecord]],
    reconciliations: dict[str, list[payonce.journal.ReconciliationRecord]],
    escalations: dict[str, list[payonce.journal.EscalationRecord]],
    *,
    as_json: bool,
    with_body: bool,
) -> None:
    if not records:
        return
    if as_json:
        documents = []
        for record in records:
            document = intent_json(record)
            if record.key in position:
                document["step"], document["step_of"] = position[record.key]
            elif steps.get(record.key):
                document["steps"] = [s.key for s in steps[record.key]]
            lease = lease_status(record, time.time())
            document["attempts"] = [attempt_json(a, lease) for a in attempts[record.key]]
            document["reconciliations"] = [
                reconciliation_json(entry) for entry in reconciliations[record.key]
            ]
            document["escalations"] = [escalation_json(e) for e in escalations[record.key]]
            if with_body:
                document |= payload_json(record)
            documents.append(document)
        echo_json(documents)
        return
    out = console()
    for record in records:
        if record.key in position:
            number, of = position[record.key]
            reference = intents_of[of].reference
            named = f" (reference {shown(reference)})" if reference else ""
            out.print(f"step {number} of intent {shown(of)}{named}", markup=False)
        elif steps.get(record.key):
            out.print(f"intent of {len(steps[record.key]) + 1} steps", markup=False)
        print_intent_detail(
            out,
            record,
            attempts[record.key],
            reconciliations[record.key],
            with_body=with_body,
            escalations=escalations[record.key],
        )


def _intent_of_step(
    journal: payonce.Journal, record: payonce.IntentRecord
) -> tuple[int, payonce.IntentRecord] | None:
    """(its position, its intent) when ``record`` is step 2 or later of a block, found by
    its reference (``order-1#step2``) and confirmed by the intent's own list of steps."""
    named, marker, _ = (record.reference or "").rpartition("#step")
    if not marker or not named:
        return None
    for intent in journal.find(named):
        keys = [step.key for step in journal.steps(intent.key)]
        if record.key in keys:
            return keys.index(record.key) + 2, intent
    return None
