"""The webhook inbox: verified, deduplicated, handled once per event.

A provider delivers each event at least once, and sometimes several times at once to
several workers. ``WebhookInbox.receive`` makes that "handled once":

1. the signature is verified (HMAC-SHA256 over ``timestamp.body``, Stripe's
   ``Stripe-Signature`` format, every configured secret tried, constant-time compare,
   timestamp tolerance) before anything is recorded or parsed;
2. the event id is claimed in the journal, the same journal (SQLite file or PostgreSQL)
   the client's intents live in: the first delivery takes a lease and runs the handler;
   a redelivery of a processed event is a ``duplicate`` and never reaches the handler; a
   delivery that arrives while another worker runs the handler is ``in_progress`` and
   must be answered non-2xx, so the provider delivers it again later;
3. when the handler returns the event is marked processed (durably); when it raises, the
   event is released unprocessed and the exception propagates: the redelivery the
   provider makes after the error answer is handled again. A worker that dies mid-handler
   leaves a lease that the next delivery takes over at once (same host, process gone) or
   once it expires (other hosts).

The handler therefore runs to completion once per event, across restarts, threads and
processes; a handler interrupted by a crash may have been partly run before it runs again,
so it should be safe to repeat (the usual at-least-once rule for side effects that live
outside the journal).

```python
inbox = WebhookInbox("journal.db", ["whsec_new", "whsec_old"])

delivery = inbox.receive(body, request.headers, handle_event)
return Response(status_code=delivery.status_code)
```
"""

from __future__ import annotations

import enum
import hashlib
import inspect
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

import attrs

from ._fork import ForkGuard
from ._journal._inbox import EventClaim, EventRecord
from ._journal._open import inbox_of, journal_clock, open_to_write
from ._journal._reads import Journal
from ._lifecycle import EVENT_LEASE_SECONDS, EventClaimKind
from ._owners import new_owner
from ._runtime._journal_threads import off_loop
from ._runtime._lease_keeper import Lease, ThreadLeaseKeeper
from ._runtime._lease_task import TaskLeaseKeeper
from ._runtime._options import check_seconds
from ._signatures import DEFAULT_TOLERANCE, check_tolerance, sign, verify
from .errors import ConfigurationError, PayonceError, WebhookError

__all__ = [
    "DEFAULT_TOLERANCE",
    "Delivery",
    "DeliveryOutcome",
    "Event",
    "EventRecord",
    "WebhookInbox",
    "parse_event",
    "sign",
    "verify",
]

logger = logging.getLogger("payonce")

DEFAULT_HEADER: Final = "Stripe-Signature"
DEFAULT_ENDPOINT: Final = "default"
MAX_EVENT_ID_LENGTH: Final = 255


@attrs.frozen
class Event:
    """One verified webhook event, as the handler receives it."""

    id: str
    """The provider's event id: what deduplication is keyed on (``evt_…``)."""
    type: str
    """``payment.succeeded``, ``charge.refunded``, …"""
    created: float | None
    """When the provider created the event (Unix seconds), when the payload says."""
    data: Mapping[str, Any] = attrs.field(repr=False)
    """The payload's ``data`` member (Stripe: ``{"object": {...}}``), read-only."""
    payload: bytes = attrs.field(repr=False)
    """The raw body exactly as it was signed."""

    def json(self) -> dict[str, Any]:
        """The whole payload, parsed."""
        parsed: dict[str, Any] = json.loads(self.payload)
        return parsed


class DeliveryOutcome(enum.Enum):
    HANDLED = "handled"
    """The handler ran and returned: the event is processed."""
    DUPLICATE = "duplicate"
    """The event was processed before; the handler was not called."""
    IN_PROGRESS = "in_progress"
    """Another worker is running the handler for this event right now; the handler was
    not called. Answer non-2xx (``Delivery.status_code`` is 409) so the provider delivers
    it again: if that worker's handler fails, the redelivery is what handles the event."""


@attrs.frozen
class Delivery:
    """What ``receive`` did with one delivery."""

    outcome: DeliveryOutcome
    event: Event
    deliveries: int
    """Deliveries of this event seen so far by every worker, this one included."""
    handler_runs: int
    """Times a handler was started on this event (more than 1 after a failure or a crash)."""
    signed_at: float
    """The timestamp of the delivery's verified signature."""

    @property
    def acknowledged(self) -> bool:
        """Whether to answer 2xx: the event is processed (now or before)."""
        return self.outcome is not DeliveryOutcome.IN_PROGRESS

    @property
    def status_code(self) -> int:
        """The HTTP status to answer the provider with: 200, or 409 while in progress."""
        return 200 if self.acknowledged else 409


def parse_event(payload: bytes) -> Event:
    """A Stripe-shaped event: a JSON object with ``id``, ``type``, ``created``, ``data``."""
    try:
        document = json.loads(payload)
    except ValueError:
        raise WebhookError("the webhook body is not valid JSON (UTF-8)") from None
    if not isinstance(document, dict):
        raise WebhookError("the webhook body is not a JSON object")
    event_id, event_type = document.get("id"), document.get("type")
    if not isinstance(event_id, str) or not event_id.strip():
        raise WebhookError("the webhook event has no id: it cannot be deduplicated")
    if len(event_id) > MAX_EVENT_ID_LENGTH or not event_id.isprintable():
        raise WebhookError(
            f"the webhook event id is not a printable string of at most "
            f"{MAX_EVENT_ID_LENGTH} characters"
        )
    if not isinstance(event_type, str) or not event_type:
        raise WebhookError(f"webhook event {event_id} has no type")
    created = document.get("created")
    if not isinstance(created, int | float) or isinstance(created, bool):
        created = None
    data = document.get("data")
    return Event(
        id=event_id,
        type=event_type,
        created=None if created is None else float(created),
        data=MappingProxyType(data if isinstance(data, dict) else {}),
        payload=payload,
    )


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    wanted = name.lower()
    for key, candidate in headers.items():
        if key.lower() == wanted:
            return candidate
    return None


def _secrets(secrets: str | Sequence[str]) -> tuple[str, ...]:
    listed = (secrets,) if isinstance(secrets, str) else tuple(secrets)
    if not listed:
        raise ConfigurationError(
            "no webhook signing secret configured: pass the endpoint's signing secret "
            "(whsec_…), or during a rotation both the new and the old one"
        )
    if not all(isinstance(secret, str) and secret for secret in listed):
        raise ConfigurationError("every webhook signing secret must be a non-empty string")
    return listed


def _failure(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _call_sync(handler: Callable[[Event], object], event: Event) -> None:
    result = handler(event)
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise ConfigurationError("the webhook handler is a coroutine function: use areceive")


class WebhookInbox:
    """Receives a provider's webhooks: verifies them, and hands each event over once.

    ``journal`` is a ``Journal``, a path, a ``postgresql://`` URL, or None for the default
    journal (``$PAYONCE_JOURNAL``): the same one the client uses is fine. ``secrets`` is
    the endpoint's signing secret, or several during a rotation (every one is tried
    against every signature in the header). ``endpoint`` scopes event ids: give each
    provider account or webhook endpoint sharing a journal a name of its own.
    ``tolerance`` is how far the signed timestamp may be from now, in seconds.
    ``lease_seconds`` bounds how long a crashed worker on another host keeps an event
    from being handled again; a running handler's lease is renewed every third of it.
    ``parse`` turns a verified body into an ``Event`` (default: Stripe's event shape).
    """

    def __init__(
        self,
        journal: Journal | str | os.PathLike[str] | None,
        secrets: str | Sequence[str],
        *,
        endpoint: str = DEFAULT_ENDPOINT,
        tolerance: float = DEFAULT_TOLERANCE,
        header: str = DEFAULT_HEADER,
        lease_seconds: float = EVENT_LEASE_SECONDS,
        clock: Callable[[], float] = time.time,
        parse: Callable[[bytes], Event] = parse_event,
    ) -> None:
        self._secrets = _secrets(secrets)
        if not endpoint:
            raise ConfigurationError("the webhook endpoint name must not be empty")
        tolerance = check_tolerance(tolerance)
        if tolerance == 0:
            raise ConfigurationError("the signature tolerance must be a positive number")
        self.endpoint = endpoint
        self.tolerance = tolerance
        self.header = header
        self.lease_seconds = check_seconds("lease_seconds", lease_seconds, positive=True)
        self._parse = parse
        self._owns_journal = not isinstance(journal, Journal)
        self.journal: Journal = open_to_write(journal)
        # The inbox's leases are shared by every host of the journal: one clock judges them.
        self._clock = journal_clock(self.journal, clock)
        self._inbox = inbox_of(self.journal)
        # Handlers' leases are renewed every third of their length: from a thread for
        # receive, from a task for areceive.
        self._fork = ForkGuard()
        self._keepers()

    def _keepers(self) -> None:
        self._keeper = ThreadLeaseKeeper(self.lease_seconds / 3)
        self._task_keeper = TaskLeaseKeeper(self.lease_seconds / 3)

    def _in_this_process(self) -> None:
        """After a fork, lease keepers of the child's own (see ``payonce._fork``)."""
        if self._fork.forked(self._keeper, self._task_keeper):
            self._keepers()

    # -- the steps, shared by receive and areceive -----------------------------------------

    def verify(self, payload: bytes, headers: Mapping[str, str]) -> tuple[Event, float]:
        """The verified event and its signature's timestamp; nothing is recorded.

        Raises ``WebhookSignatureError`` for a missing, stale or forged signature and
        ``WebhookError`` for a verified body that is not an event: answer both with 400.
        """
        if isinstance(payload, str):
            raise TypeError(
                "pass the request body as the raw bytes received: the signature covers "
                "those bytes, and a decoded or re-encoded str may differ from them"
            )
        body = bytes(payload)
        signed_at = verify(
            body,
            _header(headers, self.header),
            self._secrets,
            tolerance=self.tolerance,
            now=self._clock(),
        )
        return self._parse(body), signed_at

    def _claim(self, event: Event, owner: str) -> EventClaim:
        digest = hashlib.sha256(event.payload).hexdigest()
        claim = self._inbox.claim_event(
            self.endpoint,
            event.id,
            event_type=event.type,
            payload_hash=digest,
            owner=owner,
            now=self._clock(),
            lease_seconds=self.lease_seconds,
        )
        record = claim.record
        if claim.kind is not EventClaimKind.NEW and record.payload_hash != digest:
            logger.warning(
                "webhook event %s was delivered again with another body (sha256 %s, first "
                "%s); it is deduplicated by its id",
                event.id,
                digest[:12],
                record.payload_hash[:12],
            )
        if claim.kind is EventClaimKind.RETRY:
            logger.info(
                "webhook event %s: handling it again (run %d; before: %s)",
                event.id,
                record.handler_runs,
                record.last_error or "a worker that stopped or timed out",
            )
        return claim

    def _renew(self, event: Event, owner: str) -> bool:
        return self._inbox.renew_event_lease(
            self.endpoint,
            event.id,
            owner=owner,
            now=self._clock(),
            lease_seconds=self.lease_seconds,
        )

    def _release(self, event: Event, owner: str, exc: BaseException) -> None:
        try:
            self._inbox.release_event(
                self.endpoint, event.id, owner=owner, now=self._clock(), error=_failure(exc)
            )
        except PayonceError as release_error:
            # The lease runs out on its own; the handler's own error is what to raise.
            logger.warning(
                "webhook event %s: could not release it after its handler failed (%s); "
                "it is handled again once its lease expires",
                event.id,
                release_error,
            )

    def _finish(self, event: Event, owner: str) -> None:
        held = self._inbox.finish_event(self.endpoint, event.id, owner=owner, now=self._clock())
        if not held:
            logger.warning(
                "webhook event %s: its handler outlived its lease and another worker took "
                "the event over: it may have been handled twice",
                event.id,
            )

    @staticmethod
    def _unhandled(claim: EventClaim, event: Event, signed_at: float) -> Delivery:
        outcome = (
            DeliveryOutcome.DUPLICATE
            if claim.kind is EventClaimKind.DONE
            else DeliveryOutcome.IN_PROGRESS
        )
        record = claim.record
        return Delivery(outcome, event, record.deliveries, record.handler_runs, signed_at)

    @staticmethod
    def _handled(claim: EventClaim, event: Event, signed_at: float) -> Delivery:
        record = claim.record
        return Delivery(
            DeliveryOutcome.HANDLED, event, record.deliveries, record.handler_runs, signed_at
        )

    # -- sync ------------------------------------------------------------------------------

    def receive(
        self,
        payload: bytes,
        headers: Mapping[str, str],
        handler: Callable[[Event], object],
    ) -> Delivery:
        """Verify one delivery and run ``handler`` on its event unless that already happened.

        Signature and payload errors raise before anything is recorded. A handler that
        raises leaves the event unprocessed and its exception propagates (answer 5xx: the
        provider redelivers, and the redelivery is handled).
        """
        event, signed_at = self.verify(payload, headers)
        self._in_this_process()
        owner = new_owner()
        claim = self._claim(event, owner)
        if not claim.run_handler:
            return self._unhandled(claim, event, signed_at)
        try:
            with self._keeper.holding(self._lease(event, owner)):
                _call_sync(handler, event)
        except BaseException as exc:
            self._release(event, owner, exc)
            raise
        self._finish(event, owner)
        return self._handled(claim, event, signed_at)

    def _lease(self, event: Event, owner: str) -> Lease:
        return Lease(f"webhook event {event.id}", lambda: self._renew(event, owner))

    # -- async -----------------------------------------------------------------------------

    async def areceive(
        self,
        payload: bytes,
        headers: Mapping[str, str],
        handler: Callable[[Event], object],
    ) -> Delivery:
        """``receive`` for async services: the journal is called from a journal thread.

        ``handler`` may be a coroutine function (awaited) or a plain function (called on
        the event loop, so it should be quick).
        """
        event, signed_at = self.verify(payload, headers)
        self._in_this_process()
        owner = new_owner()
        claim = await off_loop(self._claim, event, owner)
        if not claim.run_handler:
            return self._unhandled(claim, event, signed_at)
        try:
            async with self._task_keeper.holding(self._lease(event, owner)):
                result = handler(event)
                if inspect.isawaitable(result):
                    await result
        except BaseException as exc:
            await off_loop(self._release, event, owner, exc)
            raise
        await off_loop(self._finish, event, owner)
        return self._handled(claim, event, signed_at)

    # -- looking and closing ---------------------------------------------------------------

    def event(self, event_id: str) -> EventRecord | None:
        """What the journal knows of one event of this endpoint."""
        return self.journal.get_event(self.endpoint, event_id)

    def unprocessed(self, limit: int | None = None) -> list[EventRecord]:
        """Events of this endpoint received but not (yet) handled, oldest first."""
        return self.journal.list_events(endpoint=self.endpoint, unprocessed=True, limit=limit)

    def close(self) -> None:
        """Stop keeping leases alive, and close the journal if this inbox opened it."""
        self._keeper.close()
        if self._owns_journal:
            self.journal.close()

    def __enter__(self) -> WebhookInbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
