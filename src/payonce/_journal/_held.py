"""The rows a journal object has just created for its callers, kept for their settle.

A one-shot intent is created, sent and settled by one call, under a lease whose owner
names that call alone (``new_owner``: host, pid, start time, random). While that lease
is held no one else writes the row, so the settle need not read it back to know what it
holds: it is the record the claim returned. The settle still proves it, in the statement
that writes: its UPDATE matches only the row of that creation (``created_at``), still
held by that owner, still in that state, and falls back to reading the row when it
matches none. So a record kept here is only ever a guess the database confirms.

Any other write of the held intent (a new attempt, an attempt's end, a release) forgets
the key first. The kept records are bounded: a call that ends without any of them leaves
one, and past ``_LIMIT`` they are all dropped (each settle then reads its row, as before).
"""

from __future__ import annotations

from ._records import IntentRecord

__all__ = ["HeldRecords"]

_LIMIT = 1024


class HeldRecords:
    """Key → the record its claim created, until the holder's next write of it."""

    __slots__ = ("_records",)

    def __init__(self) -> None:
        self._records: dict[str, IntentRecord] = {}

    def keep(self, record: IntentRecord) -> None:
        if len(self._records) >= _LIMIT:
            self._records.clear()
        self._records[record.key] = record

    def take(self, key: str, owner: str) -> IntentRecord | None:
        """The record kept for ``key`` if ``owner`` holds it, no longer kept."""
        record = self._records.pop(key, None)
        return record if record is not None and record.lease_owner == owner else None

    def forget(self, key: str) -> None:
        self._records.pop(key, None)
