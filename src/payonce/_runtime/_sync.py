"""``payonce.Client`` and its per-operation context manager: the sync I/O edge.

Every decision is ``IntentCore``'s; this module sends bytes with httpx, sleeps with
``time.sleep`` and keeps leases alive from a thread. ``_async`` is its awaited twin.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Unpack

import httpx

from .._journal._records import IntentDraft, IntentRecord
from .._lifecycle import LOOKUP_FAILURES
from .._owners import new_owner
from . import _reconcile, _verifying
from . import _refusals as refusals
from ._base import BaseClient, OneShotOptions, OneShotVerbs, OperationBase, RequestOptions, Verbs
from ._batch import ReconcileBatch, ResumeBatch, ResumeResult, run_batch
from ._core import Replay, Run, Wait
from ._deadline import Deadline
from ._lease_keeper import ThreadLeaseKeeper
from ._reconcile import ReconcileResult
from ._retrying import Attempts, Retry

__all__ = ["IN_FLIGHT_POLL", "Client", "Operation"]

IN_FLIGHT_POLL = 0.05
"""Seconds between looks at an intent another worker is sending."""


class Operation(OperationBase, Verbs[httpx.Response]):
    """One business intent: every request made through it is the same intent, sent once.

    Created by ``client.intent(reference)``. ``key`` is known once the first request has
    been journaled (or at once, when the caller supplied it).
    """

    def __init__(
        self, client: Client, reference: str | None, key: str | None, acknowledge: bool
    ) -> None:
        super().__init__(client, reference, key, acknowledge)
        self._client = client

    def request(self, method: str, path: str, **options: Unpack[RequestOptions]) -> httpx.Response:
        """Send the intent's request (once), or replay its journaled outcome.

        Takes ``json=``, ``data=`` (form), ``content=``, ``params=`` and ``headers=``.
        """
        return self._client._drive(self, self._draft(method, path, options))

    def acknowledge(self) -> None:
        """Mark the settled outcome as recorded on the caller's side."""
        if self._key is not None:
            self._client.acknowledge(self._key)

    def __enter__(self) -> Operation:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self._exit(exc_type)


class Client(BaseClient[httpx.BaseTransport, Operation], OneShotVerbs[httpx.Response]):
    """A payment-provider client whose every operation takes effect exactly once.

    ``AsyncClient`` takes the same options; see ``__init__`` for each of them.
    """

    _operation = Operation
    _http: httpx.Client
    _keeper: ThreadLeaseKeeper

    def _connect(self, transport: httpx.BaseTransport | None, options: dict[str, Any]) -> None:
        self._http = httpx.Client(transport=transport, **options)
        self._keeper = ThreadLeaseKeeper(self._core.lease_seconds / 3)

    def request(self, method: str, path: str, **options: Unpack[OneShotOptions]) -> httpx.Response:
        """A one-shot operation: ``client.post(path, json=..., reference="order-42")``.

        Takes ``reference=`` and ``key=`` besides what ``Operation.request`` takes.
        """
        reference, key, request = self.one_shot(options)
        with self._one_shot_intent(reference, key) as op:
            return op.request(method, path, **request)

    # -- after a crash: resume, reconcile, abandon, acknowledge -------------------------------

    def resume(
        self, *, on_result: Callable[[ResumeResult], object] | None = None
    ) -> list[ResumeResult]:
        """Drive every pending intent of this account that no live worker holds to an end.

        Each is resent with its stored bytes under its key, unless an attempt may have
        reached the provider longer ago than the key lifetime allows: then it goes unknown.
        One intent's failure, whatever it is, never stops the rest: it is logged with its
        key and reported in its result. ``on_result`` sees each result as it comes.
        """
        self._in_this_process()
        batch = ResumeBatch(self._core)

        def drive(target: Any) -> ResumeResult:
            return batch.settled(target, self._send(batch.run(target)))

        return run_batch(batch, drive, on_result)

    def reconcile(
        self,
        key_or_reference: str,
        *,
        on_result: Callable[[ReconcileResult], object] | None = None,
    ) -> list[ReconcileResult]:
        """Ask the provider about the unknown intent(s) with this key or reference."""
        self._in_this_process()
        return run_batch(ReconcileBatch(self._core, key_or_reference), self._reconcile, on_result)

    def reconcile_all(
        self, *, on_result: Callable[[ReconcileResult], object] | None = None
    ) -> list[ReconcileResult]:
        """Reconcile every unknown intent of this account and provider, oldest first; one
        intent's failure never stops the rest."""
        self._in_this_process()
        return run_batch(ReconcileBatch(self._core, None), self._reconcile, on_result)

    def _reconcile(self, record: IntentRecord) -> ReconcileResult:
        core = self._core
        claimed = _reconcile.begin(core, record, owner := new_owner())
        if isinstance(claimed, ReconcileResult):
            return claimed
        try:
            for attempt in Attempts(core.retrying, None):
                with attempt:
                    request = _reconcile.lookup_request(core, claimed, self._http)
                    try:
                        response = self._exchange(request)
                    except LOOKUP_FAILURES as exc:
                        raise _reconcile.transport_failure(core, claimed, exc) from exc
                    return _reconcile.conclude(core, claimed, owner, response)
        except Retry as exc:
            return _reconcile.give_up(core, claimed, owner, str(exc))
        finally:
            _reconcile.end(core, record.key, owner)
        raise AssertionError("unreachable: tenacity either returns or raises")

    def abandon(self, key: str, *, reason: str) -> IntentRecord:
        """Close a pending or unknown intent for good, as an operator decision."""
        return self.journal.abandon(key, reason=reason, now=self._core.clock())

    def acknowledge(self, key: str) -> IntentRecord:
        """The caller has recorded this intent's settled outcome on its side."""
        return self.journal.acknowledge(key, now=self._core.clock())

    def unknown(self) -> list[IntentRecord]:
        """The unknown intents of this account and provider, oldest first: what
        ``reconcile_all()`` drives."""
        return _reconcile.targets(self._core, None)

    def unacknowledged(self) -> list[IntentRecord]:
        """Settled intents of this account whose outcome the caller has not acknowledged."""
        return self.journal.unacknowledged(account=self.account)

    # -- sending -----------------------------------------------------------------------------

    def _drive(self, op: Operation, draft: IntentDraft) -> httpx.Response:
        self._in_this_process()
        core = self._core
        owner = new_owner()
        deadline = self._deadline()
        step = core.begin(draft, owner)
        while isinstance(step, Wait):
            if time.monotonic() >= deadline:
                raise refusals.in_flight(step.record)
            time.sleep(IN_FLIGHT_POLL)
            step = core.begin(draft, owner)
        op._start(step)
        if isinstance(step, Replay):
            return step.response
        try:
            return self._send(step)
        finally:
            op._bind(step.record)

    def _send(self, run: Run) -> httpx.Response:
        self._core.drive_started(run)
        failure = None
        try:
            try:
                with self._keeper.holding(self._core.lease(run)):
                    return self._attempts(run)
            except Retry:
                raise self._core.give_up(run) from None
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self._core.run_over(run, failure)
            self._core.drive_ended(run)

    def _attempts(self, run: Run) -> httpx.Response:
        for attempt in Attempts(self._core.retrying, run):
            with attempt:
                return self._attempt(run)
        raise AssertionError("unreachable: tenacity either returns or raises")

    def _attempt(self, run: Run) -> httpx.Response:
        core = self._core
        if run.verification is not None and (found := self._verified(run)):
            return found
        core.start_attempt(run)
        try:
            request = core.build_request(run, self._http)
            response = self._exchange(request)
        except BaseException as exc:  # KeyboardInterrupt too: give the lease back
            core.on_error(run, exc)
            raise
        return core.on_response(run, response)

    def _verified(self, run: Run) -> httpx.Response | None:
        """Verify before resend: look the intent up until its record settles it (returned)
        or nothing found after the earlier attempt can no longer run lets it be resent."""
        core = self._core
        while (step := _verifying.step(core, run)) is not None:
            if isinstance(step, float):
                time.sleep(step)
                continue
            try:
                response = self._exchange(_reconcile.lookup_request(core, run.record, self._http))
            except LOOKUP_FAILURES as exc:
                _verifying.lookup_failed(core, run, exc)
                continue
            if (settled := _verifying.looked_up(core, run, response)) is not None:
                return settled
        return None

    def _exchange(self, request: httpx.Request) -> httpx.Response:
        """One request and its whole answer, within the exchange's total deadline."""
        deadline = Deadline.start(self._attempt_timeout)
        deadline.bound_waits(request)
        response = self._http.send(request, stream=True)
        try:
            deadline.read(response)
        except BaseException:
            response.close()
            raise
        return response

    def close(self) -> None:
        self._in_this_process()  # a child closes its own HTTP client, never its parent's
        self._keeper.close()
        self._http.close()
        self._stop_watching()
        if self._owns_journal:
            self.journal.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
