"""``SQLJournal``: the public journal and the private store, for any SQL backend."""

from __future__ import annotations

import abc

from ._claims import Claims
from ._inbox import InboxMixin
from ._reads import Reads

__all__ = ["SQLJournal"]


class SQLJournal(Claims, Reads, InboxMixin, abc.ABC):
    """Every ``Journal`` and ``IntentStore`` method, for any backend that can run a ``Tx``.

    A backend provides the transaction runners and what is its own (see ``Engine``).
    """
