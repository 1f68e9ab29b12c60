"""The ``payonce`` command: inspect the journal, run the sandbox provider, run the demo.

A thin client of the public API. It never prints an API key, and prints stored request
and response payloads only when asked to (``--body``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import textwrap
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import click
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

import payonce

if TYPE_CHECKING:
    from payonce.sandbox import Faults

__all__ = ["CliError", "NotFound", "cli", "main"]

JOURNAL_ENV = "PAYONCE_JOURNAL"
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


class CliError(click.ClickException):
    """A user-facing failure: one ``error: ...`` line on stderr, no traceback.

    Exit status 2: the journal or the configuration needs fixing.
    """

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True, file=file)


class NotFound(CliError):
    """What was asked for is not there: exit status 1."""

    exit_code = 1


class _Cli(click.Group):
    """Turns every ``PayonceError`` a command lets through into a ``CliError``."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except payonce.PayonceError as exc:
            # Journal and configuration problems are the user's to fix, not crashes.
            raise CliError(str(exc)) from exc


# -- the journal ------------------------------------------------------------------------------


@contextlib.contextmanager
def _existing_journal(path: Path | None) -> Iterator[payonce.Journal]:
    """Open a journal for reading; a missing one is reported, never created."""
    target = (path if path is not None else payonce.default_journal_path()).expanduser()
    if not target.exists():
        raise CliError(f"no journal at {target}")
    journal = payonce.open_journal(target)
    try:
        yield journal
    finally:
        journal.close()


_journal_option = click.option(
    "--journal",
    "journal_path",
    type=click.Path(path_type=Path),
    envvar=JOURNAL_ENV,
    show_envvar=True,
    help="The journal file (default: payonce's journal in the user data directory).",
)


# -- formatting -------------------------------------------------------------------------------


def _iso(timestamp: float | None, *, precise: bool = True) -> str | None:
    """ISO 8601 in UTC: with milliseconds and offset for JSON, short for tables."""
    if timestamp is None:
        return None
    moment = datetime.fromtimestamp(timestamp, UTC)
    if precise:
        return moment.isoformat(timespec="milliseconds")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _redacted(url: str) -> str:
    """The URL without any user:password part: a base URL may carry credentials."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"***@{host}"))


def _request_target(record: payonce.IntentRecord) -> str:
    parts = urlsplit(record.url)
    target = f"{parts.path}?{parts.query}" if parts.query else parts.path
    return f"{record.method} {target}"


def _lease(record: payonce.IntentRecord, now: float) -> str | None:
    if record.lease_owner is None:
        return None
    if record.lease_expires_at is None:
        return record.lease_owner
    expired = "" if record.lease_live(now) else " (expired)"
    return f"{record.lease_owner} until {_iso(record.lease_expires_at, precise=False)}{expired}"


def _decoded(data: bytes) -> dict[str, str]:
    try:
        return {"body": data.decode("utf-8"), "body_encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"body": base64.b64encode(data).decode("ascii"), "body_encoding": "base64"}


def _intent_json(record: payonce.IntentRecord) -> dict[str, Any]:
    return {
        "key": record.key,
        "reference": record.reference,
        "state": record.state.value,
        "scope": record.scope,
        "account": record.account,
        "provider": record.provider,
        "method": record.method,
        "url": _redacted(record.url),
        "path": urlsplit(record.url).path,
        "fingerprint": record.fingerprint,
        "attempt_count": record.attempt_count,
        "created_at": _iso(record.created_at),
        "updated_at": _iso(record.updated_at),
        "first_sent_at": _iso(record.first_sent_at),
        "lease_owner": record.lease_owner,
        "lease_expires_at": _iso(record.lease_expires_at),
        "unknown_reason": record.unknown_reason,
        "abandon_reason": record.abandon_reason,
        "response_status": record.response.status if record.response else None,
        "acknowledged_at": _iso(record.acknowledged_at),
    }


def _attempt_json(attempt: payonce.AttemptRecord) -> dict[str, Any]:
    return {
        "number": attempt.number,
        "started_at": _iso(attempt.started_at),
        "ended_at": _iso(attempt.ended_at),
        "status_code": attempt.status_code,
        "error": attempt.error,
        "ambiguous": attempt.ambiguous,
        "in_flight": attempt.in_flight,
    }


def _reconciliation_json(entry: payonce.ReconciliationRecord) -> dict[str, Any]:
    return {
        "at": _iso(entry.at),
        "outcome": entry.outcome,
        "detail": entry.detail,
        "status_code": entry.status_code,
    }


def _payload_json(record: payonce.IntentRecord) -> dict[str, Any]:
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


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


def _state_text(state: payonce.IntentState) -> Text:
    return Text(state.value, style=_STATE_STYLES.get(state, ""))


def _console() -> Console:
    # Created per command so it writes to whatever stdout is current (CliRunner swaps it).
    return Console(highlight=False)


# -- the command group ------------------------------------------------------------------------


@click.group(cls=_Cli)
@click.version_option(payonce.__version__, prog_name="payonce")
def cli() -> None:
    """payonce: payments that take effect exactly once over an at-least-once network."""


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
@_journal_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array instead of a table.")
def list_intents(
    states: Sequence[str], limit: int | None, journal_path: Path | None, as_json: bool
) -> None:
    """List intents, newest first.

    Pending and unknown intents are highlighted: unknown ones need reconciliation.
    """
    wanted = [payonce.IntentState(s.lower()) for s in states] or None
    with _existing_journal(journal_path) as journal:
        records = journal.list_intents(states=wanted, limit=limit)
    if as_json:
        _echo_json([_intent_json(r) for r in records])
        return
    console = _console()
    if not records:
        console.print("no intents" + (f" in state {', '.join(states)}" if states else ""))
        return
    console.print(_intents_table(records, width=console.width))


_WIDE_TABLE = 120
"""Below this console width, intents are listed on several lines each."""


def _intents_table(records: Sequence[payonce.IntentRecord], *, width: int) -> Table:
    now = time.time()
    table = Table(
        title=f"{len(records)} intent(s), newest first",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    if width < _WIDE_TABLE:
        _compact_rows(table, records, now)
    else:
        _wide_rows(table, records, now)
    return table


def _wide_rows(table: Table, records: Sequence[payonce.IntentRecord], now: float) -> None:
    with_lease = any(r.lease_owner for r in records)
    with_reason = any(r.unknown_reason for r in records)
    table.add_column("key", no_wrap=True)
    table.add_column("reference", overflow="fold")
    table.add_column("state", no_wrap=True)
    table.add_column("request", overflow="fold")
    table.add_column("attempts", justify="right")
    table.add_column("created (UTC)", no_wrap=True)
    if with_lease:
        table.add_column("lease", overflow="fold", min_width=10)
    if with_reason:
        table.add_column("unknown reason", overflow="fold", min_width=10)
    for record in records:
        # Text, not str: a reference such as "[red]" must not be taken for rich markup.
        cells = [
            Text(record.key),
            Text(record.reference or ""),
            _state_text(record.state),
            Text(_request_target(record)),
            Text(str(record.attempt_count)),
            Text(_iso(record.created_at, precise=False) or ""),
        ]
        if with_lease:
            cells.append(Text(_lease(record, now) or ""))
        if with_reason:
            cells.append(Text(record.unknown_reason or ""))
        table.add_row(*cells, style=_ROW_STYLES.get(record.state))


def _compact_rows(table: Table, records: Sequence[payonce.IntentRecord], now: float) -> None:
    # Two or more lines per intent, so a narrow terminal folds values instead of cropping.
    table.add_column("key / reference", overflow="fold", min_width=max(len(r.key) for r in records))
    table.add_column("state", no_wrap=True)
    table.add_column("attempts", justify="right")
    table.add_column("request / created (UTC)", overflow="fold", min_width=20)
    for record in records:
        details = [_request_target(record), _iso(record.created_at, precise=False) or ""]
        lease = _lease(record, now)
        if lease:
            details.append(f"lease: {lease}")
        if record.unknown_reason:
            details.append(f"unknown: {record.unknown_reason}")
        table.add_row(
            Text("\n").join([Text(record.key), Text(record.reference or "")]),
            _state_text(record.state),
            Text(str(record.attempt_count)),
            Text("\n".join(details)),
            style=_ROW_STYLES.get(record.state),
        )


@intents.command("show")
@click.argument("key_or_reference")
@_journal_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option(
    "--body",
    "with_body",
    is_flag=True,
    help="Also print the stored request and response (headers and bodies).",
)
def show_intent(
    key_or_reference: str, journal_path: Path | None, as_json: bool, with_body: bool
) -> None:
    """Show the intent(s) with this key or reference, with their attempts."""
    with _existing_journal(journal_path) as journal:
        records = journal.find(key_or_reference)
        attempts = {r.key: list(journal.attempts(r.key)) for r in records}
        reconciliations = {r.key: list(journal.reconciliations(r.key)) for r in records}
    if not records:
        raise NotFound(f"no intent with key or reference {key_or_reference!r}")
    if as_json:
        documents = []
        for record in records:
            document = _intent_json(record)
            document["attempts"] = [_attempt_json(a) for a in attempts[record.key]]
            document["reconciliations"] = [
                _reconciliation_json(entry) for entry in reconciliations[record.key]
            ]
            if with_body:
                document |= _payload_json(record)
            documents.append(document)
        _echo_json(documents)
        return
    console = _console()
    for record in records:
        console.print(
            _intent_detail(
                record,
                attempts[record.key],
                reconciliations[record.key],
                with_body=with_body,
            )
        )


def _intent_detail(
    record: payonce.IntentRecord,
    attempts: Sequence[payonce.AttemptRecord],
    reconciliations: Sequence[payonce.ReconciliationRecord],
    *,
    with_body: bool,
) -> Group:
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold", no_wrap=True)
    fields.add_column(overflow="fold")
    stored = record.response
    rows: list[tuple[str, Text | str | None]] = [
        ("key", record.key),
        ("reference", record.reference),
        ("state", _state_text(record.state)),
        ("unknown reason", record.unknown_reason),
        ("abandon reason", record.abandon_reason),
        ("request", _request_target(record)),
        ("url", _redacted(record.url)),
        ("scope", record.scope),
        ("provider", record.provider),
        ("fingerprint", record.fingerprint),
        ("created", _iso(record.created_at)),
        ("updated", _iso(record.updated_at)),
        ("first sent", _iso(record.first_sent_at)),
        ("lease", _lease(record, time.time())),
        ("response", f"HTTP {stored.status}" if stored else None),
        ("acknowledged", _iso(record.acknowledged_at)),
    ]
    for name, value in rows:
        if value is not None:
            fields.add_row(name, value if isinstance(value, Text) else Text(value))
    parts: list[Table | Text] = [fields, _attempts_table(attempts)]
    if reconciliations:
        parts.append(_reconciliations_table(reconciliations))
    if with_body:
        parts.extend(_payload_texts(record))
    parts.append(Text(""))
    return Group(*parts)


def _attempts_table(attempts: Sequence[payonce.AttemptRecord]) -> Table:
    table = Table(title=f"{len(attempts)} attempt(s)", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("#", justify="right")
    table.add_column("started (UTC)", no_wrap=True)
    table.add_column("duration", justify="right", no_wrap=True)
    table.add_column("status")
    table.add_column("error", overflow="fold")
    table.add_column("may have executed", overflow="fold")
    for attempt in attempts:
        if attempt.ended_at is None:
            duration, verdict = "", Text("in flight", style="yellow")
        else:
            duration = f"{(attempt.ended_at - attempt.started_at) * 1000:.0f} ms"
            verdict = Text("yes", style="yellow") if attempt.ambiguous else Text("no")
        table.add_row(
            Text(str(attempt.number)),
            Text(_iso(attempt.started_at) or ""),
            Text(duration),
            Text("" if attempt.status_code is None else str(attempt.status_code)),
            Text(attempt.error or ""),
            verdict,
        )
    return table


def _reconciliations_table(entries: Sequence[payonce.ReconciliationRecord]) -> Table:
    table = Table(
        title=f"{len(entries)} reconciliation(s)", title_justify="left", box=box.SIMPLE_HEAD
    )
    table.add_column("at (UTC)", no_wrap=True)
    table.add_column("outcome", no_wrap=True)
    table.add_column("status")
    table.add_column("detail", overflow="fold")
    for entry in entries:
        table.add_row(
            Text(_iso(entry.at) or ""),
            Text(entry.outcome),
            Text("" if entry.status_code is None else str(entry.status_code)),
            Text(entry.detail),
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
    return Text(textwrap.indent(text, "  "))


def _payload_texts(record: payonce.IntentRecord) -> list[Text]:
    texts = [Text("request", style="bold")]
    texts.extend(Text(f"  {name}: {value}") for name, value in record.request_headers)
    texts.append(_body_text(record.body))
    stored = record.response
    if stored is not None:
        texts.append(Text(f"response HTTP {stored.status}", style="bold"))
        texts.extend(Text(f"  {name}: {value}") for name, value in stored.headers)
        if stored.body_stored:
            texts.append(_body_text(stored.body))
        else:
            texts.append(Text("<body not stored: it exceeded the size cap>", style="dim"))
    return texts


# -- the sandbox provider and the demo --------------------------------------------------------

_RATE = click.FloatRange(0.0, 1.0)
_SECONDS = click.FloatRange(min=0.0)


def _describe_faults(faults: Faults) -> str:
    rates = [
        ("fail before", faults.fail_before_rate),
        ("fail after", faults.fail_after_rate),
        ("drop after", faults.drop_after_rate),
        ("rate limit", faults.rate_limit_rate),
        (f"delay {faults.delay_seconds:g}s", faults.delay_rate),
    ]
    active = ", ".join(f"{name} {rate:.0%}" for name, rate in rates if rate > 0)
    return f"{active} (seed {faults.seed})" if active else ""


def _sandbox_missing(exc: ImportError) -> CliError:
    return CliError(
        f"the sandbox provider needs payonce's sandbox extra ({exc}): "
        "pip install 'payonce[sandbox]'"
    )


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8765,
    show_default=True,
    help="0 picks a free port.",
)
@click.option(
    "--key-lifetime",
    type=_SECONDS,
    default=86400.0,
    show_default=True,
    metavar="S",
    help="Seconds the provider remembers an idempotency key.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random faults.")
@click.option("--fail-before", type=_RATE, default=0.0, help="Rate of 503 before executing.")
@click.option("--fail-after", type=_RATE, default=0.0, help="Rate of 503 after executing.")
@click.option("--drop-after", type=_RATE, default=0.0, help="Rate of dropped connections.")
@click.option("--rate-limit", type=_RATE, default=0.0, help="Rate of 429 answers.")
@click.option("--delay-rate", type=_RATE, default=0.0, help="Rate of slow answers.")
@click.option("--delay", type=_SECONDS, default=0.0, metavar="S", help="How slow they are.")
@click.option(
    "--store",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Keep the provider's state in this file (default: a temporary one).",
)
def sandbox(
    host: str,
    port: int,
    key_lifetime: float,
    seed: int,
    fail_before: float,
    fail_after: float,
    drop_after: float,
    rate_limit: float,
    delay_rate: float,
    delay: float,
    store: Path | None,
) -> None:
    """Run the sandbox payment provider in the foreground until Ctrl-C."""
    try:
        from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY, Faults, SandboxConfig, serve
    except ImportError as exc:
        raise _sandbox_missing(exc) from exc
    faults = Faults(
        seed=seed,
        fail_before_rate=fail_before,
        fail_after_rate=fail_after,
        drop_after_rate=drop_after,
        rate_limit_rate=rate_limit,
        delay_rate=delay_rate,
        delay_seconds=delay,
    )
    config = SandboxConfig(
        key_lifetime=key_lifetime,
        faults=faults,
        store_path=None if store is None else os.fspath(store),
    )
    console = _console()

    def ready(url: str) -> None:
        console.print(Text.assemble("payonce sandbox provider listening on ", (url, "bold")))
        # The sandbox's fixed, public test key: not a secret, and clients need it.
        console.print(f"test API key: {DEFAULT_API_KEY} (account {DEFAULT_ACCOUNT})")
        active = _describe_faults(faults)
        console.print(f"faults: {active}" if active else "faults: none")
        console.print("press Ctrl-C to stop")

    try:
        serve(config, host=host, port=port, ready=ready)
    except OSError as exc:
        raise CliError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from exc
    console.print("sandbox provider stopped")


@cli.command()
@click.option("--payments", type=click.IntRange(min=1), default=300, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the faults.")
@click.option(
    "--journal",
    "journal_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Keep the demo's journal in this new file (default: a temporary directory).",
)
def demo(payments: int, seed: int, journal_path: Path | None) -> None:
    """Send payments through payonce and through a naive client over a faulty network.

    Exits non-zero if payonce ever executed a payment twice.
    """
    try:
        from payonce._demo import run_demo
    except ImportError as exc:
        raise _sandbox_missing(exc) from exc
    result = run_demo(payments, seed, journal_path, _console())
    if not result.ok:
        raise click.exceptions.Exit(1)


def main() -> None:
    """The ``payonce`` console script."""
    cli(prog_name="payonce")


if __name__ == "__main__":
    main()
