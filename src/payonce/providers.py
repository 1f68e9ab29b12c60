"""Provider profiles: what differs between payment providers' idempotency contracts.

A profile of your own is a ``ProviderProfile``; its ``refine`` hook may return a
``Verdict`` on an answer, built from an ``Outcome``.
"""

from ._lifecycle import Outcome, Verdict
from ._providers._adyen import adyen_profile, adyen_reference_lookup
from ._providers._mollie import mollie_profile
from ._providers._profile import (
    BodyKeyField,
    Lookup,
    ProviderProfile,
    ReconcileSchedule,
    get_profile,
    register_profile,
)
from ._providers._square import square_profile
from ._providers._stripe import stripe_profile

__all__ = [
    "BodyKeyField",
    "Lookup",
    "Outcome",
    "ProviderProfile",
    "ReconcileSchedule",
    "Verdict",
    "adyen_profile",
    "adyen_reference_lookup",
    "get_profile",
    "mollie_profile",
    "register_profile",
    "square_profile",
    "stripe_profile",
]
