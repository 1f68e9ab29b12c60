"""API keys in the OS keyring: service ``payonce``, one entry per account; and which key
recovers which account's journaled intents: only the one whose fingerprint
(``credential_fingerprint``) an intent journaled sends it again."""

from ._credentials import (
    credential_fingerprint,
    delete_api_key,
    recovery_api_key,
    store_api_key,
    stored_accounts,
)

__all__ = [
    "credential_fingerprint",
    "delete_api_key",
    "recovery_api_key",
    "store_api_key",
    "stored_accounts",
]
