"""The kill scenario: worker processes paying a batch are SIGKILLed and restarted.

Each client's batch is paid by a few real worker processes (``_worker``), each on its own
slice of the orders. At random moments (seeded) one of the workers that is paying gets
``SIGKILL``; it is started again at once and goes on with its slice. The provider takes
``processing`` seconds to execute each payment, so most kills land between a request
leaving and its answer arriving: the payment executes at the provider, and the worker
never learns it. What counts is what the provider executed, per order: more than once is a
double charge, never is a missing payment.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path

import attrs
from rich.console import Console
from starlette.requests import ClientDisconnect

import payonce
from payonce._demo._report import Bar, progress
from payonce._demo._results import KillResult, KillStats
from payonce._demo._scenario import count_executions, plan
from payonce._demo._worker import Pattern
from payonce.sandbox import Faults, SandboxConfig, SandboxServer

KILL_FAULTS = Faults(fail_after_rate=0.05, drop_after_rate=0.05)
"""Lost answers besides the kills: retried under the same key, they are no danger to either
client, so every double charge in this scenario is a kill's."""

_STEP_OVERHEAD = 0.01
"""A rough local cost per order, on top of the provider's processing time."""

_LABELS: dict[Pattern, str] = {"payonce": "payonce workers", "stripe": "stripe-python workers"}

_NOBODY_PAYING_WAIT = 0.02
"""When a kill is due and every worker is still starting: the kill waits for one to pay."""


def _positive(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise payonce.ConfigurationError(f"{attribute.name} must be at least 1, got {value!r}")


def _not_negative(
    instance: object, attribute: attrs.Attribute[float] | attrs.Attribute[int], value: float
) -> None:
    if not value >= 0:
        raise payonce.ConfigurationError(f"{attribute.name} must not be negative, got {value!r}")


@attrs.frozen
class KillScenario:
    """How many orders, worker processes and kills; how slow the provider is."""

    orders: int = attrs.field(default=60, validator=_positive)
    workers: int = attrs.field(default=3, validator=_positive)
    kills: int = attrs.field(default=10, validator=_not_negative)
    """SIGKILLs per client, spread at random over the batch."""
    processing: float = attrs.field(default=0.15, validator=_not_negative)
    """Seconds the provider takes to execute a payment: the window a kill must hit."""
    seed: int = 0
    """Seeds the moments and the victims of the kills, and the provider's faults."""
    faults: Faults = KILL_FAULTS

    def __attrs_post_init__(self) -> None:
        if self.workers > self.orders:
            raise payonce.ConfigurationError(
                f"{self.workers} workers for {self.orders} orders: each worker needs an order"
            )

    def sandbox_config(self) -> SandboxConfig:
        """The provider each client's workers pay: slow, a few lost answers, this seed."""
        faults = attrs.evolve(self.faults, seed=self.seed)
        return SandboxConfig(faults=faults, processing_seconds=self.processing)

    def slices(self) -> list[tuple[int, int]]:
        """Each worker's (first order, number of orders), as even as they come."""
        size, extra = divmod(self.orders, self.workers)
        counts = [size + (index < extra) for index in range(self.workers)]
        return [(sum(counts[:index]), count) for index, count in enumerate(counts)]

    def mean_gap(self) -> float:
        """Kills spread over the time the batch would take without them."""
        per_worker = math.ceil(self.orders / self.workers)
        return per_worker * (self.processing + _STEP_OVERHEAD) / (self.kills + 1)


class WorkerFailed(RuntimeError):
    """A worker process ended on its own with an error: the demo cannot count."""


@attrs.define(eq=False)
class _Slot:
    index: int
    first: int
    count: int
    process: subprocess.Popen[str] | None = None
    ready: bool = False
    """Its process has started paying (a kill before that would catch nothing in flight)."""
    done: bool = False


class _Workers:
    """Starts, kills and restarts the worker processes of one client, and hears them."""

    def __init__(
        self, pattern: Pattern, server: SandboxServer, scenario: KillScenario, workdir: Path
    ) -> None:
        self._pattern = pattern
        self._url = server.url
        self._scenario = scenario
        self._workdir = workdir
        self._events: queue.Queue[tuple[subprocess.Popen[str], str]] = queue.Queue()
        self.slots = [_Slot(i, first, count) for i, (first, count) in enumerate(scenario.slices())]

    def start(self, slot: _Slot) -> None:
        command = [
            sys.executable,
            "-m",
            "payonce._demo._worker",
            f"--pattern={self._pattern}",
            f"--url={self._url}",
            f"--orders-db={self._workdir / f'orders-{slot.index}.db'}",
            f"--total={self._scenario.orders}",
            f"--first={slot.first}",
            f"--count={slot.count}",
        ]
        if self._pattern == "payonce":
            command.append(f"--journal={self._workdir / 'journal.db'}")
        with open(self._stderr(slot), "a") as stderr:
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
        slot.process, slot.ready = process, False
        threading.Thread(target=self._listen, args=(process,), daemon=True).start()

    def _stderr(self, slot: _Slot) -> Path:
        return self._workdir / f"{self._pattern}-worker-{slot.index}.err"

    def _listen(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        with process.stdout:
            for line in process.stdout:
                self._events.put((process, line.strip()))
        self._events.put((process, ""))

    def next_event(self, timeout: float) -> tuple[_Slot, str] | None:
        """The next line of a current worker ("" when it ended); None after ``timeout``."""
        try:
            process, line = self._events.get(timeout=timeout)
        except queue.Empty:
            return None
        slot = next((s for s in self.slots if s.process is process), None)
        if slot is None:
            return None  # a killed incarnation's last words
        if line == "ready":
            slot.ready = True
        elif not line:
            self._ended(slot, process)
        return slot, line

    def _ended(self, slot: _Slot, process: subprocess.Popen[str]) -> None:
        if process.wait() != 0:
            detail = self._stderr(slot).read_text().strip().splitlines()[-1:] or ["no message"]
            raise WorkerFailed(
                f"{self._pattern} worker {slot.index} exited with {process.returncode}: {detail[0]}"
            )
        slot.done = True

    def kill(self, slot: _Slot) -> bool:
        """SIGKILL the slot's process and start it again; False if it had ended already."""
        process = slot.process
        if process is None or process.poll() is not None:
            return False
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        self.start(slot)
        return True

    def paying(self) -> list[_Slot]:
        return [slot for slot in self.slots if slot.ready and not slot.done]

    def running(self) -> bool:
        return not all(slot.done for slot in self.slots)

    def stop(self) -> None:
        for slot in self.slots:
            if slot.process is not None and slot.process.poll() is None:
                os.kill(slot.process.pid, signal.SIGKILL)
                slot.process.wait()


def run_kill_scenario(
    scenario: KillScenario,
    console: Console,
    *,
    provider: Callable[[SandboxConfig], SandboxServer] = SandboxServer,
) -> KillResult:
    """Both clients' workers through the same kills, each on a fresh provider made by
    ``provider`` (a test may keep the provider's store, to count for itself)."""
    stats: dict[Pattern, KillStats] = {}
    with (
        _quiet_disconnects(),
        tempfile.TemporaryDirectory(prefix="payonce-demo-kills-") as directory,
    ):
        for pattern, label in _LABELS.items():
            workdir = Path(directory) / pattern
            workdir.mkdir()
            with provider(scenario.sandbox_config()) as server:
                stats[pattern] = run_killed_workers(
                    pattern, server, scenario, workdir, console, label
                )
    return KillResult(
        faults=scenario.sandbox_config().faults,
        processing=scenario.processing,
        payonce=stats["payonce"],
        stripe=stats["stripe"],
    )


class _NotClientDisconnects(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], ClientDisconnect))


@contextmanager
def _quiet_disconnects() -> Iterator[None]:
    # A kill while the provider still reads the request's body is logged by the server as
    # an error with a traceback; here it is the scenario going as planned (nothing ran).
    logger, quiet = logging.getLogger("uvicorn.error"), _NotClientDisconnects()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def run_killed_workers(
    pattern: Pattern,
    server: SandboxServer,
    scenario: KillScenario,
    workdir: Path,
    console: Console,
    label: str,
) -> KillStats:
    """Pay the batch through ``pattern``'s workers on ``server``, killing them as planned,
    and count what the provider executed once every worker has finished its slice."""
    rng = random.Random(scenario.seed)
    gap = scenario.mean_gap()
    workers = _Workers(pattern, server, scenario, workdir)
    kills = 0
    paid: set[str] = set()
    started = time.monotonic()
    next_kill = started + rng.uniform(0.5, 1.5) * gap
    with progress(console, label, scenario.orders) as bar:
        try:
            for slot in workers.slots:
                workers.start(slot)
            while workers.running():
                killing = kills < scenario.kills
                timeout = max(0.0, next_kill - time.monotonic()) if killing else 0.5
                event = workers.next_event(timeout)
                if event is not None and event[1].startswith("paid ") and event[1] not in paid:
                    paid.add(event[1])
                    bar.advance()
                if killing and time.monotonic() >= next_kill:
                    if _kill_one(workers, rng):
                        kills += 1
                        _show_kills(bar, kills)
                        next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * gap
                    else:
                        next_kill = time.monotonic() + _NOBODY_PAYING_WAIT
        finally:
            workers.stop()
    server.wait_idle()
    executions = count_executions(server, scenario.faults)
    journal = workdir / "journal.db" if pattern == "payonce" else None
    return KillStats(
        orders=scenario.orders,
        workers=scenario.workers,
        kills=kills,
        executions=executions.total,
        duplicates=executions.duplicates,
        charged_twice=executions.charged_twice,
        missing=executions.missing(p.reference for p in plan(scenario.orders)),
        cut_off=None if journal is None else _cut_off_attempts(journal),
        seconds=time.monotonic() - started,
    )


def _cut_off_attempts(journal: Path) -> int:
    """Attempts the journal shows started and never ended: their worker was killed while
    the request was out. Each was finished by the restarted worker, under its key."""
    with closing(payonce.open_journal(journal, check_integrity=False)) as opened:
        return sum(
            attempt.in_flight
            for intent in opened.list_intents()
            for attempt in opened.attempts(intent.key)
        )


def _kill_one(workers: _Workers, rng: random.Random) -> bool:
    paying: Sequence[_Slot] = workers.paying()
    return bool(paying) and workers.kill(rng.choice(paying))


def _show_kills(bar: Bar, kills: int) -> None:
    bar.note(f"{kills} kill{'s' if kills != 1 else ''}")
