"""``payonce sandbox`` and ``payonce demo``: the reference provider, and the proof.

``python -m payonce.sandbox`` runs this same ``sandbox`` command: one set of options, one
implementation.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import click

from ._common import CONTEXT_SETTINGS, CliError, console

if TYPE_CHECKING:
    from payonce.sandbox import Faults, WebhookConfig

__all__ = ["demo", "sandbox"]

_RATE = click.FloatRange(0.0, 1.0)
_FILE = click.Path(path_type=Path, dir_okay=False)
_Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def _rate(flag: str, help: str, *, name: str | None = None) -> _Decorator:
    names = [flag] if name is None else [flag, name]
    return click.option(*names, type=_RATE, default=0.0, metavar="RATE", help=help)


def _seconds(flag: str, help: str, default: float = 0.0, *, name: str | None = None) -> _Decorator:
    names = [flag] if name is None else [flag, name]
    return click.option(
        *names,
        type=click.FloatRange(min=0.0),
        default=default,
        show_default=bool(default),
        metavar="SECONDS",
        help=help,
    )


def _file(flag: str, help: str) -> _Decorator:
    return click.option(flag, type=_FILE, metavar="PATH", help=help)


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


def _webhooks(
    url: str | None, secrets: Sequence[str], redeliver_rate: float, seed: int
) -> WebhookConfig | None:
    from payonce.sandbox import WebhookConfig

    if url is None:
        if secrets or redeliver_rate:
            raise click.UsageError(
                "--webhook-secret and --webhook-redeliver-rate need --webhook-url"
            )
        return None
    if not secrets:
        raise click.UsageError("--webhook-url needs at least one --webhook-secret")
    return WebhookConfig(url=url, secrets=secrets, redeliver_rate=redeliver_rate, seed=seed)


def _write_atomically(path: Path, text: str) -> None:
    # A watcher polling for the file must never read it half-written.
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


@contextlib.contextmanager
def _warnings_to_stderr() -> Iterator[None]:
    """Server and webhook warnings reach stderr while serving, unless the program running
    the command configured logging itself; nothing is left installed afterwards."""
    root = logging.getLogger()
    if root.handlers:
        yield
        return
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)


@click.command(
    short_help="Run the reference payment provider, with faults.", context_settings=CONTEXT_SETTINGS
)
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8765,
    show_default=True,
    help="0 picks a free port.",
)
@_file("--store", "Keep the provider's state in this SQLite file (default: a temporary one).")
@_seconds("--key-lifetime", "Seconds the provider remembers an idempotency key.", 86400.0)
@_seconds("--processing", "Work per payment: how long each execution takes.")
@click.option(
    "--idempotency",
    type=click.Choice(["strict", "racy", "none"]),
    default="strict",
    show_default=True,
    help="The idempotency layer: strict (a duplicate in flight gets 409), racy (a duplicate "
    "arriving while the first still runs executes too, as some servers do), or none.",
)
@click.option(
    "--like",
    type=click.Choice(["stripe", "adyen", "mollie", "square"]),
    help="Answer as this provider documents it: its dialect and key lifetime, and the "
    "resources its SDK calls (stripe: form bodies, Stripe's errors and its PaymentIntents, "
    "for stripe-python; adyen, mollie, square: their /payments resources).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random faults.")
# The faults, each named after its field of Faults: the command gets them together.
@_rate("--fail-before", "Rate of 503 before executing.", name="fail_before_rate")
@_rate("--fail-after", "Rate of 503 after executing.", name="fail_after_rate")
@_rate("--drop-after", "Rate of connections dropped after executing.", name="drop_after_rate")
@_rate("--rate-limit", "Rate of 429 answers.", name="rate_limit_rate")
@_rate("--delay-rate", "Rate of slow answers.", name="delay_rate")
@_seconds("--delay", "How slow they are.", name="delay_seconds")
@_file("--ready-file", "Write the base URL to this file once listening (for scripts to wait for).")
@click.option(
    "--webhook-url", metavar="URL", help="Deliver a signed event per settled payment here."
)
@click.option(
    "--webhook-secret",
    "webhook_secrets",
    multiple=True,
    metavar="SECRET",
    help="Signing secret, required with --webhook-url; repeat it to sign with two during a "
    "rotation.",
)
@_rate("--webhook-redeliver-rate", "Share of events delivered a second time, on purpose.")
def sandbox(
    host: str,
    port: int,
    store: Path | None,
    key_lifetime: float,
    processing: float,
    idempotency: Literal["strict", "racy", "none"],
    like: Literal["stripe", "adyen", "mollie", "square"] | None,
    seed: int,
    ready_file: Path | None,
    webhook_url: str | None,
    webhook_secrets: Sequence[str],
    webhook_redeliver_rate: float,
    **fault_settings: float,
) -> None:
    """Run the sandbox payment provider in the foreground until Ctrl-C (or SIGTERM).

    The first line printed is "payonce sandbox listening on URL".
    """
    try:
        from payonce.sandbox import (
            DEFAULT_ACCOUNT,
            DEFAULT_API_KEY,
            MOLLIE_TEST_API_KEY,
            Faults,
            SandboxConfig,
            serve,
        )
    except ImportError as exc:
        raise _sandbox_missing(exc) from exc
    try:
        faults = Faults(seed=seed, **fault_settings)
        settings: dict[str, Any] = {
            "processing_seconds": processing,
            "idempotency": idempotency,
            "faults": faults,
            "store_path": None if store is None else os.fspath(store),
            "webhooks": _webhooks(webhook_url, webhook_secrets, webhook_redeliver_rate, seed),
        }
        given = click.get_current_context().get_parameter_source("key_lifetime")
        if like is None or given is not click.core.ParameterSource.DEFAULT:
            # A provider's preset keeps its own key lifetime unless one is asked for.
            settings["key_lifetime"] = key_lifetime
        config = SandboxConfig(**settings) if like is None else SandboxConfig.like(like, **settings)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc

    out = console()

    def say(line: str) -> None:
        # Printed as given, on one line however long: scripts read the first one.
        out.print(line, markup=False, soft_wrap=True)

    def ready(url: str) -> None:
        say(f"payonce sandbox listening on {url}")
        # The sandbox's fixed, public test key: not a secret, and clients need it.
        say(f"test API key: {DEFAULT_API_KEY} (account {DEFAULT_ACCOUNT})")
        if like == "mollie":
            say(f"also: {MOLLIE_TEST_API_KEY} (mollie-api-python takes only test_… keys)")
        if like is not None:
            say(f"answers like: {like}")
        say(f"faults: {_describe_faults(faults) or 'none'}")
        if config.webhooks is not None:
            say(f"webhooks: to {config.webhooks.url}")
        say("press Ctrl-C to stop")
        if ready_file is not None:
            _write_atomically(ready_file, url)

    try:
        with _warnings_to_stderr():
            serve(config, host=host, port=port, ready=ready)
    except OSError as exc:
        raise CliError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from exc
    say("sandbox provider stopped")


def _sdk_demo(ctx: click.Context, sdk: str, orders: int, kills: int) -> bool:
    """``demo --sdk``: its own, smaller defaults where the batch scenario's were not chosen."""
    try:
        from payonce.demo import run_sdk_demo
    except ImportError as exc:
        raise _sandbox_missing(exc) from exc
    default = click.core.ParameterSource.DEFAULT
    if ctx.get_parameter_source("orders") is default:
        orders = 6
    if ctx.get_parameter_source("kills") is default:
        kills = 3
    return run_sdk_demo(sdk, orders=orders, kills=kills)


@click.command(short_help="Prove it: payonce against network faults and killed workers.")
@click.option(
    "--payments",
    type=click.IntRange(min=1),
    default=300,
    show_default=True,
    help="Payments sent through payonce and the naive client over the faulty network.",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of the provider's faults, and of the moments and victims of the kills.",
)
@click.option(
    "--journal",
    "journal_path",
    type=_FILE,
    help="Keep the network scenario's journal in this new file (default: a temporary one).",
)
@click.option(
    "--orders",
    type=click.IntRange(min=1),
    default=60,
    show_default=True,
    help="Orders in the batch the killed workers pay, per client.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Worker processes paying the batch, each its own slice of the orders.",
)
@click.option(
    "--kills",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="SIGKILLs per client, at random moments, each followed by a restart; 0 pays the "
    "batch without kills.",
)
@_seconds(
    "--processing",
    "How long the provider takes to execute each payment of the batch: the window in "
    "which a kill catches a payment between its request and its answer.",
    default=0.15,
)
@click.option(
    "--sdk",
    type=click.Choice(["stripe"]),
    help="Run instead the same stripe-python checkout (create, then confirm a "
    "PaymentIntent) killed after its steps and run again, alone and through "
    "payonce.integrations.stripe (needs the stripe extra). --orders and --kills default "
    "to 6 and 3 here.",
)
@click.pass_context
def demo(
    ctx: click.Context,
    payments: int,
    seed: int,
    journal_path: Path | None,
    orders: int,
    workers: int,
    kills: int,
    processing: float,
    sdk: str | None,
) -> None:
    """Prove it: the same payments through payonce and through the usual alternatives.

    \b
    1. A faulty network (lost answers, 503s, dropped connections, slow answers): payonce
       against a naive client that retries with a fresh key per attempt.
    2. Worker processes paying a batch of orders, SIGKILLed at random moments and
       restarted: payonce's workers (one shared journal) against the stripe-python
       pattern (a key per call, kept in memory and reused on that call's retries).

    Every count is read at the sandbox provider: duplicate executions and orders never
    executed. Exits non-zero if payonce executed a payment twice, or through the kills
    charged an order twice or never.
    """
    if sdk is not None:
        ok = _sdk_demo(ctx, sdk, orders, kills)
        if not ok:
            raise click.exceptions.Exit(1)
        return
    try:
        from payonce.demo import run_demo
    except ImportError as exc:
        raise _sandbox_missing(exc) from exc
    ok = run_demo(
        payments,
        seed=seed,
        journal=journal_path,
        orders=orders,
        workers=workers,
        kills=kills,
        processing=processing,
    )
    if not ok:
        raise click.exceptions.Exit(1)
