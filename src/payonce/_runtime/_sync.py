"""``payonce.Client`` and its per-operation context manager: the sync executor.

Every decision is the drive's (``payonce._lifecycle._drive``); this module carries its
commands out: it sends bytes with httpx, sleeps with ``time.sleep``, calls the journal and
keeps leases alive from a thread. ``_async`` is its awaited twin.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, Unpack, assert_never

import attrs
import httpx

from .._crash import crash_point
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
from ._batch import Claimed, ReconcileBatch, ResumeBatch, ResumeResult, run_batch
from ._deadline import Deadline
from ._execution import IN_PROCESS, Execution
from ._lease_keeper import ThreadLeaseKeeper
from ._reconcile import ReconcileResult
from ._telling import logger
from ._transport import SyncTransport, Transported

if TYPE_CHECKING:
    from .._requests_adapter import TransportAdapter  # requests is an extra: imported on use

__all__ = ["Client", "Operation"]

T = TypeVar("T")


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
        """Send the intent's next step (once), or replay its journaled outcome.

        The first request is the intent itself; each later one that is not the same
        request again is its next step (see ``docs/steps.md``). Takes ``json=``,
        ``data=`` (form), ``content=``, ``params=`` and ``headers=``.
        """
        self._core.require_api_key(f"{method.upper()} {path}")
        return self._placed_and_driven(method, path, options)

    def _transported(self, request: Transported, http: httpx.Client) -> httpx.Response:
        """A request that came through ``client.transport()``: this intent's next step,
        sent through the transport's own HTTP client with the request's credentials."""
        return self._placed_and_driven(
            request.method,
            request.target,
            request.options,
            caller_key=request.caller_key,
            http=http,
            auth=request.auth,
        )

    def _placed_and_driven(
        self,
        method: str,
        path: str,
        options: RequestOptions,
        *,
        caller_key: str | None = None,
        http: httpx.Client | None = None,
        auth: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """The request placed in this block (reading first, once, the steps earlier runs
        journaled when there are any), then driven at its position."""
        while True:
            if self._must_read_steps():
                reading = drive.block_steps(self._core.settings, **self._steps_reading())
                self._read_steps(self._client._execute(reading))
            try:
                with self._next_step(method, path, options, caller_key=caller_key) as (draft, bind):
                    return self._client._drive(self, draft, bind, http=http, auth=auth)
            except IntentMismatch:
                if not self._misplaced():
                    raise

    def acknowledge(self) -> None:
        """Mark the settled outcome of every settled step as recorded on the caller's
        side."""
        for key in self._settled_keys():
            self._client.acknowledge(key)

    def __enter__(self) -> Operation:
        self._enter()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, *_: object
    ) -> None:
        self._exit(exc_type, exc)


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
        current = self._current_block(method, path, reference, key)
        if current is not None:
            return current.request(method, path, **request)
        with self._one_shot_intent(reference, key) as op:
            return op.request(method, path, **request)

    def enqueue(
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
        """Journal an intent inside your own open PostgreSQL transaction: the outbox.

        The intent's write-ahead record (pending, nothing sent) is written through
        ``connection`` (a psycopg 3 ``Connection``, or an SQLAlchemy ``Connection`` or
        ``Session`` on ``postgresql+psycopg://``), so it commits or rolls back with your
        rows. After the commit, ``resume()`` or ``payonce worker`` sends it under its key.

        The connection must be to the database (and server) that holds this client's
        PostgreSQL journal, with a transaction open; otherwise ``ConfigurationError``,
        nothing written. ``connection=None`` journals it on its own, in any journal
        (SQLite too), committed before this returns: for a caller with no rows to commit
        with it. Enqueuing the same ``reference`` again with the same request is the same
        intent (its record is returned); with another request it is ``IntentMismatch``,
        and your transaction stays usable. The outcome: ``outcomes()``. See docs/outbox.md.
        """
        self._in_this_process()
        draft = self._outbox_draft(method, path, reference, json, data, headers)
        return self._outbox.enqueue(draft, connection)

    def transport(
        self,
        inner: httpx.BaseTransport | None = None,
        *,
        sdk_keys: SdkKeys = "honour",
        outside_intent: OutsideIntent = "journal",
    ) -> httpx.BaseTransport:
        """An httpx transport that brings payonce to any httpx-based code:
        ``httpx.Client(transport=client.transport())``.

        Inside ``with client.intent(...)`` each mutating request (POST, PUT, PATCH, DELETE)
        is the block's next step: journaled write-ahead under its own key, retried,
        verified and reconciled, replayed when a re-run finds it settled. Reads pass
        through. ``inner`` sends the bytes (``httpx.HTTPTransport()`` by default).
        ``sdk_keys``: ``"honour"`` journals an idempotency key the request already carries
        as its step's key; ``"replace"`` drops it for payonce's own (for SDKs that draw a
        random key per call). ``outside_intent``: a mutating request outside any block is
        journaled as a one-shot intent (``"journal"``) or refused (``"refuse"``). Such a
        one-shot is journaled per call, whatever key it carried (payonce cannot tell a key
        the code names again from a uuid4 drawn per call): its call retries and verifies it,
        code run again under the same key continues it, but no resume or worker resends it
        once its call is over (they look it up where the provider allows; an operator may
        ``payonce reconcile KEY --resend``). See ``docs/integrations.md`` and ``docs/steps.md``.
        """
        return SyncTransport(
            self, inner, sdk_keys=sdk_keys, outside_intent=outside_intent, verify=self._verify
        )

    def requests_adapter(
        self,
        inner: httpx.BaseTransport | None = None,
        *,
        sdk_keys: SdkKeys = "honour",
        outside_intent: OutsideIntent = "journal",
    ) -> TransportAdapter:
        """A ``requests`` adapter over ``self.transport(...)`` (same options), for
        requests-based code and SDKs (extra ``requests``)::

            session.mount("https://", client.requests_adapter())

        Every request of the session then goes through payonce as it would through the
        transport: inside ``with client.intent(...)`` each mutating one is a step.
        Network failures arrive as ``requests.exceptions``; payonce's own errors
        (``OutcomeUnknown``...) as they are. The session's ``verify``/``cert``/``proxies``
        are the transport's business: give ``inner`` to configure them.
        """
        try:
            from .._requests_adapter import TransportAdapter
        except ImportError as missing:  # requests is an extra
            raise ImportError(
                "Client.requests_adapter() needs requests: pip install 'payonce[requests]'"
            ) from missing
        transport = self.transport(inner, sdk_keys=sdk_keys, outside_intent=outside_intent)
        return TransportAdapter(transport)

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
        self._core.require_api_key("resume()", recovery=True)
        batch = ResumeBatch(self._core)
        return run_batch(batch, functools.partial(self._resume, batch), on_result)

    def _resume(self, batch: ResumeBatch, target: Claimed) -> ResumeResult:
        """Drive one claimed pending intent of a resume pass to an end."""
        auth = self._core.recovery_auth(target.record)  # the key that journaled it, or none
        resumed = drive.resume(self._core.settings, target.claim, target.owner)
        return batch.settled(target, self._execute(resumed, auth=auth))

    def reconcile(
        self,
        key_or_reference: str,
        *,
        resend: bool = False,
        on_result: Callable[[ReconcileResult], object] | None = None,
    ) -> list[ReconcileResult]:
        """Ask the provider about the unknown intent(s) with this key or reference; with no
        status look-up to ask, resend under its key while the key is surely remembered.
        ``resend``: an operator asks for that resend where the key lifetime is assumed
        (within 90% of it, not only ``ASSUMED_LIFETIME_RESEND_WINDOW``)."""
        self._in_this_process()
        self._core.require_api_key("reconcile()", recovery=True)
        reconciling = functools.partial(self._reconcile, resend=resend)
        return run_batch(ReconcileBatch(self._core, key_or_reference), reconciling, on_result)

    def reconcile_all(
        self,
        *,
        resend: bool = False,
        on_result: Callable[[ReconcileResult], object] | None = None,
    ) -> list[ReconcileResult]:
        """Reconcile every unknown intent of this account and provider, oldest first; one
        intent's failure never stops the rest. ``resend`` as in ``reconcile``."""
        self._in_this_process()
        self._core.require_api_key("reconcile_all()", recovery=True)
        reconciling = functools.partial(self._reconcile, resend=resend)
        return run_batch(ReconcileBatch(self._core, None), reconciling, on_result)

    def _reconcile(self, record: IntentRecord, *, resend: bool = False) -> ReconcileResult:
        self._in_this_process()
        # Looked up and resent with the key that journaled it only (none needed for an
        # intent the drive skips: nothing is sent for it).
        skipped = drive.skip_reason(self._core.settings, record) is not None
        auth = None if skipped else self._core.recovery_auth(record)
        reconciling = drive.reconcile(self._core.settings, record, new_owner(), resend=resend)
        return _reconcile.result(self._execute(reconciling, auth=auth))

    def abandon(self, key: str, *, reason: str) -> IntentRecord:
        """Close a pending or unknown intent for good, as an operator decision."""
        return self.journal.abandon(key, reason=reason, now=self._core.clock())

    def acknowledge(self, key: str) -> IntentRecord:
        """The caller has recorded this intent's settled outcome on its side."""
        return self.journal.acknowledge(key, now=self._core.clock())

    def unknown(self) -> Intents:
        """The unknown intents of this account and provider, oldest first: what
        ``reconcile_all()`` drives. Their rows that no longer decode are named in the
        list's ``damaged``."""
        return _reconcile.unknown(self._core)

    def unacknowledged(self) -> list[IntentRecord]:
        """Settled intents of this account whose outcome the caller has not acknowledged."""
        return self.journal.unacknowledged(account=self.account)

    def outcomes(self, *, after: str | None = None, limit: int = 100) -> Outcomes:
        """The outcomes of what this client's account and provider enqueued (the outbox):
        the intents a worker or ``resume`` settled (succeeded or failed) that you have not
        acknowledged yet, oldest settled first, at most ``limit``, after the cursor
        ``after`` (a page's ``cursor``). Record each on your side (the intent's
        ``reference``, ``state`` and ``response``), then ``acknowledge(key)`` it: it is not
        listed again. Start each pass without ``after``. See docs/outbox.md."""
        return self.journal.outcomes(
            account=self.account, provider=self.provider.name, after=after, limit=limit
        )

    # -- sending -----------------------------------------------------------------------------

    def _drive(
        self,
        op: Operation,
        draft: IntentDraft,
        bind: Callable[[IntentRecord], None],
        *,
        http: httpx.Client | None = None,
        auth: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        self._in_this_process()
        if auth is not None:  # a transported request's own credential journals it
            draft = attrs.evolve(draft, credential=self._core.credential_of(auth))
        ack = op._folds_acknowledgement and draft.step == 1
        call = drive.call(self._core.settings, draft, new_owner(), acknowledge_on_success=ack)
        return self._execute(call, bind, http=http, auth=auth)

    def _execute(
        self,
        commands: Generator[drive.Command, Any, T],
        bind: Callable[[IntentRecord], None] | None = None,
        *,
        http: httpx.Client | None = None,
        auth: Mapping[str, str] | None = None,
    ) -> T:
        """Carry a drive's commands out until it returns the caller's answer or raises.
        ``bind``: told each record the caller's operation should show. ``http`` and
        ``auth``: where attempts and look-ups go and with which credentials, when not this
        client's own (a request through ``client.transport()``)."""
        core = self._core
        execution = Execution(core, self._keeper, bind)
        failure: BaseException | None = None
        failed: BaseException | None = None
        """What the last send or look-up raised, for the journal command that records it."""
        try:
            answer: Any = None
            while True:
                try:
                    command = commands.send(answer)
                except StopIteration as done:
                    ended: T = done.value
                    return ended
                if isinstance(command, drive.JOURNAL_COMMANDS):  # the most frequent, first
                    answer = core.journal_command(command, after=failed)
                    failed = None
                    execution.journaled(answer)
                    continue
                if isinstance(command, IN_PROCESS):
                    answer = execution.carry_out(command)
                    continue
                match command:
                    case drive.Send(current):
                        answer = self._send(current, http, auth)
                        failed = answer.error if isinstance(answer, drive.Failed) else None
                    case drive.LookUp(record):
                        answer = self._look_up(record, http, auth)
                        failed = answer.error if isinstance(answer, drive.Failed) else None
                    case drive.AskAgain(record):
                        ask = functools.partial(core.asked_again_request, record, auth=auth)
                        answer = core.asked_again(record, self._asked(ask, http))
                    case drive.ReadClock():
                        answer = self._read_clock()
                    case drive.Sleep(seconds):
                        core.told(command)
                        time.sleep(seconds)
                        answer = None
                    case _:
                        assert_never(command)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            commands.close()
            if (leased := execution.let_go()) is not None:
                _reconcile.end(core, *leased)
            execution.end(failure)

    def _send(
        self, run: drive.Run, http: httpx.Client | None, auth: Mapping[str, str] | None
    ) -> drive.Answered | drive.Failed:
        """One attempt: its answer, or what it raised (an interrupt too)."""
        http = self._http if http is None else http
        try:
            response = self._exchange(self._core.build_request(run, http, auth), http)
        except BaseException as exc:  # KeyboardInterrupt too: the drive journals it
            if logger.isEnabledFor(logging.DEBUG):
                self._core.tell.log_error(run, exc)
            return drive.Failed(exc)
        crash_point("after_response")
        return drive.Answered(response)

    def _look_up(
        self, record: IntentRecord, http: httpx.Client | None, auth: Mapping[str, str] | None
    ) -> drive.Answered | drive.Failed:
        core = self._core
        return self._asked(lambda c: _reconcile.lookup_request(core, record, c, auth), http)

    def _asked(
        self, request: Callable[[httpx.Client], httpx.Request], http: httpx.Client | None
    ) -> drive.Answered | drive.Failed:
        """A request that executes nothing (a look-up, a settled intent's request again):
        its answer, or what it raised."""
        http = self._http if http is None else http
        try:
            return drive.Answered(self._exchange(request(http), http))
        except Exception as exc:
            return drive.Failed(exc)

    def _read_clock(self) -> drive.Answered | drive.Failed:
        try:
            return drive.Answered(self._exchange(self._core.clock_request(self._http)))
        except Exception as exc:
            return drive.Failed(exc)

    def _exchange(self, request: httpx.Request, http: httpx.Client | None = None) -> httpx.Response:
        """One request and its whole answer, within the exchange's total deadline."""
        deadline = Deadline.start(self._attempt_timeout)
        deadline.bound_waits(request)
        try:
            response = (self._http if http is None else http).send(request, stream=True)
            try:
                deadline.read(response)
            except BaseException:
                response.close()
                raise
        except httpx.ReadTimeout as timeout:
            cut = deadline.cut(request, timeout)
            if cut is timeout:
                raise
            raise cut from timeout
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
