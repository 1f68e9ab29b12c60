"""The provider profile and the registry of built-in profiles."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, Literal

import attrs
import httpx

from .._lifecycle import (
    DEFAULT_RECONCILE_SCHEDULE,
    CanonicalRequest,
    FormEncoder,
    KeyTerms,
    ReconcileSchedule,
    Verdict,
    form_pairs,
)
from ..errors import ConfigurationError

logger = logging.getLogger("payonce")

_TERMS_SAID: set[tuple[str, KeyTerms, KeyTerms]] = set()
"""The differences between a profile's key terms and an intent's journaled ones already
logged by this process: each is said once, not for every intent."""

__all__ = [
    "GENERIC",
    "SANDBOX",
    "BodyKeyField",
    "Lookup",
    "ProviderProfile",
    "ReconcileSchedule",
    "get_profile",
    "json_object",
    "key_lifetime_of",
    "names_idempotency",
    "register_profile",
]


def _value_as_is(value: str) -> str:
    return value


def _every_request(method: str, path: str) -> bool:
    return True


def _asks_more(method: str, path: str, body: bytes) -> bool:
    return False


@attrs.frozen
class Lookup:
    """How to ask the provider whether it executed an intent (used by reconciliation).

    ``GET {path}?{param}=<format_value(key or reference)>`` answers a list of matching
    objects under ``list_field``; an empty list means the provider has no record.
    """

    path: str
    by: Literal["key", "reference"] = "key"
    param: str = "idempotency_key"
    list_field: str = "data"
    status_field: str = "status"
    succeeded: frozenset[str] = frozenset({"succeeded", "paid", "authorised", "authorized"})
    failed: frozenset[str] = frozenset({"failed", "declined", "refused", "canceled"})
    """Values of ``status_field`` that settle the intent; any other leaves it unknown."""
    format_value: Callable[[str], str] = _value_as_is
    """Turns the key or reference into the query value, e.g. a search expression such as
    Stripe's ``metadata['payonce_idempotency_key']:'KEY'``."""
    creation_only: Callable[[str, str, bytes], bool] = _asks_more
    """Whether a request (method, path the provider sees, journaled body) only creates the
    object the look-up finds: then a record found in any status settles it as succeeded (it
    did all it asked), where other requests wait for a status in ``succeeded`` or
    ``failed``. None by default; Stripe's: a creation without ``confirm=true`` (a
    PaymentIntent created to be confirmed by a later step)."""
    finds: Callable[[str, str], bool] = _every_request
    """Whether the look-up can find a request (method, path the provider sees) at all. One
    it cannot see (Stripe's search finds only creations, which carry the metadata tag; a
    confirm or capture carries none) is still looked up, but "no record" then proves
    nothing, and the intent's reason says so."""
    consistent: bool = True
    """Whether the look-up sees a payment as soon as it is executed. One that lags (Stripe's
    Search API) cannot tell "not executed" from "not indexed yet", so it is no ground for
    resending: its profile resends under the same key instead (``resend``)."""

    def params(self, value: str) -> dict[str, str]:
        """The query parameters that look up the intent whose key or reference is ``value``."""
        return {self.param: self.format_value(value)}


def json_object(response: httpx.Response) -> dict[str, Any] | None:
    """The response body as a JSON object, or None when it is anything else."""
    try:
        data = json.loads(response.content)
    except (ValueError, httpx.ResponseNotRead):
        return None
    return data if isinstance(data, dict) else None


def names_idempotency(body: dict[str, Any], *fields: str) -> bool:
    """Whether one of an error body's ``fields`` names the idempotency key ("Idempotency-Key",
    "idempotency_key_mismatch", "idempotent request"...): a refusal about the key."""
    return any("idempoten" in str(body.get(field, "")).lower() for field in fields)


def _seconds(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e9:
        raise ConfigurationError(f"{attribute.name} must be a finite number of seconds >= 0")


def _schedule(value: object) -> None:
    if not isinstance(value, ReconcileSchedule):
        raise ConfigurationError(
            f"reconcile_schedule must be a payonce.providers.ReconcileSchedule, not {value!r}"
        )


def _no_hint(response: httpx.Response) -> bool | None:
    return None


def _no_verdict(response: httpx.Response) -> Verdict | None:
    return None


def _declines_nothing(body: bytes) -> bool:
    return False


def _body_as_is(body: bytes, content_type: str | None, key: str) -> bytes:
    return body


def _any_request(method: str, path: str, content_type: str | None) -> str | None:
    return None


def _no_request(method: str, path: str) -> bool:
    return False


def _is_json(content_type: str | None) -> bool:
    media_type = (content_type or "").split(";")[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")


def _json_body_object(body: bytes, content_type: str | None) -> dict[str, Any] | None:
    if not body or not _is_json(content_type):
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _encode_json(data: dict[str, Any]) -> bytes:
    # payonce's canonical JSON: the same object always gives the same bytes.
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


@attrs.frozen
class BodyKeyField:
    """``prepare_body`` for a provider whose key travels in the JSON body (Square's
    ``idempotency_key``): the intent's key goes into ``field`` where the request has it."""

    field: str

    def __call__(self, body: bytes, content_type: str | None, key: str) -> bytes:
        data = _json_body_object(body, content_type)
        if data is None or self.field not in data:
            return body  # a request that takes no key (Square's complete, cancel...)
        return _encode_json({**data, self.field: key})


@attrs.frozen
class ProviderProfile:
    """What payonce needs to know about one provider's idempotency contract.

    A user-defined profile is a few lines:

    ```python
    acme = payonce.ProviderProfile(name="acme", key_header="X-Request-Id", key_lifetime=3600)
    payonce.register_profile(acme)
    ```
    """

    name: str
    key_header: str = "Idempotency-Key"
    key_field: str | None = None
    """The top-level field of a JSON body that carries the key instead of ``key_header``
    (Square's ``idempotency_key``); None: the key travels in ``key_header``. A request whose
    body has the field is journaled with it emptied, so the fingerprint does not cover it;
    a value the caller put there is the intent's key; every attempt is sent with the
    intent's key in it (``BodyKeyField`` as ``prepare_body``). A request without the
    field is sent as it is, with no key."""
    key_max_length: int = 255
    quote_key: bool = False
    """Send the key as an RFC 8941 string (``"key"``), as the IETF draft says."""
    key_lifetime: float = 24 * 3600.0
    """Seconds the provider remembers a key; past it a resend could execute twice."""
    key_lifetime_documented: bool = False
    """Whether the provider documents ``key_lifetime`` (Stripe's 24 h, Adyen's 7 days,
    Mollie's hour) or it is assumed (Square's, the IETF draft's). Where it is assumed and
    the profile has no status look-up, payonce resends an *unknown* intent on its own (a
    call again, ``payonce reconcile``, the worker) only within
    ``ASSUMED_LIFETIME_RESEND_WINDOW`` (15 minutes) of its first send, and within 90% of
    the lifetime only when an operator asks (``payonce reconcile --resend``). Say True
    when you know your provider keeps keys that long (a contract, its support's word)."""
    retryable_statuses: frozenset[int] = frozenset({500, 502, 503, 504})
    not_executed_statuses: frozenset[int] = frozenset({429})
    """Retryable answers that guarantee nothing was executed (rate limiting)."""
    in_flight_statuses: frozenset[int] = frozenset({409})
    """"Same key still being processed": retried, and ambiguous until answered."""
    mismatch_statuses: frozenset[int] = frozenset({422})
    answer_media_types: frozenset[str] = frozenset({"application/json"})
    """The media types of a genuine answer (``application/json`` also admits ``+json``
    types). A 2xx of another type, or whose body does not parse as the JSON it declares,
    is not the provider's answer (a proxy's or a captive portal's page): it is ambiguous,
    retried and reconciled, never settled. An empty set turns the check off."""
    secret_header_names: frozenset[str] = frozenset()
    """More request headers that carry secrets (besides the auth header, Authorization,
    Proxy-Authorization, X-Api-Key and Cookie): never journaled, logged, or accepted as an
    intent's extra headers."""
    refused_statuses: frozenset[int] = frozenset({401, 403})
    """Refusals that prove nothing was executed (credentials, permission): the intent stays
    pending under its key and ``AuthenticationError`` is raised, so it can be sent once
    the API key is fixed."""
    replay_headers: tuple[str, ...] = ("Idempotent-Replayed", "Idempotency-Replayed")
    marks_replays: bool = False
    """Whether the provider marks every replay with one of ``replay_headers`` (Stripe's
    ``Idempotent-Replayed: true``). Then an answer got again under a key without the mark
    is a fresh execution (the provider forgot the key, or another one answered), never
    handed back as the intent's answer."""
    auth_header: str = "Authorization"
    auth_scheme: str | None = "Bearer"
    account_scope_headers: frozenset[str] = frozenset()
    """Request headers that name the account the provider keys idempotency by, other than
    the credential's own (Stripe's ``Stripe-Account`` of a connected account): journaled
    as the intent's account scope, and sent with its status look-ups too, which would
    otherwise ask the credential's own account and find nothing. Adyen keeps keys per
    company account, Mollie and Square per the key's own organisation or seller: their
    credential names the account, and its fingerprint is journaled with every intent."""
    lookup: Lookup | None = None
    should_retry_hint: Callable[[httpx.Response], bool | None] = _no_hint
    """A provider's explicit retry hint (Stripe-Should-Retry): True/False wins over status."""
    refine: Callable[[httpx.Response], Verdict | None] = _no_verdict
    """A provider-specific verdict that wins over everything else (None: no opinion), e.g.
    telling a 409 "key in use, retry" from a 409 "key reused with another body"."""
    declined_in_body: Callable[[bytes], bool] = _declines_nothing
    """Whether a 2xx answer's body is a decline all the same (Adyen's ``200`` with
    ``resultCode: Refused``): stored and replayed as a success, and no declined step a
    later run may pass over; only the words of an ``IntentMismatch`` about it use it."""
    refuse_request: Callable[[str, str, str | None], str | None] = _any_request
    """Why the provider cannot take a request (method, the path the provider sees, with the
    base URL's own path, and content type), or None. A
    reason is raised as ``ConfigurationError`` before anything is journaled: a request the
    provider is known to refuse would only be journaled as a failure of that reference."""
    resend: Literal["verify", "same-key"] | None = None
    """What follows an attempt that may have executed. ``"verify"``: ask the status look-up
    first, and resend (under the same key) only once the provider has no record and the
    earlier attempt can no longer be running (``max_processing``); a record found settles
    the intent with nothing sent. ``"same-key"``: resend at once under the same key, for a
    provider that guards a duplicate arriving while the first still runs (a 409). None
    (the default): ``"verify"`` when the profile has a consistent look-up, else
    ``"same-key"``."""
    max_processing: float = attrs.field(default=30.0, validator=_seconds)
    """Seconds the provider may still execute a request after the client gave up on it (a
    slow server outlives the client's timeout): the wait before "no record" proves
    anything."""
    encode_form: FormEncoder = form_pairs
    """Turns a ``data=`` form into its pairs: the provider's convention for nested values
    (Stripe's ``metadata[order]=…``, ``items[0]=…``). The fingerprint covers these pairs."""
    prepare_body: Callable[[bytes, str | None, str], bytes] = _body_as_is
    """Derive the bytes sent from the journaled body, content type and key, e.g. to tag the
    key into the object's metadata for reconciliation. Must be deterministic: every
    attempt sends the same bytes. The fingerprint covers the journaled body only."""
    reconcile_schedule: ReconcileSchedule = attrs.field(
        default=DEFAULT_RECONCILE_SCHEDULE,
        validator=lambda _, attribute, value: _schedule(value),
    )
    """When ``payonce worker`` looks this provider's unknown intents up, and when it gives
    up and escalates them (``ReconcileSchedule``). Unused without a ``lookup``: such an
    intent is escalated at once."""
    prepares: Callable[[str, str], bool] = _every_request
    """Which requests ``prepare_body`` applies to (method, and the path the provider sees,
    with the base URL's own path); every one by default. Stripe's tags creations only:
    Stripe refuses metadata on a confirm or a capture, and an update's would overwrite the
    key its creation was tagged with. With a ``key_field``, a request left out here keeps
    that field as the caller wrote it: it is not the request's key (Square's
    ``/v2/payments/cancel`` names there the payment to cancel)."""
    body_key_required: Callable[[str, str], bool] = _no_request
    """Which requests (method, and the path the provider sees) take the key in
    ``key_field``: a JSON body without the field gets it, emptied, before it is journaled,
    so that every attempt carries the intent's key there (the caller need not write
    ``"idempotency_key": ""``). Square's create calls; none by default."""

    @property
    def verifies(self) -> bool:
        """Whether an ambiguous attempt is verified with the look-up before any resend."""
        if self.resend is not None:
            return self.resend == "verify" and self.lookup is not None
        return self.lookup is not None and self.lookup.consistent

    def without_body_key(
        self, canonical: CanonicalRequest, provider_path: str | None = None
    ) -> tuple[CanonicalRequest, str | None]:
        """The request with its body's key field emptied, and the key it held (None when
        it has no such field, or an empty one). A body without the field gets it, emptied,
        when the request takes a key there (``body_key_required``, by the path the provider
        sees: ``provider_path``). Unchanged for a profile whose key travels in a header."""
        if self.key_field is None:
            return canonical, None
        if provider_path is not None and not self.prepares(canonical.method, provider_path):
            return canonical, None  # its field names something else (Square's cancel by key)
        data = _json_body_object(canonical.body, canonical.content_type)
        if data is None:
            return canonical, None
        if self.key_field not in data and not (
            provider_path is not None and self.body_key_required(canonical.method, provider_path)
        ):
            return canonical, None
        found = data.get(self.key_field)
        if found is not None and not isinstance(found, str):
            raise ConfigurationError(
                f"the body's {self.key_field!r} holds {type(found).__name__}, not a string: "
                f"{self.name}'s idempotency key is a string (or give key= and leave it out)"
            )
        body = _encode_json({**data, self.key_field: ""})
        emptied = attrs.evolve(canonical, body=body, canonical_body=body)
        return emptied, found or None

    def take_body_key(
        self, method: str, provider_path: str, body: bytes, content_type: str | None
    ) -> tuple[bytes, str | None]:
        """A transported request's body with its key field emptied, and the string key it
        held (None: no such field, an empty one, or not a string, left for the draft to
        refuse). The step's own key goes back in when it is sent (``prepare_body``); a
        request ``prepare_body`` leaves alone keeps its field (it names something else)."""
        if self.key_field is None or not self.prepares(method, provider_path):
            return body, None
        data = _json_body_object(body, content_type)
        if data is None or not isinstance(data.get(self.key_field), str):
            return body, None
        return _encode_json({**data, self.key_field: ""}), data[self.key_field] or None

    @property
    def key_terms(self) -> KeyTerms:
        """What a key window is judged by, journaled with each intent."""
        return KeyTerms(self.key_lifetime, self.key_lifetime_documented, self.max_processing)

    def judged_by(self, journaled: KeyTerms | None) -> ProviderProfile:
        """This profile with its key window judged by the stricter of its own key terms and
        those an intent was journaled with (``KeyTerms.stricter``): a process that rebuilt
        the profile from its name (``payonce worker``, ``resume``, ``reconcile``) never
        resends later than the app that journaled the intent would. A difference is logged
        once per process. ``journaled`` None (an intent of schema 7 or older): this profile."""
        own = self.key_terms
        if journaled is None or journaled == own:
            return self
        strict = own.stricter(journaled)
        said = (self.name, own, journaled)
        if said not in _TERMS_SAID:
            _TERMS_SAID.add(said)
            logger.warning(
                "provider profile %r here has key_lifetime=%gs (%s), max_processing=%gs; "
                "intents were journaled with key_lifetime=%gs (%s), max_processing=%gs: "
                "their key window is judged by the stricter, key_lifetime=%gs (%s), "
                "max_processing=%gs",
                self.name,
                *_described(own),
                *_described(journaled),
                *_described(strict),
            )
        if strict == own:
            return self
        return attrs.evolve(
            self,
            key_lifetime=strict.key_lifetime,
            key_lifetime_documented=strict.key_lifetime_documented,
            max_processing=strict.max_processing,
        )

    def key_header_value(self, key: str) -> str:
        return f'"{key}"' if self.quote_key else key

    def auth_headers(self, api_key: str) -> dict[str, str]:
        value = f"{self.auth_scheme} {api_key}" if self.auth_scheme else api_key
        return {self.auth_header: value}

    def secret_headers(self) -> frozenset[str]:
        """Request headers that must never be stored or logged (lower-case names)."""
        always = {"authorization", "proxy-authorization", "x-api-key", "cookie"}
        named = {name.lower() for name in self.secret_header_names}
        return frozenset({self.auth_header.lower(), *always, *named})

    def was_replayed(self, response: httpx.Response) -> bool:
        return any(response.headers.get(name, "").lower() == "true" for name in self.replay_headers)


GENERIC = ProviderProfile(
    name="generic",
    quote_key=True,
    in_flight_statuses=frozenset({409}),
    mismatch_statuses=frozenset({422}),
    lookup=None,
    key_lifetime_documented=False,
)
"""The IETF Idempotency-Key draft: the key an RFC 8941 string, 409 while a request with it
is outstanding, 422 when it was used for another request. The draft leaves the key lifetime
to each server; 24 h is assumed, and a server that keeps keys for less needs its own profile."""

SANDBOX = ProviderProfile(
    name="sandbox",
    lookup=Lookup(path="/v1/payments", by="key", param="idempotency_key"),
    key_lifetime_documented=True,  # payonce's own: its key lifetime is the one it keeps
    marks_replays=True,  # every replay carries Idempotent-Replayed: true
    # The sandbox's own idempotency layer answers 409 to a duplicate that arrives while the
    # first still runs: a resend under the same key is safe at once, and costs no wait.
    resend="same-key",
    # A local fake provider answers at once and indexes nothing: a short schedule, so a
    # demo (or a test) sees the worker reconcile, give up and escalate within seconds.
    reconcile_schedule=ReconcileSchedule(
        first_after=0.5,
        interval=1.0,
        backoff=2.0,
        max_interval=10.0,
        max_tries=3,
        give_up_after=60.0,
    ),
)
"""payonce's own reference provider (``payonce.sandbox``) in its default, strict mode."""

_REGISTRY: dict[str, ProviderProfile] = {p.name: p for p in (GENERIC, SANDBOX)}


def register_profile(profile: ProviderProfile) -> None:
    """Make a profile available by name (``Client(provider="acme")``)."""
    _REGISTRY[profile.name] = profile


UNREGISTERED_KEY_LIFETIME = 31 * 24 * 3600.0
"""Assumed for a provider name this process does not know (a profile an application built
and never registered): the longest any provider here documents (Adyen's 31 days)."""


def _described(terms: KeyTerms) -> tuple[float, str, float]:
    documented = "documented" if terms.key_lifetime_documented else "assumed"
    return terms.key_lifetime, documented, terms.max_processing


def key_lifetime_of(provider: str) -> float:
    """How long the provider named ``provider`` keeps a key, as far as this process knows;
    for a name it does not know, the longest any known profile assumes."""
    if (profile := _REGISTRY.get(provider)) is not None:
        return profile.key_lifetime
    return max([UNREGISTERED_KEY_LIFETIME, *(p.key_lifetime for p in _REGISTRY.values())])


def key_max_length_of(provider: str) -> int:
    """The longest key the provider named ``provider`` takes, as far as this process knows
    (a step's key is derived to fit it); for a name it does not know, the default 255."""
    if (profile := _REGISTRY.get(provider)) is not None:
        return profile.key_max_length
    return ProviderProfile(name=provider).key_max_length


def get_profile(provider: str | ProviderProfile) -> ProviderProfile:
    if isinstance(provider, ProviderProfile):
        return provider
    try:
        return _REGISTRY[provider]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise ConfigurationError(
            f"unknown provider {provider!r}; known profiles: {known} "
            "(or pass a payonce.ProviderProfile)"
        ) from None
