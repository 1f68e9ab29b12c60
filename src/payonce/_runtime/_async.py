"""``payonce.AsyncClient``: the same decisions as ``Client``, awaited.

Only the I/O edge differs: httpx.AsyncClient sends, asyncio sleeps, leases are kept alive
from a task, and every journal call (an fsync may take milliseconds) runs in one of
payonce's journal threads (``_journal_threads``) so the event loop never blocks on the
disk. Runs under asyncio; trio is not supported (the hand-off answers through the asyncio
loop).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar, Unpack

import httpx

from .._journal._records import IntentDraft, IntentRecord
from .._lifecycle import LOOKUP_FAILURES
from .._owners import new_owner
from . import _reconcile, _verifying
from . import _refusals as refusals
from ._base import BaseClient, OneShotOptions, OneShotVerbs, OperationBase, RequestOptions, Verbs
from ._batch import Claimed, ReconcileBatch, ResumeBatch, ResumeResult, arun_batch
from ._core import Replay, Run, Wait
from ._deadline import Deadline
from ._journal_threads import off_loop
from ._lease_task import TaskLeaseKeeper
from ._reconcile import ReconcileResult
from ._retrying import Attempts, Retry
from ._sync import IN_FLIGHT_POLL

__all__ = ["AsyncClient", "AsyncOperation"]

P = ParamSpec("P")
T = TypeVar("T")
Awaited = Coroutine[Any, Any, httpx.Response]


async def _off_loop(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    return await off_loop(function, *args, **kwargs)


class AsyncOperation(OperationBase, Verbs[Awaited]):
    """``async with client.intent(reference) as op: await op.post(...)``."""

    def __init__(
        self, client: AsyncClient, reference: str | None, key: str | None, acknowledge: bool
    ) -> None:
        super().__init__(client, reference, key, acknowledge)
        self._client = client

    async def request(
        self, method: str, path: str, **options: Unpack[RequestOptions]
    ) -> httpx.Response:
        """Send the intent's request (once), or replay its journaled outcome."""
        return await self._client._drive(self, self._draft(method, path, options))

    async def acknowledge(self) -> None:
        """Mark the settled outcome as recorded on the caller's side."""
        if self._key is not None:
            await self._client.acknowledge(self._key)

    async def __aenter__(self) -> AsyncOperation:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self._exit(exc_type)


class AsyncClient(BaseClient[httpx.AsyncBaseTransport, AsyncOperation], OneShotVerbs[Awaited]):
    """The asyncio twin of ``payonce.Client``: same options, same guarantees."""

    _operation = AsyncOperation
    _http: httpx.AsyncClient
    _keeper: TaskLeaseKeeper

    def _connect(self, transport: httpx.AsyncBaseTransport | None, options: dict[str, Any]) -> None:
        self._http = httpx.AsyncClient(transport=transport, **options)
        self._keeper = TaskLeaseKeeper(self._core.lease_seconds / 3)

    async def request(
        self, method: str, path: str, **options: Unpack[OneShotOptions]
    ) -> httpx.Response:
        """A one-shot operation (see ``Client.request``)."""
        reference, key, request = self.one_shot(options)
        async with self._one_shot_intent(reference, key) as op:
            return await op.request(method, path, **request)

    # -- after a crash -----------------------------------------------------------------------

    async def resume(
        self, *, on_result: Callable[[ResumeResult], object] | None = None
    ) -> list[ResumeResult]:
        """See ``Client.resume``."""
        self._in_this_process()
        batch = ResumeBatch(self._core)

        async def drive(target: Claimed) -> ResumeResult:
            run = await _off_loop(batch.run, target)
            return batch.settled(target, await self._send(run))

        return await arun_batch(batch, drive, on_result)

    async def reconcile(
        self,
        key_or_reference: str,
        *,
        on_result: Callable[[ReconcileResult], object] | None = None,
    ) -> list[ReconcileResult]:
        """See ``Client.reconcile``."""
        self._in_this_process()
        batch = ReconcileBatch(self._core, key_or_reference)
        return await arun_batch(batch, self._reconcile, on_result)

    async def reconcile_all(
        self, *, on_result: Callable[[ReconcileResult], object] | None = None
    ) -> list[ReconcileResult]:
        """See ``Client.reconcile_all``."""
        self._in_this_process()
        return await arun_batch(ReconcileBatch(self._core, None), self._reconcile, on_result)

    async def _reconcile(self, record: IntentRecord) -> ReconcileResult:
        core = self._core
        owner = new_owner()
        claimed = await _off_loop(_reconcile.begin, core, record, owner)
        if isinstance(claimed, ReconcileResult):
            return claimed
        try:
            async for attempt in Attempts(core.retrying, None):
                with attempt:
                    request = _reconcile.lookup_request(core, claimed, self._http)
                    try:
                        response = await self._exchange(request)
                    except LOOKUP_FAILURES as exc:
                        raise _reconcile.transport_failure(core, claimed, exc) from exc
                    return await _off_loop(_reconcile.conclude, core, claimed, owner, response)
        except Retry as exc:
            return await _off_loop(_reconcile.give_up, core, claimed, owner, str(exc))
        finally:
            await _off_loop(_reconcile.end, core, record.key, owner)
        raise AssertionError("unreachable: tenacity either returns or raises")

    async def abandon(self, key: str, *, reason: str) -> IntentRecord:
        return await _off_loop(self.journal.abandon, key, reason=reason, now=self._core.clock())

    async def acknowledge(self, key: str) -> IntentRecord:
        return await _off_loop(self.journal.acknowledge, key, now=self._core.clock())

    async def unknown(self) -> list[IntentRecord]:
        """See ``Client.unknown``."""
        return await _off_loop(_reconcile.targets, self._core, None)

    async def unacknowledged(self) -> list[IntentRecord]:
        return await _off_loop(self.journal.unacknowledged, account=self.account)

    # -- sending -----------------------------------------------------------------------------

    async def _drive(self, op: AsyncOperation, draft: IntentDraft) -> httpx.Response:
        self._in_this_process()
        core = self._core
        owner = new_owner()
        deadline = self._deadline()
        step = await _off_loop(core.begin, draft, owner)
        while isinstance(step, Wait):
            if time.monotonic() >= deadline:
                raise refusals.in_flight(step.record)
            await asyncio.sleep(IN_FLIGHT_POLL)
            step = await _off_loop(core.begin, draft, owner)
        op._start(step)
        if isinstance(step, Replay):
            return step.response
        try:
            return await self._send(step)
        finally:
            op._bind(step.record)

    async def _send(self, run: Run) -> httpx.Response:
        self._core.drive_started(run)
        failure = None
        try:
            try:
                async with self._keeper.holding(self._core.lease(run)):
                    return await self._attempts(run)
            except Retry:
                raise await _off_loop(self._core.give_up, run) from None
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self._core.run_over(run, failure)
            self._core.drive_ended(run)

    async def _attempts(self, run: Run) -> httpx.Response:
        async for attempt in Attempts(self._core.retrying, run):
            with attempt:
                return await self._attempt(run)
        raise AssertionError("unreachable: tenacity either returns or raises")

    async def _attempt(self, run: Run) -> httpx.Response:
        core = self._core
        if run.verification is not None and (found := await self._verified(run)):
            return found
        if not run.started:  # the claim journaled the first attempt's start
            await _off_loop(core.start_attempt, run)
        try:
            request = core.build_request(run, self._http)
            response = await self._exchange(request)
        except Exception as exc:
            await _off_loop(core.on_error, run, exc)
            raise
        except BaseException as exc:
            # Cancelled mid-attempt (a timeout, a caller that went away): journal the
            # attempt as ambiguous and give the lease back now, without awaiting.
            core.on_error(run, exc)
            raise
        return await _off_loop(core.on_response, run, response)

    async def _verified(self, run: Run) -> httpx.Response | None:
        """See ``Client._verified``: the same steps, awaited, the journal off the loop."""
        core = self._core
        while (step := _verifying.step(core, run)) is not None:
            if isinstance(step, float):
                await asyncio.sleep(step)
                continue
            request = _reconcile.lookup_request(core, run.record, self._http)
            try:
                response = await self._exchange(request)
            except LOOKUP_FAILURES as exc:
                await _off_loop(_verifying.lookup_failed, core, run, exc)
                continue
            if (settled := await _off_loop(_verifying.looked_up, core, run, response)) is not None:
                return settled
        return None

    async def _exchange(self, request: httpx.Request) -> httpx.Response:
        """One request and its whole answer, within the exchange's total deadline."""
        deadline = Deadline.start(self._attempt_timeout)
        scope = asyncio.timeout(deadline.seconds)
        try:
            async with scope:
                return await self._http.send(request)
        except TimeoutError:
            if scope.expired():
                raise deadline.exceeded(request) from None
            raise

    async def aclose(self) -> None:
        self._in_this_process()  # a child closes its own HTTP client, never its parent's
        await self._keeper.aclose()
        await self._http.aclose()
        self._stop_watching()
        if self._owns_journal:
            await _off_loop(self.journal.close)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
