"""One batch runner behind ``resume()`` and ``reconcile_all()``, sync and async.

A batch names its targets one at a time and says what a failure of one means; the runner
drives each target and isolates it: whatever one intent raises (a refused look-up, an
undecodable answer, a bug) is logged with its key and reported in that intent's result,
and the pass goes on with the next. An intent that went unknown is the exception to the
logging: the core already warned of it. Only an interrupt (``KeyboardInterrupt``, a
cancellation) stops a pass.

A target whose journal row no longer decodes (``DamagedRow``) is never driven: the batch
names it (logged, and a result marked ``damaged``) and the pass goes on after it, so one
damaged row never holds back the intents behind it.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import attrs
import httpx

from .._journal._rows import DamagedRow
from .._lifecycle import Claim, IntentRecord, IntentState, ReconcileOutcome
from .._owners import new_owner
from ..errors import (
    AuthenticationError,
    CredentialMismatch,
    OutcomeUnknown,
    PayonceError,
    ProviderError,
)
from . import _reconcile
from ._core import IntentCore
from ._events import IntentResumed, log_extra
from ._hooks import Hooks
from ._reconcile import ReconcileResult
from ._redacting import Redactor

__all__ = [
    "Claimed",
    "ReconcileBatch",
    "ResumeBatch",
    "ResumeResult",
    "arun_batch",
    "run_batch",
]

logger = logging.getLogger("payonce")

T = TypeVar("T")
R = TypeVar("R")


class Batch(Protocol[T, R]):
    def next(self) -> T | DamagedRow | None:
        """The next target, a row on the way that no longer decodes, or None when the pass
        is over (may read the journal)."""
        ...

    def damaged(self, row: DamagedRow) -> R:
        """The result of a row that no longer decodes: never driven."""
        ...

    def record(self, target: T) -> IntentRecord: ...

    @property
    def redactor(self) -> Redactor:
        """What an error's words pass through before they are logged or reported."""
        ...

    def failed(self, target: T, error: Exception) -> R:
        """The result of a target whose drive raised (may read and write the journal)."""
        ...

    def report(self, result: R) -> None:
        """Tell the client's hooks what one target came to."""
        ...


def _log_failure(record: IntentRecord, error: Exception, redactor: Redactor) -> None:
    if isinstance(error, OutcomeUnknown):
        # The core warned as the intent went unknown, with its fields and the reason: the
        # one record of that event, whichever path led there.
        return
    if isinstance(error, PayonceError):
        logger.warning(
            "intent %s: %s",
            record.key,
            redactor.describe(error),
            extra=log_extra(record),
        )
        return
    message = "intent %s: unexpected %s; the pass goes on with the next intent"
    name = type(error).__name__
    shown = redactor.traceback(error)
    if shown is None:
        logger.error(message, record.key, name, exc_info=error, extra=log_extra(record))
    else:
        # The traceback quotes a credential: logged as text, redacted, never as exc_info.
        logger.error(message + "\n%s", record.key, name, shown, extra=log_extra(record))


def damage_detail(row: DamagedRow) -> str:
    """What a pass says of a row it skipped because it no longer decodes."""
    return (
        f"its journal row is damaged ({row.problem}): skipped, never sent. Check it at the "
        "provider, then restore or repair the row (`payonce journal check` lists them)"
    )


def say_damaged(row: DamagedRow) -> None:
    logger.error("intent %s: %s", row.key, damage_detail(row))


def run_batch(
    batch: Batch[T, R],
    drive: Callable[[T], R],
    on_result: Callable[[R], object] | None,
    *,
    on_damaged: Callable[[DamagedRow], None] = say_damaged,
) -> list[R]:
    results: list[R] = []
    while (target := batch.next()) is not None:
        if isinstance(target, DamagedRow):
            on_damaged(target)
            result = batch.damaged(target)
        else:
            try:
                result = drive(target)
            except Exception as exc:
                _log_failure(batch.record(target), exc, batch.redactor)
                result = batch.failed(target, exc)
        batch.report(result)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


async def arun_batch(
    batch: Batch[T, R],
    drive: Callable[[T], Awaitable[R]],
    on_result: Callable[[R], object] | None,
) -> list[R]:
    from ._journal_threads import off_loop  # a service that only uses Client never needs it

    results: list[R] = []
    while (target := await off_loop(batch.next)) is not None:
        if isinstance(target, DamagedRow):
            say_damaged(target)
            result = batch.damaged(target)
        else:
            try:
                result = await drive(target)
            except Exception as exc:
                _log_failure(batch.record(target), exc, batch.redactor)
                result = await off_loop(batch.failed, target, exc)
        batch.report(result)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


# -- resume ----------------------------------------------------------------------------------


@attrs.frozen
class ResumeResult:
    """What ``resume`` did with one pending intent."""

    key: str
    reference: str | None
    state: IntentState
    """The intent's state once this pass was done with it."""
    detail: str
    damaged: bool = False
    """Its journal row no longer decodes: skipped, never sent (``detail`` says what is
    wrong; ``payonce.journal.DamagedRow``)."""


@attrs.frozen
class Claimed:
    claim: Claim
    owner: str

    @property
    def record(self) -> IntentRecord:
        return self.claim.record


class ResumeBatch:
    """Every pending intent of the client's account and provider no live worker holds,
    oldest first, each leased as it is named."""

    def __init__(self, core: IntentCore) -> None:
        self._core = core
        self._after: tuple[object, str] | None = None

    def next(self) -> Claimed | DamagedRow | None:
        owner = new_owner()
        claim = self._core.claim_next_resumable(owner, self._after)
        if claim is None:
            return None
        if isinstance(claim, DamagedRow):
            self._after = (claim.created_at, claim.key)  # as stored: the pass goes on after it
            return claim
        self._after = (claim.record.created_at, claim.record.key)
        return Claimed(claim, owner)

    def damaged(self, row: DamagedRow) -> ResumeResult:
        state = _state_of(row, IntentState.PENDING)
        return ResumeResult(row.key, row.reference, state, damage_detail(row), damaged=True)

    def record(self, target: Claimed) -> IntentRecord:
        return target.record

    @property
    def redactor(self) -> Redactor:
        return self._core.redactor

    def report(self, result: ResumeResult) -> None:
        core = self._core
        if core.hooks:
            event = IntentResumed(
                key=result.key,
                reference=result.reference,
                provider=core.profile.name,
                account=core.account,
                state=result.state,
                detail=result.detail,
            )
            core.hooks.emit(Hooks.resumed, event)

    def settled(self, target: Claimed, response: httpx.Response) -> ResumeResult:
        record = target.record
        detail = f"HTTP {response.status_code}"
        logger.info(
            "resumed intent %s: succeeded (%s)",
            record.key,
            detail,
            extra=log_extra(record, IntentState.SUCCEEDED),
        )
        return ResumeResult(record.key, record.reference, IntentState.SUCCEEDED, detail)

    def failed(self, target: Claimed, error: Exception) -> ResumeResult:
        record = target.record
        # Whatever went wrong, the lease is given back (a no-op when the drive did).
        self._core.store.release(record.key, owner=target.owner)
        current = self._core.journal.get(record.key)
        state = current.state if current else record.state
        if isinstance(error, AuthenticationError) and error.may_have_executed:
            detail = (
                f"HTTP {error.status_code}: refused, not by the provider (a firewall?); it may "
                "have executed: do not pay it again under a new reference"
            )
        elif isinstance(error, AuthenticationError):
            detail = f"HTTP {error.status_code}: refused before execution, fix the API key"
        elif isinstance(error, ProviderError):
            detail = f"HTTP {error.status_code}"
        elif isinstance(error, CredentialMismatch):
            detail = str(error)  # names the key missing and where to put it; never a secret
        else:
            detail = self._core.redactor.describe(error)
        logger.info(
            "resumed intent %s: %s (%s)",
            record.key,
            state.value,
            detail,
            extra=log_extra(record, state),
        )
        return ResumeResult(record.key, record.reference, state, detail)


# -- reconcile -------------------------------------------------------------------------------


class ReconcileBatch:
    """The unknown intents of the client's account and provider, oldest first, or the ones
    with one key or reference."""

    def __init__(
        self,
        core: IntentCore,
        key_or_reference: str | None,
        targets: list[IntentRecord] | None = None,
    ) -> None:
        self._core = core
        self._named = key_or_reference
        self._targets: deque[IntentRecord | DamagedRow] | None = (
            None if targets is None else deque(targets)
        )
        """Chosen by the caller (the worker: the intents its schedule says are due), or
        read from the journal on the first ``next``."""
        self._started = 0.0

    def next(self) -> IntentRecord | DamagedRow | None:
        if self._targets is None:
            # A profile without a status look-up reconciles by resending under the key
            # while the key is surely remembered (the drive's ``reconcile``).
            self._targets = deque(_reconcile.targets(self._core, self._named))
        if not self._targets:
            return None
        self._started = self._core.clock()
        return self._targets.popleft()

    def record(self, target: IntentRecord) -> IntentRecord:
        return target

    def damaged(self, row: DamagedRow) -> ReconcileResult:
        state = _state_of(row, IntentState.UNKNOWN)
        return ReconcileResult(
            row.key,
            row.reference,
            state,
            state,
            ReconcileOutcome.ERROR,
            damage_detail(row),
            damaged=True,
        )

    @property
    def redactor(self) -> Redactor:
        return self._core.redactor

    def report(self, result: ReconcileResult) -> None:
        _reconcile.reported(self._core, result)

    def failed(self, target: IntentRecord, error: Exception) -> ReconcileResult:
        if isinstance(error, CredentialMismatch):
            # No key here sent it: skipped, nothing looked up or sent (never "absent").
            return ReconcileResult(
                target.key,
                target.reference,
                target.state,
                target.state,
                ReconcileOutcome.SKIPPED,
                str(error),
            )
        journal = self._core.journal
        now = journal.get(target.key)
        # What the journal wrote down names no key, so the same cause groups in a summary.
        written = [e.detail for e in journal.reconciliations(target.key) if e.at >= self._started]
        detail = written[-1] if written else self._core.redactor.describe(error)
        after = now.state if now else target.state
        return ReconcileResult(
            target.key, target.reference, target.state, after, ReconcileOutcome.ERROR, detail
        )


def _state_of(row: DamagedRow, otherwise: IntentState) -> IntentState:
    """The damaged row's state where that column still reads (the read that met it asked
    for ``otherwise``)."""
    try:
        return IntentState(row.state or otherwise)
    except ValueError:
        return otherwise
