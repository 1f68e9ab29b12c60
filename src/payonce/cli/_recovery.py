"""``payonce resume`` and ``payonce reconcile``: after a crash, finish and settle intents.

Both drive the library's own batch runner (``Client.resume``, ``Client.reconcile``,
``Client.reconcile_all``): the same targets, the same isolation of each intent; the
command only shows the results as they come.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

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
    existing_journal_target,
    journal_option,
)
from ._recovery_views import Row, progress, reconcile_row, resume_row, rows_table, summary

__all__ = ["reconcile", "resume"]

_results_json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print a JSON array of results instead of a table; no progress bar, and the summary "
    "line goes to stderr.",
)


@attrs.frozen
class _Connection:
    """Where the intents were sent, and the journal they are in: what a client is built from."""

    base_url: str
    provider: str
    account: str
    journal: JournalLocation | None

    @property
    def label(self) -> str:
        return f"account {self.account!r} (provider {self.provider!r})"

    @contextmanager
    def client(self) -> Iterator[payonce.Client]:
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            # Not quoted back: whatever was pasted there by mistake may be a secret.
            raise CliError("--base-url must be an http(s) URL")
        journal = existing_journal_target(self.journal)  # never create one to resume from
        with payonce.Client(
            base_url=self.base_url, provider=self.provider, account=self.account, journal=journal
        ) as client:
            yield client


def _connection_options(command: Callable[..., None]) -> Callable[..., None]:
    """What a command that talks to the provider needs, handed over as one ``connection``.

    The API key is never an option: it comes from PAYONCE_API_KEY or the OS keyring
    (``payonce keys set``).
    """

    @functools.wraps(command)
    def with_connection(
        base_url: str,
        provider: str,
        account: str,
        journal_path: JournalLocation | None,
        **rest: Any,
    ) -> None:
        command(connection=_Connection(base_url, provider, account, journal_path), **rest)

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
    decorated: Callable[..., None] = with_connection
    for option in reversed(options):
        decorated = option(decorated)
    return decorated


def _show_progress(as_json: bool) -> bool:
    return not as_json and console().is_terminal


def _finish(rows: Sequence[Row], *, verb: str, title: str, nothing: str, as_json: bool) -> None:
    """Print the results and the summary line; exit 1 if an intent still needs attention."""
    line = summary(verb, rows) if rows else nothing
    if as_json:
        echo_json([row.to_json() for row in rows])
        click.echo(line, err=True)  # stdout stays pure JSON
    else:
        out = console()
        if rows:
            out.print(rows_table(rows, title=title))
        out.print(Text(line))
    if any(row.needs_attention for row in rows):
        raise click.exceptions.Exit(1)


@click.command(short_help="Resend the pending intents dead workers left behind.")
@_connection_options
@_results_json_option
def resume(connection: _Connection, as_json: bool) -> None:
    """Finish the pending intents that crashed or killed workers left behind.

    Each pending intent of the account and provider that no live worker holds is resent
    with its journaled bytes under its own key: the provider executes it at most once. One
    that may have reached the provider longer ago than the provider keeps keys is not
    resent: it goes unknown, for `payonce reconcile`.

    Exits 1 if an intent is still pending (the provider was unreachable, or refused the
    API key) or unknown.
    """
    with connection.client() as client:
        total = len(client.journal.pending(account=client.account, provider=client.provider.name))
        with progress(console(), "resuming", total, enabled=_show_progress(as_json)) as advance:
            results = client.resume(on_result=lambda _: advance())
        rows = [resume_row(result, client.journal) for result in results]
    _finish(
        rows,
        verb="resumed",
        title=f"{len(rows)} resumed intent(s)",
        nothing=f"nothing to resume: no pending intent of {connection.label}",
        as_json=as_json,
    )


def _check_named(client: payonce.Client, key_or_reference: str) -> None:
    """Say why, when no intent of this account and provider has this key or reference."""
    found = client.journal.find(key_or_reference)
    if any(r.account == client.account and r.provider == client.provider.name for r in found):
        return
    if not found:
        raise NotFound(f"no intent with key or reference {key_or_reference!r}")
    others = ", ".join(sorted({f"--account {r.account} --provider {r.provider}" for r in found}))
    raise NotFound(
        f"no intent with key or reference {key_or_reference!r} for account "
        f"{client.account!r} and provider {client.provider.name!r}; it was sent with: {others}"
    )


@click.command(short_help="Ask the provider what became of unknown intents.")
@click.argument("key_or_reference", required=False)
@click.option(
    "--all", "every", is_flag=True, help="Every unknown intent of the account and provider."
)
@_connection_options
@_results_json_option
def reconcile(
    key_or_reference: str | None, every: bool, connection: _Connection, as_json: bool
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
    with connection.client() as client:
        if key_or_reference is not None:
            _check_named(client, key_or_reference)
            results = client.reconcile(key_or_reference)
        else:
            total = len(client.unknown())
            with progress(console(), "reconciling", total, enabled=show) as advance:
                results = client.reconcile_all(on_result=lambda _: advance())
        rows = [reconcile_row(result) for result in results]
    _finish(
        rows,
        verb="reconciled",
        title=f"{len(rows)} reconciled intent(s)",
        nothing=f"nothing to reconcile: no unknown intent of {connection.label}",
        as_json=as_json,
    )
