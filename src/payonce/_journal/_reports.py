"""What the journal reports about itself: a check's findings, each committed transaction."""

from __future__ import annotations

import attrs

from ._rows import DamagedRow
from ._schema import SCHEMA_VERSION

__all__ = ["JournalCommitted", "JournalReport"]


@attrs.frozen
class JournalReport:
    """The result of ``journal.check()``: integrity, schema, and what it holds."""

    location: str
    ok: bool
    problems: tuple[str, ...]
    schema_version: int
    intents_by_state: dict[str, int]
    unacknowledged: int
    size_bytes: int
    latest_schema_version: int = SCHEMA_VERSION
    """This payonce's schema: a journal below it is read as it is, and migrated by the next
    payonce that opens it to write."""
    contents_read: bool = True
    """False when the file is too damaged to read its schema version and counts: they are
    then 0 and mean nothing. A damaged file whose rows still read has them, as read."""
    damaged_rows: tuple[DamagedRow, ...] = ()
    """The rows that no longer decode, each read as a listing or a recovery pass reads it:
    those leave them out and go on with the rest. Any of them makes ``ok`` False."""


@attrs.frozen
class JournalCommitted:
    """One journal transaction committed; ``durable`` ones were fsynced first."""

    location: str
    seconds: float
    durable: bool
