"""Stripe's PaymentIntent in the sandbox: the object, and how create and confirm move it.

Decisions only, no I/O: the API module parses the request and the store applies the
change in one transaction. The status flow is Stripe's for a card:

- created without a payment method: ``requires_payment_method``;
- created with one: ``requires_confirmation``;
- confirmed (at creation with ``confirm=true``, or by ``/confirm``): ``succeeded``
  (``requires_capture`` with ``capture_method=manual``), or, for a declining test payment
  method, a 402 ``card_error`` and the intent back at ``requires_payment_method`` with its
  ``last_payment_error`` and no payment method, as Stripe leaves a declined intent.

Any ``pm_...`` id is a card that pays, except Stripe's declining test payment methods
(``pm_card_visa_chargeDeclined`` and the others in ``DECLINING_PAYMENT_METHODS``).
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import Mapping
from typing import Any, Final

import attrs

__all__ = [
    "CONFIRMABLE",
    "DECLINING_PAYMENT_METHODS",
    "Attempt",
    "Refusal",
    "StripeIntent",
    "confirmed",
    "new_intent",
]

DECLINING_PAYMENT_METHODS: Final[Mapping[str, str]] = {
    # Stripe's test payment methods that decline, and their decline_code.
    "pm_card_visa_chargeDeclined": "generic_decline",
    "pm_card_chargeDeclined": "generic_decline",
    # Attaches to a customer, then every charge on it fails (card 4000000000000341).
    "pm_card_chargeCustomerFail": "generic_decline",
    "pm_card_visa_chargeDeclinedInsufficientFunds": "insufficient_funds",
    "pm_card_chargeDeclinedInsufficientFunds": "insufficient_funds",
    "pm_card_visa_chargeDeclinedLostCard": "lost_card",
    "pm_card_visa_chargeDeclinedStolenCard": "stolen_card",
}
CONFIRMABLE: Final = frozenset({"requires_payment_method", "requires_confirmation"})
"""The statuses ``/confirm`` moves on (the first only with a payment method given)."""
_DECLINED_MESSAGE: Final = "Your card was declined."


def _new_id(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(18).replace("-", "x").replace("_", "y")


@attrs.frozen
class Refusal:
    """A request the intent's state refuses: nothing executes, nothing is stored."""

    status: int
    type: str
    message: str
    param: str | None = None


@attrs.frozen
class StripeIntent:
    """A PaymentIntent as the sandbox stores it; ``to_json`` is the object Stripe answers."""

    id: str
    account: str
    amount: int
    currency: str
    status: str
    capture_method: str
    payment_method: str | None
    payment_method_types: tuple[str, ...]
    metadata: Mapping[str, str]
    description: str | None
    client_secret: str
    latest_charge: str | None
    last_payment_error: Mapping[str, Any] | None
    created_at: float

    def to_json(self) -> dict[str, Any]:
        paid = self.status == "succeeded"
        return {
            "id": self.id,
            "object": "payment_intent",
            "amount": self.amount,
            "amount_capturable": self.amount if self.status == "requires_capture" else 0,
            "amount_received": self.amount if paid else 0,
            "canceled_at": None,
            "cancellation_reason": None,
            "capture_method": self.capture_method,
            "client_secret": self.client_secret,
            "confirmation_method": "automatic",
            "created": int(self.created_at),
            "currency": self.currency,
            "customer": None,
            "description": self.description,
            "last_payment_error": (
                None if self.last_payment_error is None else dict(self.last_payment_error)
            ),
            "latest_charge": self.latest_charge,
            "livemode": False,
            "metadata": dict(self.metadata),
            "next_action": None,
            "payment_method": self.payment_method,
            "payment_method_types": list(self.payment_method_types),
            "status": self.status,
        }

    def to_row(self) -> dict[str, Any]:
        return {
            **attrs.asdict(self),
            "payment_method_types": json.dumps(list(self.payment_method_types)),
            "metadata": json.dumps(dict(self.metadata)),
            "last_payment_error": (
                None if self.last_payment_error is None else json.dumps(self.last_payment_error)
            ),
        }

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> StripeIntent:
        data = dict(row)
        error = data["last_payment_error"]
        return cls(
            **{
                **data,
                "payment_method_types": tuple(json.loads(data["payment_method_types"])),
                "metadata": json.loads(data["metadata"]),
                "last_payment_error": None if error is None else json.loads(error),
            }
        )


@attrs.frozen
class Attempt:
    """What an execution leaves: the intent as it now is, and the decline if there was one."""

    intent: StripeIntent
    declined: bool = False

    def answer(self) -> tuple[int, dict[str, Any]]:
        """Stripe's status and body for it: the intent, or a card_error that carries it."""
        body = self.intent.to_json()
        if not self.declined:
            return 200, body
        error = dict(self.intent.last_payment_error or {})
        error.update({"type": "card_error", "payment_intent": body})
        return 402, {"error": error}


def new_intent(
    account: str,
    *,
    amount: int,
    currency: str,
    payment_method: str | None,
    payment_method_types: tuple[str, ...],
    capture_method: str,
    metadata: Mapping[str, str],
    description: str | None,
    now: float,
) -> StripeIntent:
    intent_id = _new_id("pi_")
    return StripeIntent(
        id=intent_id,
        account=account,
        amount=amount,
        currency=currency,
        status="requires_confirmation" if payment_method else "requires_payment_method",
        capture_method=capture_method,
        payment_method=payment_method,
        payment_method_types=payment_method_types,
        metadata=metadata,
        description=description,
        client_secret=f"{intent_id}_secret_{secrets.token_hex(12)}",
        latest_charge=None,
        last_payment_error=None,
        created_at=now,
    )


def confirmed(intent: StripeIntent, payment_method: str | None) -> Attempt | Refusal:
    """``intent`` confirmed with ``payment_method`` (or the one it has): one charge attempt."""
    if intent.status == "succeeded":
        return Refusal(
            400,
            "payment_intent_unexpected_state",
            "You cannot confirm this PaymentIntent because it has already succeeded after "
            "being previously confirmed.",
        )
    if intent.status not in CONFIRMABLE:
        return Refusal(
            400,
            "payment_intent_unexpected_state",
            f"You cannot confirm this PaymentIntent because it has a status of {intent.status}.",
        )
    method = payment_method or intent.payment_method
    if method is None:
        return Refusal(
            400,
            "payment_intent_unexpected_state",
            "You cannot confirm this PaymentIntent because it's missing a payment method. "
            "To confirm the PaymentIntent, pass a payment_method.",
            param="payment_method",
        )
    charge = _new_id("ch_")
    decline_code = DECLINING_PAYMENT_METHODS.get(method)
    if decline_code is not None:
        error = {
            "charge": charge,
            "code": "card_declined",
            "decline_code": decline_code,
            "message": _DECLINED_MESSAGE,
            "payment_method": {"id": method, "object": "payment_method", "type": "card"},
            "type": "card_error",
        }
        declined = attrs.evolve(
            intent,
            status="requires_payment_method",
            payment_method=None,
            latest_charge=charge,
            last_payment_error=error,
        )
        return Attempt(declined, declined=True)
    status = "requires_capture" if intent.capture_method == "manual" else "succeeded"
    paid = attrs.evolve(
        intent,
        status=status,
        payment_method=method,
        latest_charge=charge,
        last_payment_error=None,
    )
    return Attempt(paid)
