"""``payonce.AsyncClient``: the async executor, carrying out the same drive as ``Client``.

Only the I/O edge differs: the drive runs on the event loop, httpx.AsyncClient sends,
asyncio sleeps, leases are kept alive from a task. A journal command is a plan
(``IntentCore.journal_plan``): on a journal whose engine has an async edge (PostgreSQL,
psycopg's async connections) its writes run on the event loop itself, with no thread
between; on SQLite (an fsync may take milliseconds, and sqlite3 has no async API) the
command runs in one of payonce's journal threads (``_journal_threads``) so the event loop
never blocks on the disk. Runs under asyncio; trio is not supported.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine, Generator, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar, Unpack, assert_never

import attrs
import httpx

from .._crash import crash_point
from .._journal._plans import AsyncEdge, Write
from .._journal._reads import Outcomes
from .._journal._rows import Intents
from .._lifecycle import IntentDraft, IntentRecord
from .._lifecycle import _drive as drive
from .._owners import new_owner
from ..errors import IntentMismatch
from . import _reconcile
from ._base import (
    BaseClient,
    OneShotOptions,
    OneShotVerbs,
    OperationBase,
    OutsideIntent,
    RequestOptions,
    SdkKeys,
    Verbs,
)
from ._batch import Claimed, ReconcileBatch, ResumeBatch, ResumeResult, arun_batch
from ._core import IntentCore
from ._deadline import Deadline
from ._execution import IN_PROCESS, Execution
from ._journal_threads import off_loop
from ._lease_task import TaskLeaseKeeper
from ._reconcile import ReconcileResult
from ._telling import logger
from ._transport import AsyncTransport, Transported

__all__ = ["AsyncClient", "AsyncOperation"]

P = ParamSpec("P")
T = TypeVar("T")
Awaited = Coroutine[Any, Any, httpx.Response]


async def _off_loop(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    return await off_loop(function, *args, **kwargs)


async def _after_interruption(
    core: IntentCore, command: drive.Command, after: BaseException | None
) -> Any:
    """A journal command of a drive whose send was interrupted (the caller cancelled it,
    a KeyboardInterrupt): it records what may have been sent, so it runs to its end in a
    journal thread while the loop goes on with its other tasks (a database outage may make
    it wait up to ``failover_timeout``, a partition as long as the connection's keepalives
    allow). A further cancellation does not cut it short either: it is taken once the
    write is done, and the caller gets ``CancelledError`` then."""
    write = asyncio.ensure_future(off_loop(core.journal_command, command, after=after))
    cancelled_again = False
    while not write.done():
        try:
            await asyncio.shield(write)
        except asyncio.CancelledError:
            if write.cancelled():  # the loop itself is ending: nobody will hear the answer
                raise
            cancelled_again = True
    if cancelled_again:
        raise asyncio.CancelledError
    return write.result()


async def _on_loop(
    core: IntentCore, edge: AsyncEdge, command: drive.Command, after: BaseException | None
) -> Any:
    """A drive's journal command carried out on the loop: each write of its plan through
    ``edge``, each call the plan has no async form of in a journal thread."""
    plan = core.journal_plan(command)
    answer: Any = None
    try:
        while True:
            try:
                step = plan.send(answer)
            except StopIteration as done:
                return done.value
            if isinstance(step, Write):
                answer = await edge.write(step)
            else:
                answer = await off_loop(step.function)
    except BaseException as exc:
        core.failed(command, exc, after)
        raise
    finally:
        plan.close()


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
        """Send the intent's next step (once), or replay its journaled outcome (see
        ``Operation.request``)."""
        self._core.require_api_key(f"{method.upper()} {path}")
        return await self._placed_and_driven(method, path, options)

    async def _transported(self, request: Transported, http: httpx.AsyncClient) -> httpx.Response:
        """See ``Operation._transported``."""
        return await self._placed_and_driven(
            request.method,
            request.target,
            request.options,
            caller_key=request.caller_key,
            http=http,
            auth=request.auth,
        )

    async def _placed_and_driven(
        self,
        method: str,
        path: str,
        options: RequestOptions,
        *,
        caller_key: str | None = None,
        http: httpx.AsyncClient | None = None,
        auth: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """See ``Operation._placed_and_driven``."""
        while True:
            if self._must_read_steps():
                reading = drive.block_steps(self._core.settings, **self._steps_reading())
                self._read_steps(await self._client._execute(reading))
            try:
                with self._next_step(method, path, options, caller_key=caller_key) as (draft, bind):
                    return await self._client._drive(self, draft, bind, http=http, auth=auth)
            except IntentMismatch:
                if not self._misplaced():
                    raise

    async def acknowledge(self) -> None:
        """Mark the settled outcome of every settled step as recorded on the caller's
        side."""
        for key in self._settled_keys():
            await self._client.acknowledge(key)

    async def __aenter__(self) -> AsyncOperation:
        self._enter()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, *_: object
    ) -> None:
        self._exit(exc_type, exc)


class AsyncClient(BaseClient[httpx.AsyncBaseTransport, AsyncOperation], OneShotVerbs[Awaited]):
    """The asyncio twin of ``payonce.Client``: same options, same guarantees."""

    _operation = AsyncOperation
    _http: httpx.AsyncClient
    _keeper: TaskLeaseKeeper

    _http_loop: asyncio.AbstractEventLoop | None = None

    def _connect(self, transport: httpx.AsyncBaseTransport | None, options: dict[str, Any]) -> None:
        self._http = httpx.AsyncClient(transport=transport, **options)
        self._keeper = TaskLeaseKeeper(self._core.lease_seconds / 3)
        self._http_loop = None

    def _in_this_process(self) -> None:
        super()._in_this_process()
        # httpx's pooled connections and the lease keeper's tasks belong to the event loop
        # they were made on. One client used again by a later ``asyncio.run`` (the first
        # loop closed) would fail on them with a bare RuntimeError, after the write-ahead:
        # an attempt journaled as ambiguous though nothing left the machine. A new loop gets
        # its own, as a forked child does; nothing can still run on a closed loop.
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._http_loop is None:
            self._http_loop = loop
        elif self._http_loop is not loop and self._http_loop.is_closed():
            self._connect(self._transport, self._http_options)
            self._http_loop = loop

    async def request(
        self, method: str, path: str, **options: Unpack[OneShotOptions]
    ) -> httpx.Response:
        """A one-shot operation (see ``Client.request``)."""
        reference, key, request = self.one_shot(options)
        current = self._current_block(method, path, reference, key)
        if current is not None:
            return await current.request(method, path, **request)
        async with self._one_shot_intent(reference, key) as op:
            return await op.request(method, path, **request)

    def transport(
        self,
        inner: httpx.AsyncBaseTransport | None = None,
        *,
        sdk_keys: SdkKeys = "honour",
        outside_intent: OutsideIntent = "journal",
    ) -> httpx.AsyncBaseTransport:
        """An async httpx transport that brings payonce to any httpx-based code:
        ``httpx.AsyncClient(transport=client.transport())``. See ``Client.transport``."""
        return AsyncTransport(
            self, inner, sdk_keys=sdk_keys, outside_intent=outside_intent, verify=self._verify
        )

    # -- after a crash -----------------------------------------------------------------------

    async def enqueue(
        self,
        method: str,
        path: str,
        *,
        reference: str,
        json: Any = None,
        data: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
        headers: Mapping[str, str] | None = None,
        connection: object,
    ) -> IntentRecord:
        """``Client.enqueue``, awaited, through an async connection: a psycopg 3
        ``AsyncConnection``, or an SQLAlchemy ``AsyncConnection`` or ``AsyncSession`` on
        ``postgresql+psycopg_async://`` (``connection=None``: on its own, committed before
        this returns). See docs/outbox.md."""
        self._in_this_process()
        draft = self._outbox_draft(method, path, reference, json, data, headers)
        return await self._outbox.aenqueue(draft, connection)

    async def resume(
        self, *, on_result: Callable[[ResumeResult], object] | None = None
    ) -> list[ResumeResult]:
        """See ``Client.resume``."""
        self._in_this_process()
        self._core.require_api_key("resume()", recovery=True)
        batch = ResumeBatch(self._core)

        async def resume(target: Claimed) -> ResumeResult:
            auth = await _off_loop(self._core.recovery_auth, target.record)
            resumed = drive.resume(self._core.settings, target.claim, target.owner)
            return batch.settled(target, await self._execute(resumed, auth=auth))

        return await arun_batch(batch, resume, on_result)

    async def reconcile(
        self,
        key_or_reference: str,
        *,
        resend: bool = False,
        on_result: Callable[[ReconcileResult], object] | None = None,
    ) -> list[ReconcileResult]:
        """See ``Client.reconcile``."""
        self._in_this_process()
        self._core.require_api_key("reconcile()", recovery=True)
        batch = ReconcileBatch(self._core, key_or_reference)
        reconciling = functools.partial(self._reconcile, resend=resend)
        return await arun_batch(batch, reconciling, on_result)

    async def reconcile_all(
        self,
        *,
        resend: bool = False,
        on_result: Callable[[ReconcileResult], object] | None = None,
    ) -> list[ReconcileResult]:
        """See ``Client.reconcile_all``."""
        self._in_this_process()
        self._core.require_api_key("reconcile_all()", recovery=True)
        reconciling = functools.partial(self._reconcile, resend=resend)
        return await arun_batch(ReconcileBatch(self._core, None), reconciling, on_result)

    async def _reconcile(self, record: IntentRecord, *, resend: bool = False) -> ReconcileResult:
        self._in_this_process()
        # Looked up and resent with the key that journaled it only (none needed for an
        # intent the drive skips; the keyring is read off the loop).
        skipped = drive.skip_reason(self._core.settings, record) is not None
        auth = None if skipped else await _off_loop(self._core.recovery_auth, record)
        reconciling = drive.reconcile(self._core.settings, record, new_owner(), resend=resend)
        return _reconcile.result(await self._execute(reconciling, auth=auth))

    async def abandon(self, key: str, *, reason: str) -> IntentRecord:
        return await _off_loop(self.journal.abandon, key, reason=reason, now=self._core.clock())

    async def acknowledge(self, key: str) -> IntentRecord:
        return await _off_loop(self.journal.acknowledge, key, now=self._core.clock())

    async def unknown(self) -> Intents:
        """See ``Client.unknown``."""
        return await _off_loop(_reconcile.unknown, self._core)

    async def unacknowledged(self) -> list[IntentRecord]:
        return await _off_loop(self.journal.unacknowledged, account=self.account)

    async def outcomes(self, *, after: str | None = None, limit: int = 100) -> Outcomes:
        """See ``Client.outcomes``."""
        return await _off_loop(
            self.journal.outcomes,
            account=self.account,
            provider=self.provider.name,
            after=after,
            limit=limit,
        )

    # -- sending -----------------------------------------------------------------------------

    async def _drive(
        self,
        op: AsyncOperation,
        draft: IntentDraft,
        bind: Callable[[IntentRecord], None],
        *,
        http: httpx.AsyncClient | None = None,
        auth: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        self._in_this_process()
        if auth is not None:  # a transported request's own credential journals it
            draft = attrs.evolve(draft, credential=self._core.credential_of(auth))
        ack = op._folds_acknowledgement and draft.step == 1
        call = drive.call(self._core.settings, draft, new_owner(), acknowledge_on_success=ack)
        return await self._execute(call, bind, http=http, auth=auth)

    async def _execute(
        self,
        commands: Generator[drive.Command, Any, T],
        bind: Callable[[IntentRecord], None] | None = None,
        *,
        http: httpx.AsyncClient | None = None,
        auth: Mapping[str, str] | None = None,
    ) -> T:
        """See ``Client._execute``: the drive runs on the loop; so do its journal commands
        on an engine with an async edge (PostgreSQL), else each is one journal thread hop."""
        core = self._core
        execution = Execution(core, self._keeper, bind)
        failure: BaseException | None = None
        failed: BaseException | None = None
        """What the last send or look-up raised, for the journal command that records it."""
        interrupted = False
        """Cancelled mid-attempt (a timeout, a caller that went away): the journal commands
        that follow run to their end whatever else is cancelled (``_after_interruption``)."""
        try:
            answer: Any = None
            while True:
                try:
                    command = commands.send(answer)
                except StopIteration as done:
                    ended: T = done.value
                    return ended
                if isinstance(command, drive.JOURNAL_COMMANDS):  # the most frequent, first
                    if interrupted:
                        answer = await _after_interruption(core, command, failed)
                    elif (edge := core.journal_edge()) is not None:
                        answer = await _on_loop(core, edge, command, failed)
                    else:
                        answer = await off_loop(core.journal_command, command, after=failed)
                    failed = None
                    execution.journaled(answer)
                    continue
                if isinstance(command, IN_PROCESS):
                    answer = execution.carry_out(command)
                    continue
                match command:
                    case drive.Send(current):
                        answer = await self._send(current, http, auth)
                        failed = answer.error if isinstance(answer, drive.Failed) else None
                        interrupted = failed is not None and not isinstance(failed, Exception)
                    case drive.LookUp(record):
                        answer = await self._look_up(record, http, auth)
                        failed = answer.error if isinstance(answer, drive.Failed) else None
                    case drive.AskAgain(record):
                        ask = functools.partial(core.asked_again_request, record, auth=auth)
                        answer = core.asked_again(record, await self._asked(ask, http))
                    case drive.ReadClock():
                        answer = await self._read_clock()
                    case drive.Sleep(seconds):
                        core.told(command)
                        await asyncio.sleep(seconds)
                        answer = None
                    case _:
                        assert_never(command)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            commands.close()
            if (leased := execution.let_go()) is not None:
                await off_loop(_reconcile.end, core, *leased)
            execution.end(failure)

    async def _send(
        self, run: drive.Run, http: httpx.AsyncClient | None, auth: Mapping[str, str] | None
    ) -> drive.Answered | drive.Failed:
        """One attempt: its answer, or what it raised (a cancellation too)."""
        http = self._http if http is None else http
        try:
            response = await self._exchange(self._core.build_request(run, http, auth), http)
        except BaseException as exc:  # cancelled too: the drive journals it
            if logger.isEnabledFor(logging.DEBUG):
                self._core.tell.log_error(run, exc)
            return drive.Failed(exc)
        crash_point("after_response")
        return drive.Answered(response)

    async def _look_up(
        self,
        record: IntentRecord,
        http: httpx.AsyncClient | None,
        auth: Mapping[str, str] | None,
    ) -> drive.Answered | drive.Failed:
        core = self._core
        return await self._asked(lambda c: _reconcile.lookup_request(core, record, c, auth), http)

    async def _asked(
        self,
        request: Callable[[httpx.AsyncClient], httpx.Request],
        http: httpx.AsyncClient | None,
    ) -> drive.Answered | drive.Failed:
        """A request that executes nothing (a look-up, a settled intent's request again):
        its answer, or what it raised."""
        http = self._http if http is None else http
        try:
            return drive.Answered(await self._exchange(request(http), http))
        except Exception as exc:
            return drive.Failed(exc)

    async def _read_clock(self) -> drive.Answered | drive.Failed:
        try:
            return drive.Answered(await self._exchange(self._core.clock_request(self._http)))
        except Exception as exc:
            return drive.Failed(exc)

    async def _exchange(
        self, request: httpx.Request, http: httpx.AsyncClient | None = None
    ) -> httpx.Response:
        """One request and its whole answer, within the exchange's total deadline."""
        deadline = Deadline.start(self._attempt_timeout)
        scope = asyncio.timeout(deadline.seconds)
        try:
            async with scope:
                return await (self._http if http is None else http).send(request)
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
            edge = self._core.journal_edge()
            if edge is not None:
                await edge.aclose()
            await _off_loop(self.journal.close)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
