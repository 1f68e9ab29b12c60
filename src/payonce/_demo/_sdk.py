"""``payonce demo --sdk stripe``: the same stripe-python checkout, killed and run again.

A shop's checkout (create a PaymentIntent, then confirm it, then record the order paid)
runs in a worker process (``_sdk_worker``) against a sandbox speaking Stripe's
PaymentIntents. It is SIGKILLed after a step answered and before the shop recorded it, at
the same points for both clients, and run again each time, until the batch is done: once
with stripe-python alone (its keys are random per call, in memory), once with the one
added line and block. What the provider holds per order is counted: a second
PaymentIntent is a duplicate, a second confirmed one a double charge.
"""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import attrs
from rich.console import Console
from rich.table import Table
from rich.text import Text

import payonce
from payonce.sandbox import SandboxConfig, SandboxServer

KILLED = -signal.SIGKILL


def _checked(scenario: SdkScenario, attribute: attrs.Attribute[int], value: int) -> None:
    if value < (1 if attribute.name == "orders" else 0):
        raise payonce.ConfigurationError(f"{attribute.name} must be at least 1, got {value!r}")


@attrs.frozen
class SdkScenario:
    """How many orders the checkout pays, and how many times its process is killed."""

    sdk: str = "stripe"
    orders: int = attrs.field(default=6, validator=_checked)
    kills: int = attrs.field(default=3, validator=_checked)
    """One per order from the first: after its create answered (even orders) or after its
    confirm answered (odd orders), before the shop recorded it paid."""

    def __attrs_post_init__(self) -> None:
        if self.sdk != "stripe":
            raise payonce.ConfigurationError(f"no SDK demo for {self.sdk!r}: try 'stripe'")
        if self.kills > self.orders:
            raise payonce.ConfigurationError(
                f"{self.kills} kills for {self.orders} orders: each kill needs an order"
            )

    def kill_points(self) -> list[tuple[int, int]]:
        """(order, step) after whose answer each kill lands."""
        return [(n, 1 if n % 2 == 0 else 2) for n in range(self.kills)]


@attrs.frozen
class SdkStats:
    """What the provider holds after one client's batch, kills and re-runs included."""

    orders: int
    kills: int
    created: int
    """PaymentIntents created."""
    charged: int
    """PaymentIntents confirmed (succeeded): charges."""
    charged_twice: int
    """Orders with more than one charge."""
    missing: int
    """Orders never charged."""
    seconds: float

    @property
    def duplicates(self) -> int:
        return self.created - self.orders


@attrs.frozen
class SdkResult:
    scenario: SdkScenario
    payonce: SdkStats
    plain: SdkStats

    @property
    def ok(self) -> bool:
        """payonce created and charged every order once, through every kill."""
        p = self.payonce
        return p.duplicates == 0 and p.charged_twice == 0 and p.missing == 0


class SdkWorkerFailed(RuntimeError):
    """The checkout worker ended on its own with an error: the demo cannot count."""


def run_sdk_demo(scenario: SdkScenario, console: Console) -> SdkResult:
    """Run both batches and print the report on ``console``."""
    try:
        import stripe  # noqa: F401  # the worker's: say it here, not from a child's traceback
    except ImportError as missing:
        raise payonce.ConfigurationError(
            "payonce demo --sdk stripe needs stripe-python: pip install 'payonce[stripe]'"
        ) from missing
    _print_intro(console, scenario)
    plain = _run_batch(scenario, with_payonce=False)
    through_payonce = _run_batch(scenario, with_payonce=True)
    result = SdkResult(scenario, payonce=through_payonce, plain=plain)
    _print_report(console, result)
    return result


def _run_batch(scenario: SdkScenario, *, with_payonce: bool) -> SdkStats:
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="payonce-sdk-demo-") as directory,
        SandboxServer(SandboxConfig.like("stripe")) as server,
    ):
        command = [sys.executable, "-m", "payonce._demo._sdk_worker", f"--url={server.url}"]
        command += [f"--orders-db={Path(directory) / 'orders.db'}", f"--orders={scenario.orders}"]
        if with_payonce:
            command.append(f"--journal={Path(directory) / 'journal.db'}")
        for order, step in scenario.kill_points():
            _run_worker([*command, f"--die-at={order}:{step}"], expect=KILLED)
        _run_worker(command, expect=0)
        server.wait_idle()
        intents = server.store.payment_intents()
    created = collections.Counter(i["metadata"]["order"] for i in intents)
    charged = collections.Counter(
        i["metadata"]["order"] for i in intents if i["status"] == "succeeded"
    )
    return SdkStats(
        orders=scenario.orders,
        kills=scenario.kills,
        created=sum(created.values()),
        charged=sum(charged.values()),
        charged_twice=sum(1 for count in charged.values() if count > 1),
        missing=scenario.orders - len(charged),
        seconds=time.monotonic() - started,
    )


def _run_worker(command: list[str], *, expect: int) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != expect:
        raise SdkWorkerFailed(
            f"the checkout worker ended with {done.returncode}, not {expect}:\n"
            f"{done.stderr[-2000:]}"
        )


def _print_intro(console: Console, scenario: SdkScenario) -> None:
    kills = f"{scenario.kills} SIGKILL{'' if scenario.kills == 1 else 's'}"
    console.print(Text("stripe-python checkout killed and run again", style="bold"))
    for line in (
        f"{scenario.orders} orders: create a PaymentIntent, then confirm it",
        f"{kills}, each after a step answered and before the shop recorded the order paid; "
        "then the code is run again",
        "stripe-python alone: a random Idempotency-Key per call, in memory",
        "through payonce: http_client=payonce.integrations.stripe.HTTPClient(client) and "
        "`with client.intent(order):`",
    ):
        console.print(Text(f"  {line}", style="dim"))


def _print_report(console: Console, result: SdkResult) -> None:
    p, s = result.payonce, result.plain
    table = Table(title="Counted at the provider", title_justify="left")
    table.add_column("")
    table.add_column("stripe-python alone", justify="right")
    table.add_column("through payonce", justify="right")
    for label, plain, through in (
        ("orders", s.orders, p.orders),
        ("SIGKILLs, each followed by a run again", s.kills, p.kills),
        ("PaymentIntents created", s.created, p.created),
        ("duplicate PaymentIntents", s.duplicates, p.duplicates),
        ("charges (confirmed PaymentIntents)", s.charged, p.charged),
        ("orders charged more than once", s.charged_twice, p.charged_twice),
        ("orders never charged", s.missing, p.missing),
    ):
        table.add_row(label, str(plain), str(through))
    table.add_row("seconds", f"{s.seconds:.1f}", f"{p.seconds:.1f}")
    console.print(table)
    console.print(
        Text.assemble(
            ("stripe-python alone: ", "bold"),
            (
                f"{s.duplicates} duplicate PaymentIntent(s), {s.charged_twice} order(s) "
                "charged twice: each run again drew new keys for the same orders.",
                "bold red" if s.duplicates else "",
            ),
        )
    )
    if result.ok:
        console.print(
            Text.assemble(
                ("OK ", "bold green"),
                f"through payonce: 0 duplicates, {p.orders} orders each created and "
                "confirmed once; each run again replayed the steps from the journal.",
            )
        )
    else:
        console.print(
            Text(
                f"FAILED through payonce: {p.duplicates} duplicate PaymentIntent(s), "
                f"{p.charged_twice} order(s) charged twice, {p.missing} never charged.",
                style="bold red",
            )
        )
