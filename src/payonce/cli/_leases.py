"""Leases as an operator needs to see them: not only who holds one and until when, but
whether it still holds, since a worker killed mid-attempt leaves its lease written in the
journal until it runs out, though it blocks no one (``payonce.journal.owner_is_dead``)."""

from __future__ import annotations

from typing import Literal

import payonce

from ._common import iso

__all__ = ["LeaseStatus", "interrupted_verdict", "lease_status", "lease_text", "short_lease"]

LeaseStatus = Literal["held", "owner_dead", "expired"]

_LEASE_MARKS: dict[LeaseStatus, str] = {
    "held": "",
    "owner_dead": " (owner dead)",
    "expired": " (expired)",
}


def lease_status(record: payonce.IntentRecord, now: float) -> LeaseStatus | None:
    """Whether the intent's lease still keeps other workers off: ``held`` by a worker that
    is alive (or on another host: then it runs to expiry), held by an ``owner_dead``
    (a process of this host that is gone: the lease blocks no one), or ``expired``; None
    when no worker ever held it or the last one released it."""
    if record.lease_owner is None:
        return None
    if not record.lease_live(now):
        return "expired"
    if payonce.journal.owner_is_dead(record.lease_owner):
        return "owner_dead"
    return "held"


def lease_text(record: payonce.IntentRecord, now: float) -> str | None:
    """The lease whole: its owner, until when, and whether it still holds."""
    status = lease_status(record, now)
    if status is None:
        return None
    if record.lease_expires_at is None:
        return f"{record.lease_owner}{_LEASE_MARKS[status]}"
    until = iso(record.lease_expires_at, precise=False)
    return f"{record.lease_owner} until {until}{_LEASE_MARKS[status]}"


def short_lease(record: payonce.IntentRecord, now: float) -> str | None:
    """The lease in a table: until when a live one holds, or that it no longer does,
    without its owner's long name (``intents show`` has it), so that a leased intent keeps
    the table."""
    status = lease_status(record, now)
    if status is None:
        return None
    if status == "held":
        if record.lease_expires_at is None:
            return "held"
        return f"held until {iso(record.lease_expires_at, precise=False)}"
    return _LEASE_MARKS[status].strip(" ()")


_INTERRUPTED: dict[LeaseStatus | None, str] = {
    "owner_dead": "yes (worker died)",
    "expired": "yes (lease expired)",
}


def interrupted_verdict(lease: LeaseStatus | None) -> str:
    """Whether an attempt that never ended, and no live worker runs any more (``lease`` is
    not ``held``), may have executed: yes, and why it never ended."""
    return _INTERRUPTED.get(lease, "yes (interrupted)")
