"""payonce: a payment-client SDK with built-in safe retries.

One idempotency key per business intent, journaled before anything is sent, retried under
that key, replayed once answered, and reconciled when the outcome cannot be known.
"""

from typing import TYPE_CHECKING, Any

from ._async_client import AsyncClient, AsyncOperation
from ._client import Client, Operation
from ._core import ResponseInfo, ResumeResult, RetryEvent, response_info
from ._credentials import delete_api_key, store_api_key, stored_accounts
from ._intent import IntentState, KeyFormat
from ._journal import (
    AttemptRecord,
    IntentRecord,
    Journal,
    JournalReport,
    ReconciliationRecord,
    SQLiteJournal,
    default_journal_path,
    open_journal,
)
from ._providers import (
    Lookup,
    ProviderProfile,
    adyen_profile,
    adyen_reference_lookup,
    get_profile,
    mollie_profile,
    register_profile,
    stripe_profile,
)
from ._reconcile import ReconcileResult
from ._retry import RetryPolicy
from ._version import __version__
from .errors import (
    ConfigurationError,
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
from .webhooks import WebhookInbox

__all__ = [
    "AsyncClient",
    "AsyncOperation",
    "AttemptRecord",
    "Client",
    "ConfigurationError",
    "IntentError",
    "IntentInFlight",
    "IntentMismatch",
    "IntentRecord",
    "IntentState",
    "IntentStateError",
    "Journal",
    "JournalBusy",
    "JournalError",
    "JournalReport",
    "KeyFormat",
    "Lookup",
    "Operation",
    "OutcomeUnknown",
    "PayonceError",
    "PostgresJournal",
    "ProviderError",
    "ProviderProfile",
    "ProviderUnavailable",
    "ReconcileResult",
    "ReconciliationRecord",
    "ResponseInfo",
    "ResumeResult",
    "RetryEvent",
    "RetryPolicy",
    "SQLiteJournal",
    "WebhookError",
    "WebhookInbox",
    "WebhookSignatureError",
    "__version__",
    "adyen_profile",
    "adyen_reference_lookup",
    "default_journal_path",
    "delete_api_key",
    "get_profile",
    "mollie_profile",
    "open_journal",
    "register_profile",
    "response_info",
    "store_api_key",
    "stored_accounts",
    "stripe_profile",
]

if TYPE_CHECKING:
    from ._journal import PostgresJournal


def __getattr__(name: str) -> Any:
    # PostgresJournal imports psycopg: only for those who ask for it.
    if name == "PostgresJournal":
        from . import _journal

        return _journal.PostgresJournal
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
