"""API keys in the OS keyring: service ``payonce``, one entry per account; and which key
recovers which account's journaled intents."""

from ._credentials import (
    delete_api_key,
    recovery_api_key,
    store_api_key,
    stored_accounts,
)

__all__ = [
    "delete_api_key",
    "recovery_api_key",
    "store_api_key",
    "stored_accounts",
]
