"""payonce: a payment-client SDK with built-in safe retries.

One idempotency key per business intent, journaled before anything is sent, retried under
that key, replayed once answered, and reconciled when the outcome cannot be known.

The names here are what most code needs. Records and hooks for advanced use live in the
public modules ``payonce.journal``, ``payonce.providers``, ``payonce.records``,
``payonce.hooks`` (and ``payonce.otel`` with the ``otel`` extra), ``payonce.credentials``,
``payonce.errors``, ``payonce.webhooks`` and ``payonce.sandbox``.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

# First, before anything imports httpx: see payonce._lean_import.
from . import _lean_import  # noqa: F401

# The public modules, so that ``import payonce`` is enough to reach their names.
from . import credentials as credentials
from . import hooks as hooks
from . import journal as journal
from . import providers as providers
from . import records as records
from ._journal._open import open_journal
from ._journal._reads import Journal
from ._lifecycle import IntentRecord, IntentState
from ._providers._profile import ProviderProfile, register_profile
from ._runtime._hooks import Hooks
from ._runtime._responses import response_info
from ._runtime._retrying import RetryPolicy
from ._runtime._sync import Client, Operation
from ._version import __version__
from .errors import (
    AuthenticationError,
    ConfigurationError,
    CredentialMismatch,
    IntentError,
    IntentInFlight,
    IntentMismatch,
    IntentStateError,
    JournalBusy,
    JournalError,
    OutcomeUnknown,
    PayonceError,
    ProviderError,
    ProviderUnavailable,
    WebhookError,
    WebhookSignatureError,
)

if _TYPE_CHECKING:
    from . import webhooks as webhooks
    from ._runtime._async import AsyncClient, AsyncOperation
    from .webhooks import WebhookInbox

__all__ = [
    "AsyncClient",
    "AsyncOperation",
    "AuthenticationError",
    "Client",
    "ConfigurationError",
    "CredentialMismatch",
    "Hooks",
    "IntentError",
    "IntentInFlight",
    "IntentMismatch",
    "IntentRecord",
    "IntentState",
    "IntentStateError",
    "Journal",
    "JournalBusy",
    "JournalError",
    "Operation",
    "OutcomeUnknown",
    "PayonceError",
    "ProviderError",
    "ProviderProfile",
    "ProviderUnavailable",
    "RetryPolicy",
    "WebhookError",
    "WebhookInbox",
    "WebhookSignatureError",
    "__version__",
    "open_journal",
    "register_profile",
    "response_info",
]

# Names that were top-level before 0.1.0 and now live in a public module: still found, with
# a DeprecationWarning saying where, until they are removed.
_MOVED = {
    "AttemptRecord": "journal",
    "JournalReport": "journal",
    "PostgresJournal": "journal",
    "ReconciliationRecord": "journal",
    "SQLiteJournal": "journal",
    "default_journal_path": "journal",
    "Lookup": "providers",
    "adyen_profile": "providers",
    "adyen_reference_lookup": "providers",
    "get_profile": "providers",
    "mollie_profile": "providers",
    "stripe_profile": "providers",
    "ReconcileResult": "records",
    "ResponseInfo": "records",
    "ResumeResult": "records",
    "RetryEvent": "records",
    "delete_api_key": "credentials",
    "store_api_key": "credentials",
    "stored_accounts": "credentials",
}


# Imported when first used: a service that only uses ``Client`` never loads asyncio or the
# webhook inbox (``import payonce`` stays close to ``import httpx``, bench/import_time.py).
_ON_FIRST_USE = {
    "AsyncClient": "._runtime._async",
    "AsyncOperation": "._runtime._async",
    "WebhookInbox": ".webhooks",
    "webhooks": ".webhooks",
}


def __getattr__(name: str) -> _Any:
    import importlib

    if (home := _ON_FIRST_USE.get(name)) is not None:
        found = importlib.import_module(home, __name__)
        value = found if name == "webhooks" else getattr(found, name)
        globals()[name] = value  # found directly from now on
        return value
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import warnings

    warnings.warn(
        f"payonce.{name} has moved to payonce.{module}.{name}; the old name will be removed",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_ON_FIRST_USE})
