"""``payonce sandbox`` and ``payonce demo``: the reference provider, and the proof."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.text import Text

from ._common import CliError, console

if TYPE_CHECKING:
    from payonce.sandbox import Faults

__all__ = ["demo", "sandbox"]

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


@click.command()
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
    out = console()

    def ready(url: str) -> None:
        out.print(Text.assemble("payonce sandbox provider listening on ", (url, "bold")))
        # The sandbox's fixed, public test key: not a secret, and clients need it.
        out.print(f"test API key: {DEFAULT_API_KEY} (account {DEFAULT_ACCOUNT})")
        active = _describe_faults(faults)
        out.print(f"faults: {active}" if active else "faults: none")
        out.print("press Ctrl-C to stop")

    try:
        serve(config, host=host, port=port, ready=ready)
    except OSError as exc:
        raise CliError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from exc
    out.print("sandbox provider stopped")


@click.command()
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
    result = run_demo(payments, seed, journal_path, console())
    if not result.ok:
        raise click.exceptions.Exit(1)
