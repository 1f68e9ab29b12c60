"""Provider profiles: what differs between payment providers' idempotency contracts."""

from ._profile import Lookup, ProviderProfile, get_profile, register_profile

__all__ = ["Lookup", "ProviderProfile", "get_profile", "register_profile"]
