"""``payonce worker``: the long-running recovery process of one journal.

Each pass, for every provider and account whose pending or unknown intents the journal
holds (one ``Client`` each, its API key from the environment or the keyring as any
client's): reconcile the unknown intents the provider profile's schedule says are due
(``_lifecycle._schedule``), escalate those whose schedule is spent, then send the pending
intents no live worker holds (those a reconciliation just sent back to pending among them).

Nothing here is new machinery: the pending intents are claimed, leased and sent as
``Client.resume`` does (``ResumeBatch``), so several workers, on one host or several
sharing one PostgreSQL journal, never send one intent at once; the look-ups are
``Client.reconcile``'s. ``concurrency`` threads share one pass's batch, each driving one
intent at a time. ``stop()`` drains: no intent is taken after it, the ones being driven
are driven to their end (their leases given back), then ``run`` returns.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, TypeVar

import attrs

from .._credentials import recovery_api_key
from .._journal._open import journal_clock, open_to_write
from .._journal._reads import Journal
from .._journal._rows import DamagedRow
from .._lifecycle import (
    IntentRecord,
    IntentState,
    ReconcileOutcome,
    ReconcileSchedule,
    ScheduleDecision,
    current_clock_since,
    decide_lookup,
    decide_resend,
    first_unknown_since,
    step_of_reference,
    tries_since,
    unknown_since,
)
from .._lifecycle._refusals import unknown_remedy
from ..errors import ConfigurationError, JournalError
from ._batch import (
    Batch,
    Claimed,
    ReconcileBatch,
    ResumeBatch,
    ResumeResult,
    run_batch,
    say_damaged,
)
from ._core import RecoveryKeys
from ._events import IntentEscalated, WorkerPassEnded, about, log_extra
from ._hooks import Hooks, HookSet
from ._reconcile import ReconcileResult
from ._redacting import Redactor
from ._retrying import RetryPolicy
from ._sync import Client

__all__ = ["Worker"]

logger = logging.getLogger("payonce.worker")
"""Its own logger: a deployment may show the pass lines (INFO) without every intent's."""

T = TypeVar("T")
R = TypeVar("R")

_SETTLED = (IntentState.SUCCEEDED, IntentState.FAILED)

_SAY_AGAIN_AFTER = 3600.0
"""Seconds before a group that still cannot be driven is said again at ERROR: a worker
passing every few seconds would otherwise fill the log with one line, forever."""


@attrs.frozen(order=True)
class _Group:
    """The intents one client drives: one provider's, of one account."""

    provider: str
    account: str

    @property
    def label(self) -> str:
        return f"account {self.account!r} of provider {self.provider!r}"


@attrs.define
class _Counts:
    sent: int = 0
    settled: int = 0
    unknown: int = 0
    escalated: int = 0
    failed: int = 0
    not_driven: int = 0
    lock: threading.Lock = attrs.field(factory=threading.Lock)

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)


def _say_failed(what: str) -> None:
    """An ERROR line without a traceback: the journal's error says what happened and what
    to do; a traceback every pass would bury it."""
    logger.error("worker: %s", what)


class _Shared(Generic[T, R]):
    """One batch shared by the pass's threads: each ``next`` is taken under a lock, and
    none once the worker is stopping."""

    def __init__(self, batch: Batch[T, R], stopping: threading.Event) -> None:
        self._batch = batch
        self._stopping = stopping
        self._lock = threading.Lock()

    def next(self) -> T | DamagedRow | None:
        with self._lock:
            return None if self._stopping.is_set() else self._batch.next()

    def damaged(self, row: DamagedRow) -> R:
        return self._batch.damaged(row)

    def record(self, target: T) -> IntentRecord:
        return self._batch.record(target)

    @property
    def redactor(self) -> Redactor:
        return self._batch.redactor

    def failed(self, target: T, error: Exception) -> R:
        return self._batch.failed(target, error)

    def report(self, result: R) -> None:
        self._batch.report(result)


class Worker:
    """Sends the pending intents of a journal and reconciles its unknown ones, pass after
    pass, until stopped (``payonce worker``).

    Args:
        journal: A path, a ``postgresql://`` URL, or a payonce ``Journal``.
        base_url: The API root of one provider: ``provider``'s, else the one provider
            without an entry in ``base_urls`` whose intents the journal holds. Never used
            for a second provider: its intents are not driven (said) until it has its own.
        base_urls: The API root of each provider, by profile name.
        provider: Only this provider's intents (default: every provider's).
        account: Only this account's intents (default: every account's). With
            ``PAYONCE_API_KEY`` set, that key serves ``account`` only, and only when it is
            given (whose key it is is never guessed); every account takes its key from the
            keyring (``payonce keys set ACCOUNT``), and one without
            is not driven (said): ``payonce.credentials.recovery_api_key``.
        concurrency: How many intents are driven at once.
        hooks: ``payonce.Hooks`` (or a list): the clients' events, plus ``escalated`` and
            ``worker_pass``.
        retry: The clients' ``RetryPolicy``.
        timeout: The clients' network timeout, in seconds.
        clock: The time (epoch seconds), for the clients and the schedule.
        recovery_keys: More API keys the clients may send (and look up) an intent with: a
            list, or a function of the intent's record (``Client(recovery_keys=)``). An
            intent is sent again only with the key whose fingerprint it journaled; with
            none here (nor in the keyring), it is skipped, named, nothing sent.
    """

    def __init__(
        self,
        *,
        journal: Journal | str | os.PathLike[str],
        base_url: str | None = None,
        base_urls: Mapping[str, str] | None = None,
        provider: str | None = None,
        account: str | None = None,
        concurrency: int = 1,
        hooks: Hooks | Sequence[Hooks] | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
        recovery_keys: RecoveryKeys | None = None,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError(
                f"concurrency must be a whole number >= 1, not {concurrency!r}"
            )
        self._base_url = base_url
        self._base_urls = dict(base_urls or {})
        self._provider = provider
        self._account = account
        self._concurrency = concurrency
        self._hook_list = hooks
        self._hooks = HookSet.of(hooks, None)
        self._retry = retry
        self._timeout = timeout
        self._wall_clock = clock
        self._recovery_keys = recovery_keys
        self._owns_journal = not isinstance(journal, Journal)
        self.journal: Journal = open_to_write(journal)
        # The reconcile schedule counts from times the journal dated: by the journal's clock.
        self._clock = journal_clock(self.journal, clock)
        self._clients: dict[_Group, Client] = {}
        self._stopping = threading.Event()
        self._last_waiting: tuple[int, int, int, int] | None = None
        self._escalated: set[tuple[str, float]] = set()
        """The (intent, time it went unknown) pairs known escalated in the journal: not
        written again on every pass."""
        self._plain_url_for: str | None = provider
        """The one provider ``base_url`` serves, once known."""
        self._plain_url_shared = False
        """``base_url`` was first seen to serve several providers: it serves none."""
        self._said: dict[_Group, tuple[str, float]] = {}
        """Why each group was not driven, and when that was last said at ERROR."""
        self._damage_said: dict[tuple[str, str], float] = {}
        """When each damaged row (its key, what is wrong) was last said at ERROR."""

    # -- running -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Drain: take no new intent; the pass ends once the ones being driven are done.
        Safe to call from a signal handler."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def run(
        self, *, interval: float = 5.0, once: bool = False, start_after: float = 0.0
    ) -> WorkerPassEnded | None:
        """Pass after pass, ``interval`` seconds apart, until ``stop()``; with ``once``, a
        single pass; the first after ``start_after`` seconds. Returns the last pass's counts
        (None when stopped before any)."""
        last: WorkerPassEnded | None = None
        if start_after:
            self._stopping.wait(start_after)
        while not self._stopping.is_set():
            try:
                last = self.run_pass()
            except JournalError as exc:
                if once:
                    raise
                # The journal unreachable for a moment, or refusing this role a privilege:
                # the error says what to do, once per pass; the next pass tries again.
                _say_failed(f"the pass failed: {exc}; the next one in {interval:g} s")
            except Exception:
                if once:
                    raise
                logger.exception("worker: the pass failed; the next one in %g s", interval)
            if once:
                break
            self._stopping.wait(interval)
        return last

    def run_pass(self) -> WorkerPassEnded:
        """One pass over every group of intents; its counts are logged and told to hooks."""
        began = time.monotonic()
        counts = _Counts()
        driven: list[Client] = []
        groups, damaged = self._groups()
        journal_errors: set[str] = set()
        for row in damaged:
            self._say_damaged(row)
        self._pin_shared_settings(groups)
        for group in groups:
            if self._stopping.is_set():
                break
            client = self._client(group, counts)
            if client is None:
                continue
            driven.append(client)
            try:
                self._reconcile_due(client, counts)
                self._send_pending(client, counts)
            except JournalError as exc:
                # The journal unreachable, or a privilege it needs revoked: this group's
                # pass is over, not the worker. The error says what to do: no traceback,
                # and once a pass, though every group meets it.
                counts.add(failed=1)
                if str(exc) not in journal_errors:
                    journal_errors.add(str(exc))
                    _say_failed(f"{group.label}: the pass failed: {exc}")
            except Exception:
                # A bug: this group's pass is over, not the worker.
                counts.add(failed=1)
                logger.exception("worker: %s: the pass failed", group.label)
        counts.unknown = sum(len(client.unknown()) for client in driven)
        wanted = set(groups)
        pending_left = sum(
            _Group(r.provider, r.account) in wanted
            for r in self.journal.list_intents(states=[IntentState.PENDING])
        )
        ended = WorkerPassEnded(
            sent=counts.sent,
            settled=counts.settled,
            unknown=counts.unknown,
            escalated=counts.escalated,
            failed=counts.failed,
            seconds=time.monotonic() - began,
            pending=pending_left,
            not_driven=counts.not_driven,
            driven=len(driven),
            damaged=len(damaged),
        )
        busy = ended.sent or ended.settled or ended.escalated or ended.failed
        # An idle pass (nothing done, nothing new waiting) is said at DEBUG: a worker
        # passing every few seconds would otherwise bury the lines that matter.
        waiting = (ended.unknown, ended.pending, ended.not_driven, ended.damaged)
        quiet = not busy and waiting == self._last_waiting
        self._last_waiting = waiting
        logger.log(
            logging.DEBUG if quiet else logging.INFO,
            "worker pass: %d sent, %d settled, %d still pending, %d still unknown, "
            "%d escalated, %d failed%s%s",
            ended.sent,
            ended.settled,
            ended.pending,
            ended.unknown,
            ended.escalated,
            ended.failed,
            f", {ended.not_driven} account(s) not driven" if ended.not_driven else "",
            f", {ended.damaged} damaged row(s) skipped" if ended.damaged else "",
        )
        if self._hooks:
            self._hooks.emit(Hooks.worker_pass, ended)
        return ended

    # -- groups and their clients ------------------------------------------------------------

    def _groups(self) -> tuple[list[_Group], list[DamagedRow]]:
        """The groups with pending or unknown intents, and those intents' rows that no
        longer decode (of the groups this worker drives, or of none it can tell)."""
        records = self.journal.list_intents(states=[IntentState.PENDING, IntentState.UNKNOWN])
        groups = {
            _Group(r.provider, r.account)
            for r in records
            if self._provider in (None, r.provider) and self._account in (None, r.account)
        }
        damaged = [
            row
            for row in records.damaged
            if self._provider in (None, row.provider) and self._account in (None, row.account)
        ]
        return sorted(groups), damaged

    def _say_damaged(self, row: DamagedRow) -> None:
        """An ERROR line for a row that no longer decodes, again only after an hour: the
        worker meets it on every pass."""
        said = (row.key, row.problem)
        now = time.monotonic()
        last = self._damage_said.get(said)
        if last is None or now - last >= _SAY_AGAIN_AFTER:
            self._damage_said[said] = now
            say_damaged(row)
        else:
            logger.debug("worker: intent %s: its journal row is still damaged", row.key)

    def _pin_shared_settings(self, groups: Sequence[_Group]) -> None:
        """The first time the journal holds work for several providers: the one provider the
        plain base URL serves. Several at once: none is guessed (sending one provider's
        intents to another's URL may fail them for good). Which account ``PAYONCE_API_KEY``
        serves is ``recovery_api_key``'s rule, as for `payonce resume` and `reconcile`."""
        plain_url_unpinned = self._plain_url_for is None and not self._plain_url_shared
        if self._base_url is not None and plain_url_unpinned:
            unserved = {g.provider for g in groups if g.provider not in self._base_urls}
            if len(unserved) == 1:
                (self._plain_url_for,) = unserved
            elif unserved:
                self._plain_url_shared = True

    def _client(self, group: _Group, counts: _Counts) -> Client | None:
        """The group's client, made once; None (said, and counted not driven) when it cannot
        be made this pass: no base URL of its own, no API key of its own, a profile this
        process does not know."""
        if (client := self._clients.get(group)) is not None:
            return client
        base_url = self._base_urls.get(group.provider)
        if base_url is None and group.provider == self._plain_url_for:
            base_url = self._base_url
        if base_url is None:
            problem = f"no base URL for provider {group.provider!r}: give it one "
            if self._base_url is not None and self._plain_url_for is not None:
                problem += f"(the plain base URL is provider {self._plain_url_for!r}'s): "
            elif self._base_url is not None:
                problem += "(the journal holds intents of several providers: a plain base URL "
                problem += "would send one's to another's): "
            problem += f"--base-url {group.provider}=URL"
        else:
            try:
                # PAYONCE_API_KEY only for the account named; else the keyring. Each intent
                # is sent with the key of the fingerprint it journaled only (the client's).
                api_key = self._key_of(group)
                client = Client(
                    base_url=base_url,
                    provider=group.provider,  # a name this process does not know: said why
                    account=group.account,
                    api_key=api_key,
                    transport_only=api_key is None,
                    recovery_keys=self._recovery_keys,
                    journal=self.journal,
                    retry=self._retry,
                    timeout=self._timeout,
                    hooks=self._hook_list,
                    clock=self._wall_clock,  # the client reads it as the journal's itself
                )
            except ConfigurationError as exc:
                problem = str(exc)
            else:
                self._clients[group] = client
                return client
        counts.add(not_driven=1)
        now = time.monotonic()
        said = self._said.get(group)
        if said is None or said[0] != problem or now - said[1] >= _SAY_AGAIN_AFTER:
            self._said[group] = (problem, now)
            logger.error("worker: %s not driven: %s", group.label, problem)
        else:
            logger.debug("worker: %s still not driven: %s", group.label, problem)
        return None

    def _key_of(self, group: _Group) -> str | None:
        """The group's API key (``recovery_api_key``'s rule); None, when it has none, if
        keys were handed to the worker (``recovery_keys``), which then serve alone."""
        records = self.journal.list_intents(states=[IntentState.PENDING, IntentState.UNKNOWN])
        wanted = [
            r.credential
            for r in records
            if r.provider == group.provider and r.account == group.account
        ]
        try:
            return recovery_api_key(group.account, named=self._account, wanted=wanted)
        except ConfigurationError:
            if self._recovery_keys is None:
                raise
            return None

    # -- sending -----------------------------------------------------------------------------

    def _send_pending(self, client: Client, counts: _Counts) -> None:
        batch = ResumeBatch(client._core)
        attempts_before: dict[str, int] = {}
        """Each claimed intent's attempts when claimed: "sent" counts only those of which
        an attempt went out (one gone unknown unsent, its key too old or drawn per call, is
        no send)."""

        def resume(target: Claimed) -> ResumeResult:
            attempts_before[target.record.key] = target.record.attempt_count
            return client._resume(batch, target)

        def counted(result: ResumeResult) -> None:
            if result.damaged:
                return  # counted as the pass read its groups
            now = self.journal.get(result.key)
            before = attempts_before.pop(result.key, None)
            sent = now is not None and before is not None and now.attempt_count > before
            counts.add(
                sent=int(sent),
                settled=result.state in _SETTLED,
                failed=result.state is IntentState.PENDING,
            )

        self._share(batch, resume, counted)

    # -- reconciling -------------------------------------------------------------------------

    def _decision(self, client: Client, record: IntentRecord, now: float) -> ScheduleDecision:
        profile = client.provider
        attempts = self.journal.attempts(record.key)
        reconciliations = self.journal.reconciliations(record.key)
        since = unknown_since(record, attempts)
        tries = tries_since(
            since,
            reconciliations,
            current_since=current_clock_since(record, attempts, now),
            now=now,
        )
        return decide_lookup(
            profile.reconcile_schedule,
            since=since,
            tries=tries,
            now=now,
            can_look_up=profile.lookup is not None,
            first_since=first_unknown_since(since, attempts, reconciliations),
            earlier_tries=len(reconciliations) - len(tries),
        )

    def _resend_decision(
        self, schedule: ReconcileSchedule, record: IntentRecord, now: float
    ) -> ScheduleDecision:
        """An unknown intent of a profile without a status look-up: resent while its key
        window is open, with backoff between failed resends (``decide_resend``)."""
        reconciliations = self.journal.reconciliations(record.key)
        resent_at: list[float] = []
        for reconciliation in reversed(reconciliations):
            if reconciliation.outcome != ReconcileOutcome.RESENT:
                break
            resent_at.append(reconciliation.at)
        # The journaled "key window passed" (a reconciliation still unknown, by a call
        # again, reconcile or a worker): never resent again, escalated (once, journaled).
        passed = bool(reconciliations) and (
            reconciliations[-1].outcome == ReconcileOutcome.STILL_UNKNOWN
        )
        return decide_resend(schedule, resent_at=resent_at, window_passed=passed, now=now)

    def _reconcile_due(self, client: Client, counts: _Counts) -> None:
        now = self._clock()
        due: list[IntentRecord] = []
        resends = client.provider.lookup is None
        for record in client.unknown():
            if resends:
                # No status look-up to wait for: resent under its key while the key is
                # surely remembered, again with backoff while the resends fail; once the
                # drive finds the window passed (journaled), escalated once, below.
                schedule = client.provider.reconcile_schedule
                resend = self._resend_decision(schedule, record, now)
                if resend.due:
                    due.append(record)
                elif resend.exhausted:
                    self._escalate(client, record, resend, counts)
                continue
            decision = self._decision(client, record, now)
            if decision.due:
                due.append(record)
            elif decision.exhausted:
                self._escalate(client, record, decision, counts)
        if not due:
            return

        def counted(result: ReconcileResult) -> None:
            if result.after in _SETTLED:
                counts.add(settled=1)
            elif result.outcome == ReconcileOutcome.ERROR:
                counts.add(failed=1)
            if resends:
                # Escalated once the key window passed; a resend that failed within it is
                # tried again on a later pass, with backoff.
                if result.outcome == ReconcileOutcome.STILL_UNKNOWN:
                    current = self.journal.get(result.key)
                    if current is not None and current.state is IntentState.UNKNOWN:
                        tries = len(self.journal.reconciliations(result.key))
                        spent = ScheduleDecision(tries, due=False, next_at=None, exhausted=True)
                        self._escalate(client, current, spent, counts)
            elif result.after is IntentState.UNKNOWN:
                current = self.journal.get(result.key)
                if current is not None and current.state is IntentState.UNKNOWN:
                    decision = self._decision(client, current, self._clock())
                    if decision.exhausted:
                        self._escalate(client, current, decision, counts)

        batch = ReconcileBatch(client._core, None, targets=due)
        self._share(batch, client._reconcile, counted)

    def _escalate(
        self, client: Client, record: IntentRecord, decision: ScheduleDecision, counts: _Counts
    ) -> None:
        since = unknown_since(record, self.journal.attempts(record.key))
        if (record.key, since) in self._escalated:
            return
        found = self.journal.reconciliations(record.key)
        reason = found[-1].detail if found else (record.unknown_reason or "no look-up made")
        # Journaled first, and said only by the worker whose write made it: once each time
        # the intent went unknown, across restarts and the workers sharing the journal.
        escalated = client._core.store.escalate(
            record.key, unknown_since=since, now=self._clock(), tries=decision.tries, reason=reason
        )
        self._escalated.add((record.key, since))
        if not escalated:
            return
        counts.add(escalated=1)
        if client.provider.lookup is None:
            # Past its key window, with nothing to ask: no more resends, and `payonce
            # reconcile` cannot settle it either (the reason names `--resend` where an
            # operator may still resend it).
            remedy = unknown_remedy(
                record.key,
                reconcilable=False,
                key_gone=True,
                step=step_of_reference(record.reference) is not None,
            )
            logger.error(
                "intent %s escalated: its outcome is still unknown (%s); payonce no longer "
                "resends it. %s",
                record.key,
                reason,
                remedy,
                extra=log_extra(record),
            )
        else:
            logger.error(
                "intent %s escalated: its outcome is still unknown after %d look-up(s) (%s); "
                "check it at the provider, then `payonce reconcile %s` or `payonce abandon %s`",
                record.key,
                decision.tries,
                reason,
                record.key,
                record.key,
                extra=log_extra(record),
            )
        if self._hooks:
            event = IntentEscalated(
                **about(record), tries=decision.tries, unknown_since=since, reason=reason
            )
            self._hooks.emit(Hooks.escalated, event)

    # -- threads -----------------------------------------------------------------------------

    def _share(
        self,
        batch: Batch[T, R],
        drive: Callable[[T], R],
        on_result: Callable[[R], object],
    ) -> None:
        """Run ``batch`` with ``concurrency`` threads taking its targets in turn; the first
        error one of them met outside an intent's drive (reading the next target) is
        raised once all are done."""
        shared = _Shared(batch, self._stopping)
        # Each damaged row was said already, as the pass read its groups.
        say: Callable[[DamagedRow], None] = self._say_damaged
        if self._concurrency == 1:
            run_batch(shared, drive, on_result, on_damaged=say)
            return
        errors: list[BaseException] = []

        def work() -> None:
            try:
                run_batch(shared, drive, on_result, on_damaged=say)
            except BaseException as exc:  # raised again in the calling thread
                errors.append(exc)

        threads = [
            threading.Thread(target=work, name=f"payonce-worker-{n}", daemon=True)
            for n in range(self._concurrency)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():  # in slices: the main thread stays free for signals
                thread.join(0.25)
        if errors:
            raise errors[0]

    # -- closing -----------------------------------------------------------------------------

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        if self._owns_journal:
            self.journal.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
