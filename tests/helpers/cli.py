"""Running the ``payonce`` command as its user does: one runner, in this process or not.

``run_cli`` runs it in this process through click's ``CliRunner`` (fast, and monkeypatches
reach it); ``run_cli_process`` runs it as a real process, for what only one can show (the
entry points themselves, logging left as a process starts it, a journal on a remounted
filesystem). Both return a ``CliResult`` and both check what every command owes its user,
so a test checks only what it is about:

- it ended by an exit of its own (click's ``SystemExit``), never by a crash;
- no ``Traceback`` reached the user, on stdout or stderr;
- none of ``secrets`` was printed.

``env`` is laid over this process's environment in both; ``columns`` is the console's width
(a wide one by default: tests look for whole values, not for how a narrow table folds), and
``terminal`` sets rich's ``TTY_COMPATIBLE``: tables (True) or plain lines (False).
"""

from __future__ import annotations

import subprocess
import sys
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from click.testing import CliRunner

from helpers.processes import python_env
from payonce.cli import cli

PYTHON_M_PAYONCE = (sys.executable, "-m", "payonce")


@dataclass(frozen=True)
class CliResult:
    """How a ``payonce`` command ended and what it printed."""

    exit_code: int
    stdout: str
    stderr: str
    output: str
    """Both streams: interleaved as printed in this process; stdout then stderr from a process."""


def run_cli(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    columns: int | None = 200,
    terminal: bool | None = None,
    secrets: Iterable[str] = (),
    prog_name: str | None = None,
) -> CliResult:
    """``payonce *args`` in this process."""
    result = CliRunner().invoke(
        cli, list(args), input=input, env=_settings(env, columns, terminal), prog_name=prog_name
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        crash = "".join(traceback.format_exception(result.exception))
        raise AssertionError(f"payonce {' '.join(args)} crashed:\n{crash}") from result.exception
    return _checked(
        CliResult(result.exit_code, result.stdout, result.stderr, result.output), args, secrets
    )


def run_cli_process(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    columns: int | None = 200,
    terminal: bool | None = None,
    secrets: Iterable[str] = (),
    command: Sequence[str] = PYTHON_M_PAYONCE,
    timeout: float = 60,
) -> CliResult:
    """``payonce *args`` as a process of its own, started as ``command`` (``python -m
    payonce`` unless told), this checkout's payonce first on its path; ``input`` is its
    standard input (a pipe, not a terminal) when given."""
    done = subprocess.run(
        [*command, *args],
        input=input,
        env=python_env(**_settings(env, columns, terminal)),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return _checked(
        CliResult(done.returncode, done.stdout, done.stderr, done.stdout + done.stderr),
        args,
        secrets,
    )


def _settings(
    env: Mapping[str, str] | None, columns: int | None, terminal: bool | None
) -> dict[str, str]:
    settings = {} if columns is None else {"COLUMNS": str(columns)}
    if terminal is not None:
        settings["TTY_COMPATIBLE"] = "1" if terminal else "0"
    return {**settings, **(env or {})}


def _checked(result: CliResult, args: Sequence[str], secrets: Iterable[str]) -> CliResult:
    shown = result.stdout + result.stderr
    assert "Traceback" not in shown, shown
    for secret in secrets:
        assert secret not in shown, f"payonce {' '.join(args)} printed a secret"
    return result
