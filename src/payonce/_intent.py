"""Moved to ``payonce._lifecycle``: kept while the journal modules are reorganised."""

from ._lifecycle import (
    MAX_KEY_LENGTH,
    CanonicalRequest,
    IntentState,
    KeyFormat,
    canonical_request,
    make_scope,
    new_key,
    validate_key,
)

__all__ = [
    "MAX_KEY_LENGTH",
    "CanonicalRequest",
    "IntentState",
    "KeyFormat",
    "canonical_request",
    "make_scope",
    "new_key",
    "validate_key",
]
