"""payonce: a payment-client SDK with built-in safe retries.

One idempotency key per business intent, journaled before anything is sent, retried under
that key, replayed once answered, and reconciled when the outcome cannot be known.
"""

from ._async_client import AsyncClient, AsyncOperation
from ._client import Client, Operation
from ._core import ResponseInfo, ResumeResult, RetryEvent, response_info
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
from ._providers import Lookup, ProviderProfile, register_profile
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
    "WebhookSignatureError",
    "__version__",
    "default_journal_path",
    "open_journal",
    "register_profile",
    "response_info",
]
