"""Every error payonce raises, under one base class.

```
PayonceError
├── ConfigurationError      settings or credentials are missing or unusable
├── JournalError            the journal cannot be opened, read or written
│   └── JournalBusy         another process held the journal past the busy timeout
├── IntentError             something about one intent (carries key and reference)
│   ├── IntentMismatch      same intent, different request: a caller bug, nothing sent
│   ├── CredentialMismatch  not the credential that journaled it: nothing sent, skipped
│   ├── IntentInFlight      another worker is sending this intent right now
│   ├── IntentStateError    the intent's state does not allow what was asked
│   ├── OutcomeUnknown      the provider may or may not have executed it: reconcile
│   ├── ProviderUnavailable the provider provably never executed the request
│   └── ProviderError       the provider answered with a refusal (4xx)
│       └── AuthenticationError  refused before executing: credentials or permission
└── WebhookError            a webhook could not be accepted
    └── WebhookSignatureError  missing, stale, forged or unverifiable signature
```

Each message says what happened, to which intent, and what to do next. None of them
ever contains an API key or a stored request body.
"""

from __future__ import annotations

from typing import Any

import httpx

__all__ = [
    "AuthenticationError",
    "ConfigurationError",
    "CredentialMismatch",
    "IntentError",
    "IntentInFlight",
    "IntentMismatch",
    "IntentStateError",
    "JournalBusy",
    "JournalError",
    "OutcomeUnknown",
    "PayonceError",
    "ProviderError",
    "ProviderUnavailable",
    "WebhookError",
    "WebhookSignatureError",
]


class PayonceError(Exception):
    """Base class of every error raised by payonce."""


class ConfigurationError(PayonceError, ValueError):
    """A setting or credential is missing or unusable; the message says how to fix it."""


class JournalError(PayonceError):
    """The journal could not be opened, read or written.

    payonce never overwrites or silently recreates a journal it cannot read: the file
    is left exactly as it was found. ``may_have_executed`` is True when the failing write
    came after the request may have left (recording its answer, say): the provider may then
    have executed it, and calling again with the same reference once the journal works
    settles it under the same key without paying twice. Otherwise nothing was sent.
    """

    def __init__(self, message: str, *, location: str, may_have_executed: bool = False) -> None:
        super().__init__(message)
        self.location = location
        self.may_have_executed = may_have_executed


class JournalBusy(JournalError):
    """Another process held the journal locked for longer than the busy timeout."""


class IntentError(PayonceError):
    """An error about one intent: carries its idempotency key and the caller's reference.

    For a step of an intent block (its second request and later, keyed ``KEY-stepN``),
    ``key`` is the step's own key, ``reference`` the block's, ``step`` the step's position
    and ``intent_key`` the key of the intent (its step 1) it belongs to.
    """

    step: int | None
    """The request's position in its intent block (1: the intent itself), for an error
    raised by a call in a block or a one-shot call, or by ``resume`` or ``reconcile``
    about a step 2 or later (read off its reference, ``order-1#step2``); None for one
    they raise about any other intent, which they drive without its block."""
    intent_key: str | None
    """For a step 2 or later: the key of its intent (step 1's); None otherwise."""

    def __init__(self, message: str, *, key: str | None, reference: str | None) -> None:
        super().__init__(message)
        self.key = key
        self.reference = reference
        self.step = None
        self.intent_key = None


class IntentMismatch(IntentError, ValueError):
    """The same intent was asked for with a different request. Nothing was sent.

    Either the caller reused a reference (or key) for another operation, or the request
    was built differently this time. The message says what differs and the state of the
    intent already journaled: a pending or unknown one may have executed, so call again
    with the first request (or reconcile it) rather than pay under a new reference. Use a
    new reference for a new operation.
    """

    def __init__(
        self,
        message: str,
        *,
        key: str | None,
        reference: str | None,
        stored_fingerprint: str,
        new_fingerprint: str,
    ) -> None:
        super().__init__(message, key=key, reference=reference)
        self.stored_fingerprint = stored_fingerprint
        self.new_fingerprint = new_fingerprint


class CredentialMismatch(IntentError):
    """The credential at hand is not the one that journaled the intent. Nothing was sent,
    nor looked up.

    A provider keeps idempotency keys per account: the intent's key sent with another
    account's credential would be a new payment there, and a status look-up under it would
    answer "no such payment" for one that exists. A run again of the code that brings
    another credential raises it; ``resume``, ``reconcile`` and the worker skip the intent
    with it when no key they have is the one that sent it. ``journaled`` is the
    fingerprint wanted (``cred:…``, never the secret; None: the intent journaled none),
    ``offered`` what was at hand (the fingerprints, with where each came from).
    """

    def __init__(
        self,
        message: str,
        *,
        key: str | None,
        reference: str | None,
        journaled: str | None,
        offered: tuple[str, ...],
    ) -> None:
        super().__init__(message, key=key, reference=reference)
        self.journaled = journaled
        self.offered = offered


class IntentInFlight(IntentError):
    """Another worker holds this intent's lease and is sending it right now."""


class IntentStateError(IntentError):
    """The intent is in a state that does not allow this (e.g. abandoning a settled one)."""


class OutcomeUnknown(IntentError):
    """The provider may have executed the intent; retrying could not tell.

    The intent is journaled as ``unknown`` and is never resent blindly: reconcile it
    against the provider's status endpoint (``payonce reconcile KEY``).
    """

    def __init__(self, message: str, *, key: str, reference: str | None, reason: str) -> None:
        super().__init__(message, key=key, reference=reference)
        self.reason = reason


class ProviderUnavailable(IntentError):
    """No attempt was executed: each failed before reaching the provider, or was refused
    with an answer that proves it was not executed (429 rate limiting).

    The intent stays ``pending`` under its key: calling again later is safe.
    """


class ProviderError(IntentError):
    """The provider refused the request (a non-retryable 4xx).

    A definitive refusal is journaled as ``failed`` and replayed on later calls for the
    same intent; an ``AuthenticationError`` is not (nothing was executed).
    """

    later_steps: tuple[tuple[int, str, str], ...]
    """For a step 2 or later of a block whose refusal is replayed: the steps its block
    journaled after it, as (position, key, state), when a run went on past the refusal
    with another request (the customer's other card). Not empty, the refusal is **not**
    the intent's outcome (a later step may have paid): the block raises
    ``IntentMismatch`` as it ends unless it goes on to them. Empty otherwise."""

    def __init__(
        self,
        message: str,
        *,
        key: str,
        reference: str | None,
        response: httpx.Response,
    ) -> None:
        super().__init__(message, key=key, reference=reference)
        self.response = response
        self.later_steps = ()

    @property
    def status_code(self) -> int:
        return self.response.status_code


class AuthenticationError(ProviderError):
    """The request was refused with 401, 403 (or another status the profile lists in
    ``refused_statuses``): a wrong, revoked or rotated API key, or a missing permission.

    The intent stays ``pending`` under its key and holds no lease: once the key or
    permission is fixed, calling again sends it under the same key. When the provider wrote
    the refusal, nothing was executed (``may_have_executed`` False). When something else did
    (a firewall's page, which may block the answer of a request the provider already ran),
    ``may_have_executed`` is True: do not pay the order again under a new reference, and
    payonce resends it only while the provider still remembers the key.
    """

    def __init__(self, message: str, *, may_have_executed: bool = False, **about: Any) -> None:
        super().__init__(message, **about)
        self.may_have_executed = may_have_executed


class WebhookError(PayonceError):
    """A webhook delivery could not be accepted; the provider will redeliver it."""


class WebhookSignatureError(WebhookError, ValueError):
    """The delivery's signature is missing, stale, forged, or made with an unknown secret.

    Answer it with 400: never hand an unverified event to a handler.
    """
