"""Provider profiles: what differs between payment providers' idempotency contracts."""

from ._adyen import ADYEN, adyen_profile, adyen_reference_lookup
from ._mollie import MOLLIE, mollie_profile
from ._profile import GENERIC, SANDBOX, Lookup, ProviderProfile, get_profile, register_profile
from ._stripe import STRIPE, stripe_profile

for _builtin in (STRIPE, ADYEN, MOLLIE):
    register_profile(_builtin)
del _builtin

__all__ = [
    "ADYEN",
    "GENERIC",
    "MOLLIE",
    "SANDBOX",
    "STRIPE",
    "Lookup",
    "ProviderProfile",
    "adyen_profile",
    "adyen_reference_lookup",
    "get_profile",
    "mollie_profile",
    "register_profile",
    "stripe_profile",
]
