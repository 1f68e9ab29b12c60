"""``payonce.AsyncClient``: the same decisions as ``Client``, awaited.

Only the I/O edge differs: httpx.AsyncClient sends, asyncio sleeps, and every journal call
(an fsync may take milliseconds) runs in a worker thread so the event loop never blocks on
the disk. Runs under asyncio; trio is not supported (the journal hand-off uses
``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

import httpx
import tenacity

from . import _reconcile
from ._client import IN_FLIGHT_POLL, LeaseRenewer, _BaseClient, _OperationBase
from ._core import IntentCore, Replay, ResumeResult, RetryExhausted, Run, Wait, new_owner
from ._journal import IntentDraft, IntentRecord
from ._reconcile import ReconcileResult
from .errors import PayonceError

__all__ = ["AsyncClient", "AsyncOperation"]

P = ParamSpec("P")
T = TypeVar("T")


async def _off_loop(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    return await asyncio.to_thread(function, *args, **kwargs)


class AsyncOperation(_OperationBase):
    """``async with client.intent(reference) as op: await op.post(...)``."""

    def __init__(
        self, client: AsyncClient, reference: str | None, key: str | None, acknowledge: bool
    ) -> None:
        super().__init__(client, reference, key, acknowledge)
        self._client = client

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send the intent's request (once), or replay its journaled outcome."""
        return await self._client._drive(self, self._draft(method, path, **kwargs))

    async def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return await self.request("POST", path, **kwargs)

    async def put(self, path: str, **kwargs: Any) -> httpx.Response:
        return await self.request("PUT", path, **kwargs)

    async def patch(self, path: str, **kwargs: Any) -> httpx.Response:
        return await self.request("PATCH", path, **kwargs)

    async def delete(self, path: str, **kwargs: Any) -> httpx.Response:
        return await self.request("DELETE", path, **kwargs)

    async def acknowledge(self) -> None:
        """Mark the settled outcome as recorded on the caller's side."""
        if self._key is not None:
            await self._client.acknowledge(self._key)

    async def __aenter__(self) -> AsyncOperation:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._acknowledge_on_exit(exc_type):
            await _off_loop(self._acknowledge_quietly)


class AsyncClient(_BaseClient):
    """The asyncio twin of ``payonce.Client``: same options, same guarantees."""

    def __init__(
        self, *, transport: httpx.AsyncBaseTransport | None = None, **options: Any
    ) -> None:
        super().__init__(**options)
        self._http = httpx.AsyncClient(transport=transport, **self._http_options())
        self._renewer = _TaskLeaseRenewer(self._core)

    def intent(
        self, reference: str | None = None, *, key: str | None = None, acknowledge: bool = True
    ) -> AsyncOperation:
        """The async context manager for one business operation (see ``Client.intent``)."""
        return AsyncOperation(self, reference, key, acknowledge)

    async def request(
        self,
        method: str,
        path: str,
        *,
        reference: str | None = None,
        key: str | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        async with self.intent(reference, key=key) as op:
            return await op.request(method, path, **kwargs)

    async def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return await self.request("POST", path, **kwargs)

    # -- after a crash -----------------------------------------------------------------------

    async def resume(self) -> list[ResumeResult]:
        """See ``Client.resume``."""
        core = self._core
        results: list[ResumeResult] = []
        after: tuple[float, str] | None = None
        while True:
            owner = new_owner()
            claim = await _off_loop(core.claim_next_resumable, owner, after)
            if claim is None:
                return results
            record = claim.record
            after = (record.created_at, record.key)
            response, error = None, None
            try:
                run = await _off_loop(core.resume_claimed, claim, owner)
                response = await self._send(run)
            except PayonceError as exc:
                error = exc
            results.append(await _off_loop(core.resume_result, record, response, error))

    async def reconcile(self, key_or_reference: str) -> list[ReconcileResult]:
        records = await _off_loop(_reconcile.targets, self._core, key_or_reference)
        return [await self._reconcile(record) for record in records]

    async def reconcile_all(self) -> list[ReconcileResult]:
        records = await _off_loop(_reconcile.targets, self._core, None)
        return [await self._reconcile(record) for record in records]

    async def _reconcile(self, record: IntentRecord) -> ReconcileResult:
        core = self._core
        owner = new_owner()
        claimed = await _off_loop(_reconcile.begin, core, record, owner)
        if isinstance(claimed, ReconcileResult):
            return claimed
        try:
            async for attempt in tenacity.AsyncRetrying(**core.retrying_kwargs(None)):
                with attempt:
                    request = _reconcile.lookup_request(core, claimed, self._http)
                    try:
                        response = await self._http.send(request)
                    except httpx.TransportError as exc:
                        raise _reconcile.transport_failure(exc) from exc
                    return await _off_loop(_reconcile.conclude, core, claimed, owner, response)
        except RetryExhausted as exc:
            return await _off_loop(_reconcile.give_up, core, claimed, owner, str(exc))
        finally:
            await _off_loop(core.journal.release, record.key, owner=owner)
        raise AssertionError("unreachable: tenacity either returns or raises")

    async def abandon(self, key: str, *, reason: str) -> IntentRecord:
        return await _off_loop(self.journal.abandon, key, reason=reason, now=self._core.clock())

    async def acknowledge(self, key: str) -> IntentRecord:
        return await _off_loop(self.journal.acknowledge, key, now=self._core.clock())

    async def unacknowledged(self) -> list[IntentRecord]:
        return await _off_loop(self.journal.unacknowledged, account=self.account)

    # -- sending -----------------------------------------------------------------------------

    async def _drive(self, op: AsyncOperation, draft: IntentDraft) -> httpx.Response:
        core = self._core
        owner = new_owner()
        deadline = time.monotonic() + self._in_flight_wait
        step = await _off_loop(core.begin, draft, owner)
        while isinstance(step, Wait):
            if time.monotonic() >= deadline:
                raise core.in_flight(step.record)
            await asyncio.sleep(IN_FLIGHT_POLL)
            step = await _off_loop(core.begin, draft, owner)
        op._bind(step.record)
        if isinstance(step, Replay):
            return step.response
        return await self._send(step)

    async def _send(self, run: Run) -> httpx.Response:
        try:
            async with self._renewer.holding(run):
                return await self._attempts(run)
        except RetryExhausted:
            raise await _off_loop(self._core.give_up, run) from None

    async def _attempts(self, run: Run) -> httpx.Response:
        core = self._core
        async for attempt in tenacity.AsyncRetrying(**core.retrying_kwargs(run)):
            with attempt:
                if not run.started:  # the claim journaled the first attempt's start
                    await _off_loop(core.start_attempt, run)
                request = core.build_request(run, self._http)
                try:
                    response = await self._http.send(request)
                except Exception as exc:
                    await _off_loop(core.on_error, run, exc)
                    raise
                except BaseException as exc:
                    # Cancelled mid-attempt (a timeout, a caller that went away): journal the
                    # attempt as ambiguous and give the lease back now, without awaiting.
                    core.on_error(run, exc)
                    raise
                return await _off_loop(core.on_response, run, response)
        raise AssertionError("unreachable: tenacity either returns or raises")

    async def aclose(self) -> None:
        await self._renewer.aclose()
        await self._http.aclose()
        if self._owns_journal:
            await _off_loop(self.journal.close)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _TaskLeaseRenewer(LeaseRenewer):
    def __init__(self, core: IntentCore) -> None:
        super().__init__(core)
        self._task: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def holding(self, run: Run) -> AsyncIterator[None]:
        self.track(run)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._tick())
        try:
            yield
        finally:
            self.untrack(run)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await _off_loop(self.renew_all)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
