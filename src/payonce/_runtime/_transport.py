"""``client.transport()``: payonce under any httpx-based code (an SDK's, the caller's own).

The transport is one more executor's front door, not a second engine: a mutating request
(POST, PUT, PATCH, DELETE) becomes the next step of the intent block open in this context
(``with client.intent(...)``), or a one-shot intent outside any block, and is driven by
the client's own ``_execute`` (the same drive as ``op.post``), sent through the
transport's inner transport with the request's own credentials. Reads pass straight
through to the inner transport, unjournaled.

What a request through the transport is, for payonce (``TransportRules.split``):

- its URL must be under the client's ``base_url`` (same scheme, host, port and base path):
  resume and reconciliation send the journaled path to the client's base URL, so a request
  elsewhere could never be finished from the journal; it is refused before anything is sent;
- its credential headers (``Authorization``, the profile's secret headers) are kept in this
  process only, re-attached to every attempt and look-up, and never journaled;
- the idempotency key it carries is the caller's (journaled as that step's key) unless the
  transport was made with ``sdk_keys="replace"`` (SDKs that draw a random key per call);
- headers that describe the sending client rather than the request (``User-Agent``, an
  SDK's telemetry, ``Accept-Encoding``, hop-by-hop headers) are neither journaled nor
  fingerprinted: an SDK upgrade must not make a re-run another request.

An answer that settles the step (2xx, or a definitive refusal) is handed back as the
``httpx.Response`` an SDK parses (replays marked through ``payonce.response_info``); an
outcome that stays unknown, a request in flight elsewhere or a changed step raises payonce's
own error from ``handle_request``, for an integration to translate.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

import attrs
import httpx

from .._fork import ForkGuard
from ..errors import ConfigurationError, ProviderError
from ._base import MUTATING, OutsideIntent, RequestOptions, SdkKeys, current_operation
from ._core import IntentCore

__all__ = ["AsyncTransport", "SyncTransport", "TransportRules", "delivered"]

CLIENT_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "upgrade",
        "accept",
        "accept-encoding",
        "user-agent",
        "x-stripe-client-user-agent",
        "x-stripe-client-telemetry",
    }
)
"""Request headers about the sending client, not the request: never journaled or
fingerprinted (payonce's own client sends its own on every attempt)."""

_DROPPED_ANSWER_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})
"""What described the bytes on the wire, not the decoded body handed on."""


class SyncSteps(Protocol):
    """An intent block of ``Client`` (``Operation``), as the transport drives it."""

    def _transported(self, request: Transported, http: httpx.Client) -> httpx.Response: ...


class AsyncSteps(Protocol):
    """An intent block of ``AsyncClient`` (``AsyncOperation``)."""

    async def _transported(
        self, request: Transported, http: httpx.AsyncClient
    ) -> httpx.Response: ...


class Transporting(Protocol):
    """What the transport needs of its client (``Client`` or ``AsyncClient``)."""

    @property
    def _core(self) -> IntentCore: ...

    @property
    def _http_options(self) -> dict[str, Any]: ...

    def _one_shot_intent(self, reference: str | None, key: str | None) -> Any: ...


@attrs.frozen
class Transported:
    """A mutating request through the transport, as an intent's step sees it."""

    method: str
    target: str
    """The path under the client's base URL, with its query string."""
    options: RequestOptions
    caller_key: str | None
    """The idempotency key the request carried, honoured as its step's key (None: dropped
    for the step's own, ``sdk_keys="replace"``)."""
    carried_key: str | None
    """The key the request carried, whatever ``sdk_keys`` says: outside any block, where
    there is no step to derive a key from, it is the one-shot's key even when SDK keys are
    replaced in blocks, for an SDK's own retries reuse it (a fresh one each would be worse
    than the SDK alone)."""

    def outside_any_block(self) -> Transported:
        return attrs.evolve(self, caller_key=self.carried_key)

    auth: dict[str, str] | None
    """The request's own credentials: sent by this process, never journaled."""


class TransportRules:
    """What the sync and async transports share: what a request is, for payonce."""

    def __init__(self, core: IntentCore, sdk_keys: SdkKeys, outside_intent: OutsideIntent) -> None:
        if sdk_keys not in ("honour", "replace"):
            raise ConfigurationError(f"sdk_keys must be 'honour' or 'replace', not {sdk_keys!r}")
        if outside_intent not in ("journal", "refuse"):
            raise ConfigurationError(
                f"outside_intent must be 'journal' or 'refuse', not {outside_intent!r}"
            )
        self.core = core
        self._honour_keys = sdk_keys == "honour"
        self._refuse_outside = outside_intent == "refuse"
        base = httpx.URL(core.base_url)
        self._origin = (base.scheme, base.host, base.port)
        self._base_path = base.path.rstrip("/")
        profile = self._profile = core.profile
        self._secret = profile.secret_headers()
        self._key_header = profile.key_header.lower()
        self._quoted_keys = profile.quote_key

    def split(self, request: httpx.Request, body: bytes) -> Transported:
        """The step ``request`` asks for; refused when payonce could not finish it later."""
        url = request.url
        raw_path = url.raw_path.decode("ascii")
        path = url.path
        if (url.scheme, url.host, url.port) != self._origin or not (
            path == self._base_path or path.startswith(self._base_path + "/")
        ):
            raise ConfigurationError(
                f"{request.method} {url.copy_with(query=None)} is not under this client's "
                f"base_url {self.core.base_url}: payonce journals the path and finishes an "
                "intent (resume, reconcile) at its client's base URL, so it sends nothing "
                "elsewhere. Give the client the SDK's base URL"
            )
        auth: dict[str, str] = {}
        headers: dict[str, str] = {}
        caller_key = None
        for name, value in request.headers.multi_items():
            lower = name.lower()
            if lower in self._secret:
                auth[name] = value
            elif lower == self._key_header:
                caller_key = _unquoted(value) if self._quoted_keys else value
            elif lower not in CLIENT_HEADERS:
                headers[name] = value
        # A key in the JSON body (Square's) is the request's key as much as a header's:
        # taken out here, so that the step's key (the caller's, honoured, or payonce's,
        # replacing it) is the one the body carries when it is sent.
        body, body_key = self._profile.take_body_key(body, request.headers.get("content-type"))
        caller_key = caller_key if body_key is None else body_key
        options: RequestOptions = {"headers": headers}
        if body:
            options["content"] = body
        return Transported(
            method=request.method.upper(),
            target=raw_path[len(self._base_path) :] or "/",
            options=options,
            caller_key=caller_key if self._honour_keys else None,
            carried_key=caller_key,
            auth=auth or None,
        )

    def outside(self, request: httpx.Request) -> None:
        """A mutating request outside any block: a one-shot intent, unless refused."""
        if self._refuse_outside:
            raise ConfigurationError(
                f"{request.method} {request.url.path} was sent outside any intent block, and "
                "this transport was made with outside_intent='refuse': nothing was sent. Put "
                "the call inside `with client.intent(reference):`"
            )


def _unquoted(value: str) -> str:
    # The IETF draft sends the key as an RFC 8941 string: "key".
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def delivered(response: httpx.Response) -> httpx.Response:
    """The answer handed back to the code above the transport: a fresh response over the
    decoded body (the inner one is read and closed), carrying payonce's tag."""
    tag = {"payonce": response.extensions["payonce"]} if "payonce" in response.extensions else {}
    return httpx.Response(
        response.status_code,
        headers=[
            (name, value)
            for name, value in response.headers.multi_items()
            if name.lower() not in _DROPPED_ANSWER_HEADERS
        ],
        content=response.content,
        extensions=tag,
    )


class SyncTransport(httpx.BaseTransport):
    """``Client.transport()``: see the module's docstring."""

    def __init__(
        self,
        client: Transporting,
        inner: httpx.BaseTransport | None,
        *,
        sdk_keys: SdkKeys,
        outside_intent: OutsideIntent,
        verify: bool,
    ) -> None:
        self._client = client
        self._rules = TransportRules(client._core, sdk_keys, outside_intent)
        self._verify = verify
        self._owns_inner = inner is None
        self._inner = httpx.HTTPTransport(verify=verify) if inner is None else inner
        self._http = httpx.Client(transport=self._inner, **client._http_options)
        """Sends the steps' attempts and look-ups, with payonce's timeouts and deadline."""
        self._fork = ForkGuard()

    def _in_this_process(self) -> None:
        """After a fork, connections of the child's own (see ``payonce._fork``): an inner
        transport passed in is the caller's to make fork-safe."""
        if self._fork.forked(self._http, self._inner if self._owns_inner else None):
            if self._owns_inner:
                self._inner = httpx.HTTPTransport(verify=self._verify)
            self._http = httpx.Client(transport=self._inner, **self._client._http_options)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self._in_this_process()
        if request.method.upper() not in MUTATING:
            return self._inner.handle_request(request)
        step = self._rules.split(request, request.read())
        try:
            current = current_operation(self._client._core)
            if current is not None:
                response = cast(SyncSteps, current)._transported(step, self._http)
            else:
                self._rules.outside(request)
                with self._client._one_shot_intent(None, None) as op:
                    response = op._transported(step.outside_any_block(), self._http)
        except ProviderError as refusal:
            response = refusal.response  # settled: the SDK reads the provider's own words
        return delivered(response)

    def close(self) -> None:
        self._in_this_process()  # a child closes its own connections, never its parent's
        self._http.close()


class AsyncTransport(httpx.AsyncBaseTransport):
    """``AsyncClient.transport()``: the async door to the same steps."""

    def __init__(
        self,
        client: Transporting,
        inner: httpx.AsyncBaseTransport | None,
        *,
        sdk_keys: SdkKeys,
        outside_intent: OutsideIntent,
        verify: bool,
    ) -> None:
        self._client = client
        self._rules = TransportRules(client._core, sdk_keys, outside_intent)
        self._verify = verify
        self._owns_inner = inner is None
        self._inner = httpx.AsyncHTTPTransport(verify=verify) if inner is None else inner
        self._http = httpx.AsyncClient(transport=self._inner, **client._http_options)
        self._fork = ForkGuard()

    def _in_this_process(self) -> None:
        """See ``SyncTransport._in_this_process``."""
        if self._fork.forked(self._http, self._inner if self._owns_inner else None):
            if self._owns_inner:
                self._inner = httpx.AsyncHTTPTransport(verify=self._verify)
            self._http = httpx.AsyncClient(transport=self._inner, **self._client._http_options)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self._in_this_process()
        if request.method.upper() not in MUTATING:
            return await self._inner.handle_async_request(request)
        step = self._rules.split(request, await request.aread())
        try:
            current = current_operation(self._client._core)
            if current is not None:
                response = await cast(AsyncSteps, current)._transported(step, self._http)
            else:
                self._rules.outside(request)
                async with self._client._one_shot_intent(None, None) as op:
                    response = await op._transported(step.outside_any_block(), self._http)
        except ProviderError as refusal:
            response = refusal.response
        return delivered(response)

    async def aclose(self) -> None:
        self._in_this_process()
        await self._http.aclose()
