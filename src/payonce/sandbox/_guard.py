"""One mutating request under its idempotency key: its faults, its claim, its execution.

Every endpoint that executes something (a payment, a PaymentIntent created or confirmed)
goes through the same steps, so that the faults and the key's contract are the same on
all of them: the request draws its faults first, then claims its key; a key already
completed replays the stored answer byte for byte, one in flight answers 409, one reused
with other parameters is refused. Only a claimed key executes, and an execution that
raises releases the key, since the store records an execution all or nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final, TypeVar

import attrs
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from payonce.sandbox._config import SandboxConfig
from payonce.sandbox._dialects import key_message, mismatch_status
from payonce.sandbox._errors import ApiError, DroppedResponse
from payonce.sandbox._faults import FaultInjector, FaultName, FaultPlan
from payonce.sandbox._hold import Hold
from payonce.sandbox._store import (
    Claimed,
    ClaimResult,
    InProgress,
    Mismatch,
    Replay,
    SandboxStore,
    StoredResponse,
)

UNGUARDED: Final = "unguarded"
"""The claim token of an execution no key guards: it completes or releases no key's row."""

T = TypeVar("T")


def _retry_after(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else str(seconds)


def stored_response(stored: StoredResponse, *, replayed: bool = False) -> Response:
    headers = {"Idempotent-Replayed": "true"} if replayed else None
    return Response(stored.body, stored.status, headers, media_type="application/json")


@attrs.frozen
class KeyGuard:
    """The faults and the idempotency layer every mutating endpoint shares."""

    config: SandboxConfig
    store: SandboxStore
    injector: FaultInjector
    hold: Hold

    async def faults_before(self, forced: FaultName | None) -> FaultPlan:
        """Draw this request's faults and play those that strike before any claim."""
        plan = self.injector.plan(forced)
        faults = self.injector.faults
        if plan.rate_limit:
            retry_after = _retry_after(faults.retry_after_seconds)
            raise ApiError(429, "rate_limit", "too many requests", {"Retry-After": retry_after})
        if plan.fail_before:
            raise ApiError(503, "service_unavailable", "the service is unavailable")
        if plan.lock_timeout:
            raise ApiError(409, "lock_timeout", "another request is using this payment's objects")
        if plan.delay and faults.delay_seconds > 0:
            await asyncio.sleep(faults.delay_seconds)
        return plan

    async def claim(
        self,
        account: str,
        key: str,
        fingerprint: str,
        mismatch: Callable[[str], str | None] = lambda stored: None,
    ) -> Claimed | Response:
        """The claim on ``key``, or the answer its earlier use calls for (a replay).

        ``mismatch`` may word a key reused with other parameters from the stored request
        hash (e.g. another endpoint's); None keeps the dialect's own words.
        """
        claim = await self._claim(account, key, fingerprint)
        if isinstance(claim, Replay):
            return stored_response(claim.response, replayed=True)
        if isinstance(claim, Mismatch):
            status = self.config.mismatch_status or mismatch_status(self.config.dialect)
            default = "this key was used with different parameters"
            message = mismatch(claim.request_hash) or self._words(
                "idempotency_key_mismatch", key, default
            )
            raise ApiError(status, "idempotency_key_mismatch", message)
        if isinstance(claim, InProgress):
            default = "a request with this key is in flight"
            message = self._words("idempotency_key_in_use", key, default)
            raise ApiError(409, "idempotency_key_in_use", message)
        return claim

    def _words(self, type_: str, key: str, default: str) -> str:
        return key_message(self.config.dialect, type_, key, default)

    async def _claim(self, account: str, key: str, fingerprint: str) -> ClaimResult:
        if self.config.idempotency == "none":
            return Claimed(UNGUARDED)  # every request executes
        claim = await run_in_threadpool(
            self.store.claim, account, key, fingerprint, self.config.key_lifetime
        )
        if isinstance(claim, InProgress) and self.config.idempotency == "racy":
            # The flaw some servers have: only a completed key is a duplicate, so one that
            # arrives while the first still runs executes as well.
            return Claimed(UNGUARDED)
        return claim

    async def execute(self, account: str, key: str, claim: Claimed, record: Callable[[], T]) -> T:
        """Run ``record`` (the store's all-or-nothing execution) after the configured work,
        and once the hold (``SandboxServer.holding``) is off."""
        try:
            await self.hold.passed()
            if self.config.processing_seconds > 0:
                await asyncio.sleep(self.config.processing_seconds)
            return await run_in_threadpool(record)
        except BaseException:
            # Nothing was executed (the record is all or nothing), so a retry may run it.
            self.store.release(account, key, claim.token)
            raise

    @staticmethod
    def faults_after(plan: FaultPlan, stored: StoredResponse) -> Response:
        """The executed request's answer, or the fault that loses it."""
        if plan.fail_after:
            raise ApiError(503, "service_unavailable", "the service is unavailable")
        if plan.drop_after:
            return DroppedResponse(stored)
        return stored_response(stored)
