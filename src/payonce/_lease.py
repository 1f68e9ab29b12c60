"""Moved to ``payonce._lifecycle``: kept while the journal modules are reorganised."""

from ._lifecycle import new_owner, owner_is_dead

__all__ = ["new_owner", "owner_is_dead"]
