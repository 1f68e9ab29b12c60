"""The sandbox's webhooks: a signed event per settled payment, delivered at least once.

Each executed payment yields one event, ``payment.succeeded`` or ``payment.failed``, whose
id is stable (``evt_`` + a hash of the payment id and the type), so every delivery of it
carries the same id and the same body. A background thread POSTs it to the configured URL
with a ``Stripe-Signature`` header signed by every configured secret (a rotation), retries
non-2xx answers and connection errors with backoff, and, for a seeded share of events,
delivers the event a second time after it was accepted: the redeliveries a receiver must
recognise. Every attempt is recorded for the tests to read.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import random
import threading
import time
from collections.abc import Sequence
from typing import Any, Final

import attrs
import httpx

from payonce._signatures import sign
from payonce.sandbox._store import Payment

__all__ = ["WebhookAttempt", "WebhookConfig", "WebhookSender", "event_id_for"]

_RESPONSE_CHARS: Final = 500


def _secrets(value: str | Sequence[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def _some_secrets(
    instance: object, attribute: attrs.Attribute[Any], value: tuple[str, ...]
) -> None:
    if not value or not all(isinstance(s, str) and s for s in value):
        raise ValueError("webhook secrets must be one or more non-empty strings")


def _rate(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"{attribute.name} must be a number between 0 and 1, got {value!r}")


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{attribute.name} must be a positive number, got {value!r}")


def _at_least_one(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name} must be a positive integer, got {value!r}")


def _non_negative(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{attribute.name} must be a non-negative number, got {value!r}")


@attrs.frozen
class WebhookConfig:
    """Where and how the sandbox delivers webhooks for settled payments."""

    url: str
    """The receiver's URL, e.g. ``http://127.0.0.1:8000/webhooks``."""
    secrets: tuple[str, ...] = attrs.field(converter=_secrets, validator=_some_secrets)
    """Signing secrets: every delivery is signed with each (two during a rotation)."""
    redeliver_rate: float = attrs.field(default=0.0, validator=_rate)
    """Share of events delivered a second time, on purpose, after the first was accepted."""
    seed: int = 0
    """Seed of the redelivery draws (one per event, in the order payments settle)."""
    redeliver_delay: float = attrs.field(default=0.05, validator=_non_negative)
    max_attempts: int = attrs.field(default=5, validator=_at_least_one)
    """Tries per delivery before giving up on it."""
    retry_wait: float = attrs.field(default=0.05, validator=_non_negative)
    """Wait before the first retry; doubled each time, up to ``max_retry_wait``."""
    max_retry_wait: float = attrs.field(default=2.0, validator=_non_negative)
    timeout: float = attrs.field(default=5.0, validator=_positive)
    header: str = "Stripe-Signature"

    def to_json(self) -> dict[str, Any]:
        """The settings without the secrets."""
        settings = attrs.asdict(self)
        settings["secrets"] = len(self.secrets)
        return settings


@attrs.frozen
class WebhookAttempt:
    """One HTTP try of one delivery of one event."""

    event_id: str
    event_type: str
    payment_id: str
    delivery: int
    """1 for the event's delivery, 2 for its deliberate redelivery."""
    attempt: int
    """The try of that delivery (retries after a non-2xx answer or an error count up)."""
    at: float
    status_code: int | None
    error: str | None
    response: str
    """The start of the receiver's answer body."""

    @property
    def redelivery(self) -> bool:
        return self.delivery > 1

    @property
    def accepted(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300

    def to_json(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "redelivery": self.redelivery, "accepted": self.accepted}


def event_id_for(payment_id: str, event_type: str) -> str:
    """The stable id of a payment's event: the same for every delivery of it."""
    digest = hashlib.sha256(f"{payment_id}:{event_type}".encode()).hexdigest()
    return "evt_" + digest[:24]


def event_for(payment: Payment) -> tuple[str, str, bytes]:
    """The event id, type and body announcing that ``payment`` has settled."""
    event_type = f"payment.{payment.status}"
    event_id = event_id_for(payment.id, event_type)
    document = {
        "id": event_id,
        "object": "event",
        "type": event_type,
        "created": int(payment.created_at),
        "account": payment.account,
        "data": {"object": payment.to_json()},
    }
    body = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
    return event_id, event_type, body


@attrs.frozen
class _Job:
    event_id: str
    event_type: str
    payment_id: str
    body: bytes
    delivery: int
    attempt: int
    redeliver: bool


class WebhookSender:
    """Delivers events from one daemon thread, in due order, until closed."""

    def __init__(self, config: WebhookConfig) -> None:
        self.config = config
        self._lock = threading.Condition()
        self._queue: list[tuple[float, int, _Job]] = []
        self._order = itertools.count()
        self._in_flight = 0
        self._attempts: list[WebhookAttempt] = []
        self._random = random.Random(config.seed)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._generation = 0

    # -- what the sandbox calls ------------------------------------------------------------

    def enqueue(self, payment: Payment) -> str:
        """Schedule the event of a settled payment; returns its id."""
        event_id, event_type, body = event_for(payment)
        with self._lock:
            if self._closed:
                return event_id
            redeliver = self._random.random() < self.config.redeliver_rate
            job = _Job(event_id, event_type, payment.id, body, 1, 1, redeliver)
            self._push(time.monotonic(), job)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="payonce-sandbox-webhooks", daemon=True
                )
                self._thread.start()
        return event_id

    def attempts(self) -> list[WebhookAttempt]:
        with self._lock:
            return list(self._attempts)

    def pending(self) -> int:
        """Deliveries queued or in flight."""
        with self._lock:
            return len(self._queue) + self._in_flight

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until every scheduled delivery (retries and redeliveries too) has ended."""
        with self._lock:
            return self._lock.wait_for(
                lambda: not self._queue and not self._in_flight, timeout=timeout
            )

    def reset(self, timeout: float) -> bool:
        """Forget queued deliveries and recorded attempts; draw redeliveries afresh.

        Waits up to ``timeout`` seconds for a delivery being sent to end (it is not
        recorded, nor retried); False if one still is.
        """
        with self._lock:
            self._queue.clear()
            self._attempts.clear()
            self._random = random.Random(self.config.seed)
            self._generation += 1
            self._lock.notify_all()
            return self._lock.wait_for(lambda: not self._in_flight, timeout)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._queue.clear()
            self._lock.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.config.timeout + 1)

    # -- the thread ------------------------------------------------------------------------

    def _push(self, due: float, job: _Job) -> None:
        heapq.heappush(self._queue, (due, next(self._order), job))
        self._lock.notify_all()

    def _next(self) -> tuple[_Job, int] | None:
        with self._lock:
            while not self._closed:
                if self._queue:
                    due = self._queue[0][0]
                    wait = due - time.monotonic()
                    if wait <= 0:
                        _, _, job = heapq.heappop(self._queue)
                        self._in_flight += 1
                        return job, self._generation
                    self._lock.wait(wait)
                else:
                    self._lock.wait()
            return None

    def _run(self) -> None:
        with httpx.Client(timeout=self.config.timeout, trust_env=False) as client:
            while (taken := self._next()) is not None:
                job, generation = taken
                attempt = self._send(client, job)
                with self._lock:
                    self._in_flight -= 1
                    if generation == self._generation and not self._closed:
                        self._attempts.append(attempt)
                        self._follow_up(job, attempt)
                    self._lock.notify_all()

    def _send(self, client: httpx.Client, job: _Job) -> WebhookAttempt:
        headers = {
            "Content-Type": "application/json",
            self.config.header: sign(job.body, self.config.secrets),
            "User-Agent": "payonce-sandbox-webhooks",
        }
        status: int | None = None
        error: str | None = None
        text = ""
        try:
            response = client.post(self.config.url, content=job.body, headers=headers)
        except Exception as exc:  # any failure to deliver is a failed attempt, then a retry
            error = f"{type(exc).__name__}: {exc}"
        else:
            status = response.status_code
            text = response.text[:_RESPONSE_CHARS]
        return WebhookAttempt(
            event_id=job.event_id,
            event_type=job.event_type,
            payment_id=job.payment_id,
            delivery=job.delivery,
            attempt=job.attempt,
            at=time.time(),
            status_code=status,
            error=error,
            response=text,
        )

    def _follow_up(self, job: _Job, attempt: WebhookAttempt) -> None:
        """Schedule the retry or the deliberate redelivery this attempt calls for."""
        now = time.monotonic()
        config = self.config
        if not attempt.accepted:
            if job.attempt < config.max_attempts:
                wait = min(config.retry_wait * 2 ** (job.attempt - 1), config.max_retry_wait)
                self._push(now + wait, attrs.evolve(job, attempt=job.attempt + 1))
            return
        if job.redeliver and job.delivery == 1:
            again = attrs.evolve(job, delivery=2, attempt=1, redeliver=False)
            self._push(now + config.redeliver_delay, again)
