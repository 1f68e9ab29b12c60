"""``payonce keys set|delete|list``: API keys in the OS keyring, never on the command line."""

from __future__ import annotations

import os
import sys

import click

import payonce

from ._common import CliError, NotFound, echo_json, json_option

__all__ = ["keys"]

_KEYS_NOTE = (
    "note: PAYONCE_API_KEY is set in this environment, and takes precedence over the "
    "keyring for a client's account; `payonce resume`, `reconcile` and `worker` send it "
    "only for the account named with --account (or PAYONCE_ACCOUNT); every other account "
    "takes its key from the keyring"
)


def _note_environment_key() -> None:
    if os.environ.get("PAYONCE_API_KEY"):
        click.echo(_KEYS_NOTE, err=True)


@click.group(short_help="Store, list and delete API keys in the OS keyring.")
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
@json_option
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
