"""How the sandbox behaves: its own contract by default, or a real provider's (presets)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

import attrs

from payonce.sandbox._dialects import DIALECTS, Dialect
from payonce.sandbox._faults import Faults
from payonce.sandbox._webhooks import WebhookConfig

DEFAULT_API_KEY: Final = "sk_test_payonce"
DEFAULT_ACCOUNT: Final = "acct_demo"
MOLLIE_TEST_API_KEY: Final = "test_payonce"
"""Also valid in Mollie's preset: mollie-api-python takes only test_… and live_… keys."""

AuthMode = Literal["bearer", "x-api-key"]
ProviderLike = Literal["stripe", "adyen", "mollie", "square"]


def _default_api_keys() -> dict[str, str]:
    return {DEFAULT_API_KEY: DEFAULT_ACCOUNT}


def _non_negative(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be non-negative, got {value!r}")


def _client_error_status(
    instance: object, attribute: attrs.Attribute[int | None], value: int | None
) -> None:
    if value is not None and not 400 <= value < 500:
        raise ValueError(f"{attribute.name} must be a 4xx status, got {value!r}")


@attrs.frozen
class SandboxConfig:
    """How the sandbox behaves. Every switch defaults to the sandbox's own contract; the
    others make it answer the way a real provider does (``SandboxConfig.like("stripe")``)."""

    api_keys: Mapping[str, str] = attrs.field(factory=_default_api_keys)
    key_lifetime: float = attrs.field(default=24 * 3600.0, validator=_non_negative)
    processing_seconds: float = attrs.field(default=0.0, validator=_non_negative)
    idempotency: Literal["strict", "racy", "none"] = attrs.field(
        default="strict", validator=attrs.validators.in_(("strict", "racy", "none"))
    )
    """The idempotency layer. ``strict``: a duplicate that arrives while the first still runs
    gets 409. ``racy``: it executes too (the key is only checked against completed
    requests), as some servers do. ``none``: every request executes."""
    faults: Faults = attrs.field(factory=Faults)
    store_path: str | None = None
    dialect: Dialect = attrs.field(default="sandbox", validator=attrs.validators.in_(DIALECTS))
    """Shape of error bodies: the sandbox's, Stripe's (``type``/``code``, idempotency_error)
    or Adyen's (``errorCode``, 704 while in progress; payments answer 200 with a
    ``resultCode``, ``Refused`` for a decline). Stripe's dialect also serves Stripe's own
    PaymentIntents API (``/v1/payment_intents``: create, confirm, retrieve, list, search)
    for stripe-python; ``SandboxConfig.like("stripe")`` adds Stripe's retry hints. Adyen's,
    Mollie's and Square's dialects also serve the resources their SDKs call (Adyen's
    ``/v{n}/payments`` and captures, Mollie's and Square's ``/v2/payments``)."""
    form_bodies: bool = False
    """Also accept ``application/x-www-form-urlencoded`` payments, with Stripe's
    ``metadata[name]=value`` keys."""
    auth: AuthMode = attrs.field(
        default="bearer", validator=attrs.validators.in_(("bearer", "x-api-key"))
    )
    """``Authorization: Bearer <key>``, or Adyen's ``X-API-Key: <key>``."""
    key_header: str = "Idempotency-Key"
    """The request header that carries the idempotency key."""
    retry_hint_header: str | None = None
    """A response header telling clients whether to retry, e.g. ``Stripe-Should-Retry``."""
    retry_hints: Mapping[int, bool] = attrs.field(factory=dict)
    """Its value per response status (API routes only); statuses not listed get none."""
    mismatch_status: int | None = attrs.field(default=None, validator=_client_error_status)
    """Status for a key reused with other parameters; None: 400 for Stripe, else 422."""
    webhooks: WebhookConfig | None = None
    """Where to deliver a signed event for every settled payment (None: no webhooks)."""

    @classmethod
    def like(cls, provider: ProviderLike, **overrides: Any) -> SandboxConfig:
        """A sandbox that answers the way ``provider`` documents (its payonce profile's peer)."""
        try:
            preset = _PRESETS[provider]
        except KeyError:
            known = ", ".join(sorted(_PRESETS))
            raise ValueError(f"no preset for {provider!r}; known: {known}") from None
        return cls(**{**preset, **overrides})


_PRESETS: Final[Mapping[str, Mapping[str, Any]]] = {
    "stripe": {
        "dialect": "stripe",
        "form_bodies": True,
        "key_lifetime": 24 * 3600.0,
        "retry_hint_header": "Stripe-Should-Retry",
        # A decline is final; a lost answer (503) or a busy key/object (409) is worth a retry.
        "retry_hints": {402: False, 409: True, 503: True},
    },
    "adyen": {
        "dialect": "adyen",
        "auth": "x-api-key",
        # Adyen keeps keys "a minimum of 31 days"; payonce's profile assumes only 7.
        "key_lifetime": 31 * 24 * 3600.0,
    },
    "mollie": {
        "dialect": "mollie",
        "key_lifetime": 3600.0,
        # mollie-api-python refuses a key that is not test_… or live_… before sending it.
        "api_keys": {DEFAULT_API_KEY: DEFAULT_ACCOUNT, MOLLIE_TEST_API_KEY: DEFAULT_ACCOUNT},
    },
    "square": {
        # Square's key travels in the JSON body; how long Square keeps one is not
        # documented, so the sandbox keeps it a day, as the payonce profile assumes.
        "dialect": "square",
        "key_lifetime": 24 * 3600.0,
    },
}
