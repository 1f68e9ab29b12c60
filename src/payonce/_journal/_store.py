"""``IntentStore``: a payonce journal with the writes only payonce's clients and webhook
inbox make (claims, leases, attempts, outcomes, events). ``SQLiteJournal`` and
``PostgresJournal`` are stores; a user's code reads and operates them as ``Journal``."""

from __future__ import annotations

from ._claims import Claims
from ._inbox import Inbox
from ._reads import Journal

__all__ = ["IntentStore"]


class IntentStore(Claims, Journal, Inbox):
    """Every method of the public ``Journal`` and every write, for any SQL backend that
    provides the transaction runners (see ``Engine``)."""
