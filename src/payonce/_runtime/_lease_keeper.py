"""One lease keeper for everything payonce holds a lease on while work runs: the attempts
of intents (``Client``, ``AsyncClient``) and the handlers of webhook events
(``WebhookInbox``).

A lease must outlast the slowest piece of work it covers, or another worker could take
the intent (or event) over while this one still waits. So while a lease is held, the
keeper renews it every third of its length. The flavours differ only in what ticks: a
daemon thread for sync code (here), an asyncio task for async code (``_lease_task``: the
journal writes of a tick then run in one worker thread, never on the event loop). Either
stops by itself once it holds nothing, and starts again with the next lease.

When a lease is lost (its renewal finds another owner, because the lease expired during a
stall and another worker took it over), the keeper logs one warning, stops renewing it
and marks it ``lost``. It does not interrupt the work: the holder finds out at its next
journal write, which the journal refuses (an intent: ``IntentInFlight``; the new holder
settles it) or reports (a webhook event: ``finish_event`` says it was taken over). A
renewal that fails for another reason (the journal is busy) is logged and tried again at
the next tick.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from ..errors import PayonceError

__all__ = ["Keeper", "Lease", "ThreadLeaseKeeper"]

logger = logging.getLogger("payonce")


@attrs.define(eq=False)
class Lease:
    """One lease held while work runs. ``renew`` extends it and says whether it is still
    held; it is called from the keeper's thread."""

    what: str
    """What it covers, for the log: "intent 01J…", "webhook event evt_…"."""
    renew: Callable[[], bool]
    lost: bool = False
    log_extra: dict[str, Any] = attrs.field(factory=dict)
    """``extra=`` of its log records (an intent's key, reference and state)."""


class Keeper:
    """The bookkeeping both flavours share: which leases are held, and one renewal round."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._leases: set[Lease] = set()

    def _renew(self, leases: list[Lease]) -> None:
        for lease in leases:
            if lease.lost:
                continue
            try:
                held = lease.renew()
            except PayonceError as exc:
                logger.warning(
                    "%s: lease renewal failed, trying again: %s",
                    lease.what,
                    exc,
                    extra=lease.log_extra,
                )
                continue
            if not held:
                lease.lost = True
                logger.warning(
                    "%s: lease lost while its work was running (another worker took it over "
                    "after it expired); its next journal write will be refused",
                    lease.what,
                    extra=lease.log_extra,
                )


class ThreadLeaseKeeper(Keeper):
    """Renews from a daemon thread; for sync code."""

    def __init__(self, interval: float) -> None:
        super().__init__(interval)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def holding(self, lease: Lease) -> Iterator[Lease]:
        self.hold(lease)
        try:
            yield lease
        finally:
            self.let_go(lease)

    def hold(self, lease: Lease) -> None:
        """Keep ``lease`` alive until ``let_go``; an executor holds one for a whole drive."""
        with self._lock:
            self._leases.add(lease)
            if self._thread is None:
                self._wake.clear()
                self._thread = threading.Thread(
                    target=self._tick, name="payonce-lease-keeper", daemon=True
                )
                self._thread.start()

    def let_go(self, lease: Lease) -> None:
        with self._lock:
            self._leases.discard(lease)

    def _tick(self) -> None:
        while not self._wake.wait(self.interval):
            with self._lock:
                if not self._leases:
                    self._thread = None
                    return
                leases = list(self._leases)
            self._renew(leases)

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join()
