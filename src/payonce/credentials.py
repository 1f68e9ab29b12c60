"""API keys in the OS keyring: service ``payonce``, one entry per account."""

from ._credentials import delete_api_key, store_api_key, stored_accounts

__all__ = ["delete_api_key", "store_api_key", "stored_accounts"]
