"""An intent's draft: the caller's request, key and headers checked before anything is
journaled, and what the journal keeps of them (the one fingerprint, the kept headers)."""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from .._lifecycle import (
    CanonicalRequest,
    IntentDraft,
    KeyFormat,
    account_scope_of,
    check_headers,
    make_scope,
    new_key,
    validate_key,
)
from .._providers._profile import ProviderProfile
from ..errors import ConfigurationError

__all__ = ["Drafter"]


class Drafter:
    """Drafts the intents of one client: its provider, account, base URL and key format."""

    def __init__(
        self,
        profile: ProviderProfile,
        account: str,
        base_url: str,
        key_format: KeyFormat,
        credential: str | None = None,
    ) -> None:
        self.profile = profile
        self.credential = credential
        """The fingerprint of the client's own credential: a draft's, unless its request
        brings its own (through ``client.transport()``: the executor sets that one)."""
        self.account = account
        self.base_url = base_url
        self.key_format = key_format
        self._base_path = httpx.URL(base_url).path.rstrip("/")
        """The base URL's own path (``/v71`` of Adyen's): what a provider sees before a path."""
        self._unjournaled_headers = profile.secret_headers() | {profile.key_header.lower()}

    def draft(
        self,
        canonical: CanonicalRequest,
        *,
        reference: str | None,
        key: str | None,
        key_supplied: bool,
        headers: Mapping[str, str] | None,
    ) -> IntentDraft:
        # A key in the body (Square's) is not part of what the fingerprint compares.
        canonical, body_key = self.profile.without_body_key(
            canonical, self._base_path + canonical.path
        )
        if body_key is not None:
            if key is None:
                key, key_supplied = body_key, True  # the caller's, set on purpose
            elif key != body_key:
                raise ConfigurationError(
                    f"the body's {self.profile.key_field!r} ({body_key!r}) is not this "
                    f"intent's key ({key!r}): give one of them, or the same in both"
                )
        if key is not None:
            validate_key(key, max_length=self.profile.key_max_length)
        unfit = self.profile.refuse_request(
            canonical.method, self._base_path + canonical.path, canonical.content_type
        )
        if unfit is not None:
            raise ConfigurationError(unfit)
        check_headers(headers)
        secret = self._unjournaled_headers
        if refused := sorted(name for name in headers or {} if name.lower() in secret):
            # Never journaled, so never sent again after a restart; and never quoted.
            raise ConfigurationError(
                f"header {refused[0]!r} is not an intent's to carry: payonce never journals "
                "credentials and sets the idempotency key itself. Give the API key as "
                "api_key= (or PAYONCE_API_KEY), proxy credentials to the transport, and a key "
                "of your own as key="
            )
        kept = sorted(
            (name.lower(), value)
            for name, value in (headers or {}).items()
            if name.lower() != "content-type"
        )
        # Headers such as Stripe-Account change what the request does: the same intent
        # with other headers is another request.
        fingerprint = canonical.fingerprint_with(kept)
        if canonical.content_type:
            kept.append(("content-type", canonical.content_type))
        return IntentDraft(
            key=key or new_key(self.key_format),
            key_supplied=key_supplied,
            scope=make_scope(self.account, canonical.method, canonical.path),
            reference=reference,
            account=self.account,
            provider=self.profile.name,
            method=canonical.method,
            url=self.base_url + canonical.target,
            fingerprint=fingerprint,
            request_headers=tuple(kept),
            body=canonical.body,
            key_terms=self.profile.key_terms,
            credential=self.credential,
            account_scope=account_scope_of(kept, self.profile.account_scope_headers),
        )
