"""The ``payonce`` command: inspect and repair the journal, manage API keys in the OS
keyring, run the sandbox provider, run the demo.

A thin client of the public API: one module per command group, each using ``payonce`` and
its public modules only. It never prints an API key and never takes one on the command
line; it prints stored request and response payloads only when asked to (``--body``).

Exit status: 0 when everything went well; 1 when something needs attention (not found, not
allowed in the intent's state, intents still unknown or unsent after ``resume`` or
``reconcile``, a damaged journal); 2 when the configuration, the journal or the command
line needs fixing.
"""

from __future__ import annotations

from typing import Any

import click

import payonce

from ._common import CONTEXT_SETTINGS, JOURNAL_ENV, CliError, NotFound, Refused
from ._decisions import abandon, ack
from ._intents import intents
from ._journal import journal_group, prune
from ._keys import keys
from ._recovery import reconcile, resume
from ._sandbox import demo, sandbox
from ._warnings import warnings_to_stderr
from ._worker import worker

__all__ = ["JOURNAL_ENV", "CliError", "NotFound", "Refused", "cli", "main"]


class _Cli(click.Group):
    """Turns every ``PayonceError`` a command lets through into a ``CliError``, and the
    library's warnings into ``warning: ...`` lines on stderr."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with warnings_to_stderr():
                return super().invoke(ctx)
        except payonce.PayonceError as exc:
            # Journal and configuration problems are the user's to fix, not crashes.
            raise CliError(str(exc)) from exc


_COMMANDS = [
    intents,
    resume,
    reconcile,
    worker,
    abandon,
    ack,
    journal_group,
    prune,
    keys,
    sandbox,
    demo,
]


@click.group(cls=_Cli, context_settings=CONTEXT_SETTINGS, commands=_COMMANDS)
@click.version_option(payonce.__version__, prog_name="payonce")
def cli() -> None:
    """payonce: payments that take effect exactly once over an at-least-once network."""


def main() -> None:
    """The ``payonce`` console script (also ``python -m payonce``)."""
    cli(prog_name="payonce")
