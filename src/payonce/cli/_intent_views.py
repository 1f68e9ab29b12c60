"""How intents look on the command line: JSON documents and rich tables."""

from __future__ import annotations

import base64
import contextlib
import json
import textwrap
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import click
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

import payonce

from ._common import console, echo_json, iso, redacted, shown
from ._leases import LeaseStatus, interrupted_verdict, lease_status, lease_text, short_lease
from ._tables import field_name, print_table

__all__ = [
    "STATES",
    "attempt_json",
    "escalation_json",
    "intent_json",
    "payload_json",
    "print_intent_detail",
    "print_intents",
    "reconciliation_json",
    "request_target",
    "state_text",
]

STATES = tuple(state.value for state in payonce.IntentState)

# Rows of intents that need an operator's eye stand out; the rest only colour their state.
_ROW_STYLES = {payonce.IntentState.PENDING: "yellow", payonce.IntentState.UNKNOWN: "bold red"}
_STATE_STYLES = {
    payonce.IntentState.PENDING: "yellow",
    payonce.IntentState.SUCCEEDED: "green",
    payonce.IntentState.FAILED: "magenta",
    payonce.IntentState.UNKNOWN: "bold red",
    payonce.IntentState.ABANDONED: "dim",
}

_WIDE_TABLE = 120
"""Below this console width, intents are listed on several lines each."""


def state_text(state: payonce.IntentState) -> Text:
    return Text(state.value, style=_STATE_STYLES.get(state, ""))


def request_target(record: payonce.IntentRecord) -> str:
    parts = urlsplit(record.url)
    target = f"{parts.path}?{parts.query}" if parts.query else parts.path
    return f"{record.method} {target}"


def _decoded(data: bytes) -> dict[str, str]:
    try:
        return {"body": data.decode("utf-8"), "body_encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"body": base64.b64encode(data).decode("ascii"), "body_encoding": "base64"}


# -- JSON -------------------------------------------------------------------------------------


def intent_json(record: payonce.IntentRecord) -> dict[str, Any]:
    return {
        "key": record.key,
        "reference": record.reference,
        "state": record.state.value,
        "scope": record.scope,
        "account": record.account,
        "provider": record.provider,
        "method": record.method,
        "url": redacted(record.url),
        "path": urlsplit(record.url).path,
        "fingerprint": record.fingerprint,
        "credential": record.credential,
        "account_scope": record.account_scope,
        "attempt_count": record.attempt_count,
        "created_at": iso(record.created_at),
        "updated_at": iso(record.updated_at),
        "first_sent_at": iso(record.first_sent_at),
        "lease_owner": record.lease_owner,
        "lease_expires_at": iso(record.lease_expires_at),
        "lease_status": lease_status(record, time.time()),
        "unknown_reason": record.unknown_reason,
        "abandon_reason": record.abandon_reason,
        "key_per_call": record.key_per_call,
        "enqueued": record.enqueued,
        "response_status": record.response.status if record.response else None,
        "acknowledged_at": iso(record.acknowledged_at),
    }


def attempt_json(
    attempt: payonce.journal.AttemptRecord, lease: LeaseStatus | None
) -> dict[str, Any]:
    """``lease``: the intent's ``lease_status``. An attempt that never ended is ``in_flight``
    only while a live worker holds the lease; otherwise it was ``interrupted``."""
    interrupted = attempt.in_flight and lease != "held"
    return {
        "number": attempt.number,
        "started_at": iso(attempt.started_at),
        "ended_at": iso(attempt.ended_at),
        "status_code": attempt.status_code,
        "error": attempt.error,
        "ambiguous": attempt.ambiguous,
        "in_flight": attempt.in_flight and not interrupted,
        "interrupted": interrupted,
        "sent_to": None if attempt.sent_to is None else redacted(attempt.sent_to),
    }


def escalation_json(entry: payonce.journal.EscalationRecord) -> dict[str, Any]:
    return {
        "at": iso(entry.at),
        "unknown_since": iso(entry.unknown_since),
        "tries": entry.tries,
        "reason": entry.reason,
    }


def reconciliation_json(entry: payonce.journal.ReconciliationRecord) -> dict[str, Any]:
    return {
        "at": iso(entry.at),
        "outcome": entry.outcome,
        "detail": entry.detail,
        "status_code": entry.status_code,
    }


def payload_json(record: payonce.IntentRecord) -> dict[str, Any]:
    request = {"headers": [list(pair) for pair in record.request_headers], **_decoded(record.body)}
    response: dict[str, Any] | None = None
    if record.response is not None:
        stored = record.response
        response = {
            "status": stored.status,
            "headers": [list(pair) for pair in stored.headers],
            "body_stored": stored.body_stored,
            **_decoded(stored.body),
        }
    return {"request": request, "response": response}


# -- the list ---------------------------------------------------------------------------------


def print_intents(
    records: Sequence[payonce.IntentRecord],
    *,
    as_json: bool,
    nothing: str,
    title: str | None = None,
) -> None:
    """A listing of intents: a JSON array, a table, plain lines when piped, or the line
    ``nothing`` if there are none (on stderr when piped: stdout holds records alone)."""
    if as_json:
        echo_json([intent_json(r) for r in records])
        return
    out = console()
    if not records:
        if out.is_terminal:
            out.print(Text(nothing))
        else:
            click.echo(nothing, err=True)
        return
    now = time.time()
    title = title or f"{len(records)} intent(s), newest first"
    # A lease's owner is a long word: shown whole where it fits, else only the lease's state.
    layouts = [_compact_table(records, now, title)]
    if out.width >= _WIDE_TABLE:
        layouts[:0] = [_wide_table(records, now, title, owners=owners) for owners in (True, False)]
    print_table(out, layouts, fields=_wide_table(records, now, title, every_field=True))


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)


def _wide_table(
    records: Sequence[payonce.IntentRecord],
    now: float,
    title: str,
    *,
    every_field: bool = False,
    owners: bool = True,
) -> Table:
    """One line per intent on a wide terminal; ``every_field``: the same fields for every
    listing (the provider too), for pipes and for a terminal too narrow for a table;
    ``owners``: the lease with its owner's whole name, else only until when it holds."""
    with_lease = every_field or any(r.lease_owner for r in records)
    with_reason = every_field or any(r.unknown_reason for r in records)
    table = _table(title)
    table.add_column("key", no_wrap=True)
    table.add_column("reference", overflow="fold")
    table.add_column("state", no_wrap=True)
    # Always the account: recovering it needs its name (its key, `--account`), and an
    # account nobody chose (a client built without account=) is 'default'.
    table.add_column("account", overflow="fold")
    if every_field:
        table.add_column("provider", overflow="fold")
    table.add_column("request", overflow="fold")
    table.add_column("attempts", justify="right")
    table.add_column("created (UTC)", no_wrap=True)
    if with_lease:
        table.add_column("lease", overflow="fold", min_width=10)
    if with_reason:
        table.add_column("unknown reason", overflow="fold", min_width=10)
    for record in records:
        # Text, not str: a reference such as "[red]" must not be taken for rich markup.
        cells = [Text(shown(record.key)), Text(shown(record.reference)), state_text(record.state)]
        cells.append(Text(shown(record.account)))
        if every_field:
            cells.append(Text(shown(record.provider)))
        cells += [
            Text(shown(request_target(record))),
            Text(str(record.attempt_count)),
            Text(iso(record.created_at, precise=False) or ""),
        ]
        if with_lease:
            lease = lease_text(record, now) if every_field or owners else short_lease(record, now)
            cells.append(Text(shown(lease)))
        if with_reason:
            cells.append(Text(shown(record.unknown_reason)))
        table.add_row(*cells, style=_ROW_STYLES.get(record.state))
    return table


def _compact_table(records: Sequence[payonce.IntentRecord], now: float, title: str) -> Table:
    # Two or more lines per intent, for a terminal narrower than the wide table: the key
    # and the reference whole in the first column, the state over the account, the rest
    # wrapped at words beside them.
    table = _table(title)
    table.add_column("key / reference", no_wrap=True)
    table.add_column("state / account", overflow="fold")
    table.add_column("attempts", justify="right")
    # "(UTC)" left out to fit 80 columns: each time ends with its Z.
    table.add_column("request / created", overflow="fold", min_width=20)
    for record in records:
        details = [request_target(record), iso(record.created_at, precise=False) or ""]
        lease = short_lease(record, now)
        if lease:
            details.append(f"lease: {lease}")
        if record.unknown_reason:
            details.append(f"unknown: {shown(record.unknown_reason)}")
        table.add_row(
            Text("\n").join([Text(shown(record.key)), Text(shown(record.reference))]),
            Text("\n").join([state_text(record.state), Text(shown(record.account))]),
            Text(str(record.attempt_count)),
            Text("\n".join(details)),
            style=_ROW_STYLES.get(record.state),
        )
    return table


# -- one intent in detail ---------------------------------------------------------------------


def print_intent_detail(
    out: Console,
    record: payonce.IntentRecord,
    attempts: Sequence[payonce.journal.AttemptRecord],
    reconciliations: Sequence[payonce.journal.ReconciliationRecord],
    *,
    with_body: bool,
    escalations: Sequence[payonce.journal.EscalationRecord] = (),
) -> None:
    """One intent: its fields, its attempts and reconciliations, and on request its stored
    request and response. Piped: ``name<TAB>value`` lines, then each table as plain lines
    after a blank line, then the payloads as they are."""
    fields = _fields(record)
    if escalations:
        # Said once a time it went unknown, by the worker that gave up on it.
        said = "; ".join(f"{iso(e.at)} after {e.tries} tries" for e in escalations)
        fields.append(("escalated", Text(shown(said))))
    sections = [_attempts_table(record, attempts, lease_status(record, time.time()))]
    if reconciliations:
        sections.append(_reconciliations_table(reconciliations))
    payloads = _payload_texts(record) if with_body else []
    if not out.is_terminal:
        for name, value in fields:
            click.echo(f"{field_name(name)}\t{shown(value.plain)}", file=out.file)
        for table in sections:
            click.echo("", file=out.file)
            print_table(out, [table], fields=table)
        for text in payloads:
            click.echo(text.plain, file=out.file)
        click.echo("", file=out.file)
        return
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for name, value in fields:
        grid.add_row(name, value)
    out.print(grid, crop=False)  # a key wider than the terminal: the terminal wraps it
    for table in sections:
        print_table(out, [table], fields=table)
    out.print(Group(*payloads, Text("")))


def _fields(record: payonce.IntentRecord) -> list[tuple[str, Text]]:
    stored = record.response
    rows: list[tuple[str, Text | str | None]] = [
        ("key", Text(shown(record.key), no_wrap=True, overflow="ignore")),
        ("reference", record.reference),
        ("state", state_text(record.state)),
        ("unknown reason", record.unknown_reason),
        ("abandon reason", record.abandon_reason),
        ("key per call", _per_call(record)),
        ("request", request_target(record)),
        ("url", redacted(record.url)),
        ("scope", record.scope),
        ("provider", record.provider),
        ("fingerprint", record.fingerprint),
        ("credential", _credential(record)),
        ("account scope", record.account_scope),
        ("created", iso(record.created_at)),
        ("updated", iso(record.updated_at)),
        ("first sent", iso(record.first_sent_at) or _never_sent(record)),
        ("lease", lease_text(record, time.time())),
        ("response", f"HTTP {stored.status}" if stored else None),
        ("acknowledged", iso(record.acknowledged_at)),
    ]
    return [
        (name, value if isinstance(value, Text) else Text(shown(value)))
        for name, value in rows
        if value is not None
    ]


def _credential(record: payonce.IntentRecord) -> str:
    """The fingerprint of the key that sent it (never the key): only that key sends it again."""
    if record.credential is None:
        return "none journaled: no key is known to have sent it, none sends it again"
    return f"{record.credential} (only the key of this fingerprint sends it again)"


def _per_call(record: payonce.IntentRecord) -> str | None:
    """What an operator must know of a key drawn for its one call: nothing resends it."""
    if not record.key_per_call:
        return None
    return (
        "yes: sent outside any block under a key drawn for that one call, payonce never "
        "resends it on its own (`payonce reconcile KEY --resend` does)"
    )


def _never_sent(record: payonce.IntentRecord) -> str | None:
    """Why an intent has no attempt, where that needs saying: one written ahead and never
    sent (enqueued through the outbox, or its process died before sending) waits for a
    sender."""
    if record.attempt_count or record.state is not payonce.IntentState.PENDING:
        return None
    return "not yet: `payonce resume` or `payonce worker` sends it"


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


def _sent_to(record: payonce.IntentRecord, sent_to: str | None) -> str:
    """Where an attempt went, as its ``sent to`` cell: the origin (``https://host:port``)
    when it sent the intent's own path and query, as payonce does, else the whole URL."""
    if sent_to is None:
        return "unrecorded"  # an attempt journaled before schema 7
    sent, journaled = urlsplit(sent_to), urlsplit(record.url)
    if (sent.path, sent.query) == (journaled.path, journaled.query):
        return redacted(f"{sent.scheme}://{sent.netloc}")
    return redacted(sent_to)


def _attempts_table(
    record: payonce.IntentRecord,
    attempts: Sequence[payonce.journal.AttemptRecord],
    lease: LeaseStatus | None,
) -> Table:
    """The attempts of ``record``; a ``sent to`` column, last, only when an attempt was sent
    to another URL than the intent's (a resume by a client of another base URL)."""
    table = Table(
        title=f"{len(attempts)} attempt(s)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("attempt", justify="right")
    table.add_column("started (UTC)", no_wrap=True)
    table.add_column("duration", justify="right", no_wrap=True)
    table.add_column("status")
    table.add_column("error", overflow="fold")
    table.add_column("may have executed", overflow="fold")
    journaled = _without_userinfo(record.url)
    elsewhere = any(a.sent_to not in (None, journaled) for a in attempts)
    if elsewhere:
        table.add_column("sent to", overflow="fold")
    for attempt in attempts:
        if attempt.ended_at is None and lease == "held":
            duration, verdict = "", Text("in flight", style="yellow")
        elif attempt.ended_at is None:
            duration, verdict = "", Text(interrupted_verdict(lease), style="yellow")
        else:
            duration = f"{(attempt.ended_at - attempt.started_at) * 1000:.0f} ms"
            verdict = Text("yes", style="yellow") if attempt.ambiguous else Text("no")
        cells = [
            Text(str(attempt.number)),
            Text(iso(attempt.started_at) or ""),
            Text(duration),
            Text("" if attempt.status_code is None else str(attempt.status_code)),
            Text(shown(attempt.error)),
            verdict,
        ]
        if elsewhere:
            cells.append(Text(shown(_sent_to(record, attempt.sent_to))))
        table.add_row(*cells)
    return table


def _reconciliations_table(entries: Sequence[payonce.journal.ReconciliationRecord]) -> Table:
    table = Table(
        title=f"{len(entries)} reconciliation(s)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("at (UTC)", no_wrap=True)
    table.add_column("outcome", no_wrap=True)
    table.add_column("status")
    table.add_column("detail", overflow="fold")
    for entry in entries:
        table.add_row(
            Text(iso(entry.at) or ""),
            Text(shown(entry.outcome)),
            Text("" if entry.status_code is None else str(entry.status_code)),
            Text(shown(entry.detail)),
        )
    return table


def _body_text(data: bytes) -> Text:
    decoded = _decoded(data)
    if decoded["body_encoding"] != "utf-8":
        return Text(f"  <{len(data)} bytes, not UTF-8: use --json for base64>", style="dim")
    text = decoded["body"]
    if not text:
        return Text("  <empty body>", style="dim")
    with contextlib.suppress(ValueError):  # not JSON: shown as stored
        text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    # Line by line, so that the body keeps its lines and loses only its control characters.
    lines = (shown(line) for line in text.splitlines())
    return Text(textwrap.indent("\n".join(lines), "  "))


def _payload_texts(record: payonce.IntentRecord) -> list[Text]:
    texts = [Text("request", style="bold")]
    texts.extend(Text(f"  {shown(name)}: {shown(value)}") for name, value in record.request_headers)
    texts.append(_body_text(record.body))
    stored = record.response
    if stored is not None:
        texts.append(Text(f"response HTTP {stored.status}", style="bold"))
        texts.extend(Text(f"  {shown(name)}: {shown(value)}") for name, value in stored.headers)
        if stored.body_stored:
            texts.append(_body_text(stored.body))
        else:
            texts.append(Text("<body not stored: it exceeded the size cap>", style="dim"))
    return texts
