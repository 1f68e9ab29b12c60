"""One run of the world: processes, provider, network and clocks, every step and fault
chosen by a ``Chooser``; the invariants checked after every step and at the end.

``run_world(seed, Features(...))`` draws a run from a seed; ``run_world(seed, features,
script=[...])`` replays a recorded list of choices (what the shrinker does). The same seed
and features, or the same script, replay the same run exactly.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import greenlet
import httpx

import payonce
from payonce import IntentState
from payonce._journal._sqlite import SQLiteJournal
from payonce._lifecycle import _drive
from payonce._lifecycle._states import RULES, Transition
from payonce._runtime._base import SdkKeys

from . import _edges
from ._choices import Chooser
from ._clocks import Clocks
from ._edges import SimKeeper
from ._invariants import Checker, Violation
from ._network import Network
from ._processes import Process, TornDown
from ._provider import CREDENTIALS, PROFILES, ProviderModel, profile_named
from ._shop import BASE_URL, SdkError, Shop, run_order

__all__ = ["Features", "RunResult", "TRANSITION_PAIRS", "run_world"]

MERCHANT_A, MERCHANT_B = list(CREDENTIALS)
RETRY = payonce.RetryPolicy(max_attempts=3, initial_wait=0.5, max_wait=4.0, jitter=False)
TIMEOUT = 10.0
MAX_LIVE = 3
DRAIN_LIMIT = 20_000
"""Boundaries the quiet end of a run may take before the run is judged stuck."""

TRANSITION_PAIRS = frozenset(
    (None if source is None else source.value, rule.transition.value)
    for rule in RULES
    for source in rule.sources
)
"""Every (state, transition) pair the transition table allows."""


@attrs.frozen
class Features:
    """What the world can do. ``changed_code`` and ``per_request_credentials`` produce the
    classes of issue 27 (a block whose first request differs between runs; an intent
    resent under another merchant's credential). ``changed_code`` is on in the suite's
    fixed seeds since class 1's fix; both are on in ``make simulate --all-features``."""

    faults: bool = True
    crashes: bool = True
    clock_steps: bool = True
    operators: bool = True
    changed_code: bool = False
    per_request_credentials: bool = False
    sdk_keys_honoured: bool = False
    """Adds SDK code whose transport journals the SDK's own uuid4 key per call as its step's
    key (``sdk_keys="honour"``) instead of payonce's (``"replace"``)."""
    exclusive_orders: bool = False
    """One live process per order at a time (a shop whose job queue runs an order once at
    a time): an order's code runs again only after its earlier run ended or crashed."""
    new_reference_on_rerun: bool = False
    """A deliberately broken shop: a run again of an order's code after a crash opens its
    intent under another reference (``order-6/again``), so payonce cannot know it is the
    same intent. The world must catch the double payment this makes: the simulator's proof
    that it can fail. Never on in a hunt."""
    kinds: tuple[str, ...] = ()
    """Only these order kinds (``_shop.ORDER_KINDS``), to look at one apart; all by default."""
    profile: str = "mixed"
    """One of ``_provider.PROFILES``, or ``mixed``: each seed's own, ``seed % 4``."""

    @classmethod
    def everything(cls) -> Features:
        return cls(changed_code=True, per_request_credentials=True)

    def orders(self) -> list[tuple[str, str]]:
        kinds = ["oneshot", "block", "sdk", "declined", "retried-block"]
        if self.changed_code:
            kinds += ["conditional", "confirm-unless-confirmed", "coupon-added"]
            kinds += ["reordered", "twice", "repriced", "late-request"]
        if self.per_request_credentials:
            kinds.append("sdk-merchant-b")
        if self.sdk_keys_honoured:
            kinds.append("sdk-honour")
        if self.kinds:
            kinds = [kind for kind in kinds if kind in self.kinds]
        return [(f"order-{n}", kind) for n, kind in enumerate(kinds, start=1)]


@attrs.define
class RunResult:
    seed: int
    features: Features
    choices: list[int]
    violations: list[Violation]
    story: list[str]
    steps: int
    pairs: set[tuple[str | None, str]]
    decisions: set[str]

    @property
    def failed(self) -> bool:
        return bool(self.violations)


class World:
    """Everything of one run; also the edges (``_edges.Edges``) and each wire's host."""

    def __init__(
        self, seed: int, features: Features, script: Sequence[int] | None, directory: Path
    ) -> None:
        self.features = features
        self.chooser = Chooser(seed, script)
        self.entropy = random.Random(seed ^ 0x5EED)
        self.clocks = Clocks()
        named = features.profile
        if named == "mixed":
            named = PROFILES[seed % len(PROFILES)]
        self.profile = profile_named(named)
        self.provider = ProviderModel(self.clocks, self.profile)
        self.journal_path = directory / "journal.db"
        self.shop = Shop()
        self.story: list[str] = []
        self.processes: list[Process] = []
        self.current: Process | None = None
        self.main = greenlet.getcurrent()
        self.faults = features.faults
        self.tearing_down = False
        self.checker = Checker(self)
        self.steps = 0
        self.pairs: set[tuple[str | None, str]] = set()
        self.decisions: set[str] = set()
        self._names = itertools.count(1)
        self._keys = itertools.count(1)

    # -- the edges ----------------------------------------------------------------------------

    def sleep(self, seconds: float) -> None:
        self.boundary(f"sleeps {seconds:g} s")
        self.waited(seconds)

    def waited(self, seconds: float) -> None:
        self.clocks.advance(seconds)
        self.renew_leases()

    def new_key(self) -> str:
        return f"01SIM{next(self._keys):021d}"

    def new_owner(self) -> str:
        process = self.current
        name = process.name if process is not None else "main"
        owner = _edges.owner_name(name, self.entropy.getrandbits(32))
        if process is not None:
            process.owners.add(owner)  # all of them end when it is killed
        return owner

    def journal_boundary(self, command: _drive.Command) -> None:
        transition = getattr(command, "transition", None)
        named = type(command).__name__
        if isinstance(transition, Transition):
            named += f" ({transition.value})"
        self.boundary(f"journals {named}")

    def saw(self, command: object) -> None:
        transition = getattr(command, "transition", None)
        named = type(command).__name__
        if isinstance(transition, Transition):
            named += f": {transition.value}"
            run = getattr(command, "run", None)
            record = getattr(command, "record", None) if run is None else run.record
            if record is not None:
                self.pairs.add((record.state.value, transition.value))
        if isinstance(command, _drive.ClaimIntent):
            self.pairs.add((None, Transition.WRITE_AHEAD.value))
        self.decisions.add(named)

    def uuid4(self) -> str:
        return str(uuid.UUID(int=self.entropy.getrandbits(128), version=4))

    # -- a wire's host, and a process's boundaries ---------------------------------------------

    def boundary(self, what: str) -> None:
        process = self.current
        if process is None:
            return  # the scheduler's own journal work (a lease renewal): no process to switch
        if self.tearing_down:
            raise TornDown
        process.at = what
        self.current = None
        self.main.switch()
        self.current = process

    def pick(self, weights: list[float]) -> int:
        return self.chooser.pick(weights)

    def tell(self, line: str) -> None:
        who = self.current.name if self.current is not None else "world"
        self.story.append(f"{who}: {line}")

    def told(self, operation: str, response: httpx.Response) -> None:
        assert self.current is not None
        self.checker.told(self.current, operation, response)

    # -- processes ----------------------------------------------------------------------------

    def start(self, task: str, order: str | None, kind: str | None) -> Process:
        name = f"p{next(self._names)}"
        # A run again after a crash: the latest earlier process of this order crashed (a run
        # after one that finished is a second delivery of the job, judged by invariant 1).
        earlier = [p for p in self.processes if order is not None and p.order == order]
        rerun = bool(earlier) and earlier[-1].crashed
        process = Process(name, task, order, rerun, self._body(task, order, kind))
        process.glet = greenlet.greenlet(self._run, parent=self.main)
        self.processes.append(process)
        self.story.append(
            f"{name} starts: {task}" + (" (a run again after a crash)" if rerun else "")
        )
        return process

    def _run(self, process: Process) -> None:
        try:
            process.outcome = process.body(process)
        except (payonce.PayonceError, SdkError) as error:
            # An SDK raises its own error for an error answer payonce handed it through
            # the transport (the provider's refusal, settled or not): told, not hidden.
            process.outcome = f"{type(error).__name__}: {error}"
        except Exception as error:
            if self.tearing_down:
                return  # a crashed process unwinding after the run: no part of it
            process.outcome = f"{type(error).__name__}: {error}"
            self.checker.unexpected(process, error)
        if self.tearing_down:
            return
        for close in reversed(process.closers):
            close()
        process.done = True
        self.story.append(f"{process.name} ends: {process.outcome}")

    def step(self, process: Process) -> None:
        assert process.glet is not None
        assert process.runnable
        if process.glet:
            self.story.append(f"{process.name} goes on ({process.at})")
        self.current = process
        if process.glet:
            process.glet.switch()
        else:
            process.glet.switch(process)
        self.current = None

    def crash(self, process: Process) -> None:
        self.story.append(f"{process.name} crashes (at: {process.at})")
        process.crash()
        _edges.process_killed(process.owners)

    def renew_leases(self) -> None:
        current, self.current = self.current, None  # renewals are the keeper's, not a step
        try:
            for process in self.processes:
                if process.runnable and not process.paused and process.keeper is not None:
                    process.keeper.renew()
        finally:
            self.current = current

    def _client(
        self,
        process: Process,
        account: str,
        api_key: str | None,
        recovery_keys: list[str] | None = None,
    ) -> payonce.Client:
        journal = SQLiteJournal(self.journal_path, group_commit=False, check_integrity=False)
        process.journal = journal
        client = payonce.Client(
            base_url=BASE_URL,
            provider=self.profile,
            account=account,
            api_key=api_key,
            recovery_keys=recovery_keys,
            transport_only=api_key is None,
            journal=journal,
            retry=RETRY,
            timeout=TIMEOUT,
            clock=self.clocks.wall,
            transport=Network(self, self.provider, TIMEOUT, (process.name, process.rerun)),
        )
        keeper = SimKeeper()
        client._keeper = keeper
        process.lease_seconds = client._core.lease_seconds
        process.keeper = keeper
        process.closers += [journal.close, client.close]
        return client

    def _platform_key(self) -> str:
        """The key recovery of the platform's intents runs with (its ``PAYONCE_API_KEY``):
        merchant B's where two merchants' SDK calls carry their own credentials, so that
        merchant A's intents are recovered under another merchant's key (issue 27's class
        2); else the one merchant's."""
        return MERCHANT_B if self.features.per_request_credentials else MERCHANT_A

    def _operator_keys(self, account: str) -> list[str] | None:
        """The keys the final recovery of the platform's intents runs with: every
        merchant's, as an operator gives them once told which key an intent wants (a
        recovery under merchant B's key alone skips merchant A's intents, named). None
        during the run: recovery then has the platform key alone."""
        if account == "shop" or not self.chooser.quiet:
            return None
        return [MERCHANT_A, MERCHANT_B]

    def _body(self, task: str, order: str | None, kind: str | None) -> Any:
        def body(process: Process) -> str:
            if order is not None:
                assert kind is not None
                number = int(order.split("-")[1])
                broken = self.features.new_reference_on_rerun and process.rerun
                reference = f"{order}/again" if broken else order
                if broken:
                    self.tell(f"opens its intent under another reference, {reference}")
                if kind.startswith("sdk"):
                    client = self._client(process, "platform", None)
                    merchant = MERCHANT_B if kind == "sdk-merchant-b" else MERCHANT_A
                    sdk_keys: SdkKeys = "honour" if kind == "sdk-honour" else "replace"
                    network = Network(self, self.provider, TIMEOUT, (process.name, process.rerun))

                    def sdk_http() -> httpx.Client:
                        transport = client.transport(network, sdk_keys=sdk_keys)
                        return httpx.Client(base_url=BASE_URL, transport=transport)

                    return run_order(
                        "sdk", order, 1000 + number, client, self.shop, self, sdk_http, merchant
                    )
                client = self._client(process, "shop", MERCHANT_A)
                return run_order(
                    kind, order, 1000 + number, client, self.shop, self, reference=reference
                )
            verb, account = task.split()
            key = MERCHANT_A if account == "shop" else self._platform_key()
            client = self._client(process, account, key, self._operator_keys(account))
            if verb == "resume":
                results = client.resume()
                return f"resumed {len(results)}"
            if verb == "reconcile":
                reconciled = client.reconcile_all()
                return f"reconciled {len(reconciled)}"
            return self._operator(process, client)

        return body

    def _operator(self, process: Process, client: payonce.Client) -> str:
        journal = client.journal
        waiting = journal.list_intents(states=[IntentState.PENDING, IntentState.UNKNOWN])
        settled = journal.unacknowledged()
        options = [(r, "abandon") for r in waiting] + [(r, "acknowledge") for r in settled]
        options += [
            (r, "reconcile --resend")
            for r in waiting
            if r.state is IntentState.UNKNOWN and r.account == client.account
        ]
        if not options:
            return "nothing to do"
        record, verb = options[self.pick([1.0] * len(options))]
        self.boundary(f"{verb}: {record.key} ({record.reference}, {record.state.value})")
        if verb == "reconcile --resend":
            results = client.reconcile(record.key, resend=True)
            return f"reconciled {record.key} with --resend: {[r.outcome for r in results]}"
        if verb == "abandon":
            journal.abandon(record.key, reason="operator", now=self.clocks.wall())
            self.pairs.add((record.state.value, Transition.ABANDONED.value))
        else:
            journal.acknowledge(record.key, now=self.clocks.wall())
            self.pairs.add((record.state.value, Transition.ACKNOWLEDGED.value))
        return f"{verb}ed {record.key}"

    # -- the scheduler ------------------------------------------------------------------------

    def tasks(self) -> list[tuple[float, str, str | None, str | None]]:
        running = {p.order for p in self.processes if p.runnable}
        tasks: list[tuple[float, str, str | None, str | None]] = [
            (
                0.0 if self.features.exclusive_orders and order in running else 3.0,
                f"{order} ({kind})",
                order,
                kind,
            )
            for order, kind in self.features.orders()
        ]
        for account in ("shop", "platform"):
            tasks.append((0.7, f"resume {account}", None, None))
            tasks.append((0.7, f"reconcile {account}", None, None))
            if self.features.operators:
                tasks.append((0.3, f"operator {account}", None, None))
        return tasks

    def one_step(self) -> None:
        runnable = [p for p in self.processes if p.runnable]
        actions: list[tuple[float, Any]] = [(10.0, ("step", p)) for p in runnable]
        if len(runnable) < MAX_LIVE:
            actions.append((4.0 if runnable else 10.0, ("start", None)))
        if self.features.crashes:
            actions += [(1.0, ("crash", p)) for p in runnable if p.glet]
            actions += [(0.3, ("pause", p)) for p in runnable if p.glet and p.lease_seconds]
            actions.append((0.1, ("reboot", None)))
        if self.features.clock_steps:
            actions += [
                (0.3, ("wall", -3600.0)),
                (0.3, ("wall", 3600.0)),
                (0.3, ("pass", 600.0)),
                (0.1, ("provider", 120.0)),
            ]
            if not runnable:
                # Only an idle world sleeps past a key's lifetime: a live process paused
                # that long between its key-window check and its send (a host suspended
                # for a day mid-request) is outside this world.
                actions.append((0.3, ("pass", 30 * 3600.0)))
        what, target = actions[self.pick([w for w, _ in actions])][1]
        if what == "step":
            self.step(target)
        elif what == "start":
            tasks = self.tasks()
            _, task, order, kind = tasks[self.pick([w for w, *_ in tasks])]
            self.step(self.start(task, order, kind))
        elif what == "crash":
            self.crash(target)
        elif what == "pause":
            seconds = target.lease_seconds + 1.0
            self.story.append(f"{target.name} pauses whole for {seconds:g} s (at: {target.at})")
            target.paused = True
            self.waited(seconds)
            target.paused = False
        elif what == "reboot":
            self.story.append("world: the host reboots")
            for process in runnable:
                self.crash(process)
            self.clocks.reboot()
        elif what == "wall":
            self.clocks.wall_offset += target
            self.story.append(f"world: the host's wall clock steps {target:+g} s")
        elif what == "pass":
            self.story.append(f"world: {target:g} s pass")
            self.waited(target)
        else:
            self.clocks.provider_offset += target
            self.story.append(f"world: the provider's clock steps {target:+g} s")
        self.steps += 1

    def quiet_end(self) -> None:
        """All faults off: the processes still running run to their end, then a final
        recovery (a resume and a reconciliation of each account) runs alone."""
        self.chooser.quiet = True
        self.faults = False
        self.story.append("world: faults off; the running processes finish")
        self._drain()
        # A reconciliation that finds no record puts an intent back to pending: a resume
        # after it sends that one (as the worker's next pass would).
        for verb in ("resume", "reconcile", "resume"):
            for account in ("shop", "platform"):
                task = f"{verb} {account}"
                if self.checker.violations:
                    return
                self.start(task, None, None)
                self._drain()

    def _drain(self) -> None:
        """Step the running processes in turn (fairly: one waiting for another's lease
        must not starve it) until all have ended."""
        for turn in range(DRAIN_LIMIT):
            runnable = [p for p in self.processes if p.runnable]
            if not runnable or self.checker.violations:
                return
            self.step(runnable[turn % len(runnable)])
            self.checker.after_step()
        stuck = ", ".join(f"{p.name} at {p.at}" for p in self.processes if p.runnable)
        self.checker.violated(
            2, f"the processes never finish with faults off: {stuck}", "never finishes"
        )

    def tear_down(self) -> None:
        self.tearing_down = True
        for process in self.processes:
            glet = process.glet
            if glet is not None and glet and process.crashed:
                # Its unwinding is no part of the run: whatever it raises is dropped.
                with contextlib.suppress(BaseException):
                    glet.throw(TornDown)


def run_world(
    seed: int,
    features: Features = Features(),
    *,
    steps: int = 60,
    script: Sequence[int] | None = None,
) -> RunResult:
    """One run: ``steps`` scheduler steps (or ``script``'s choices), then the quiet end and
    the final checks."""
    directory = Path(tempfile.mkdtemp(prefix="payonce-sim-", dir=_scratch()))
    world = World(seed, features, script, directory)
    try:
        with _edges.installed(world):
            try:
                for _ in range(steps):
                    if world.chooser.exhausted or world.checker.violations:
                        break
                    world.one_step()
                    world.checker.after_step()
                if not world.checker.violations:
                    world.quiet_end()
                if not world.checker.violations:
                    world.checker.at_end()
            finally:
                world.tear_down()
    finally:
        for leftover in directory.iterdir():
            leftover.unlink()
        directory.rmdir()
    return RunResult(
        seed=seed,
        features=features,
        choices=list(world.chooser.made),
        violations=world.checker.violations,
        story=world.story,
        steps=world.steps,
        pairs=world.pairs,
        decisions=world.decisions,
    )


def _scratch() -> str | None:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
