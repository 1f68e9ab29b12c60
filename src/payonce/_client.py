"""``payonce.Client`` and the per-operation context manager.

The client only moves bytes and sleeps; ``IntentCore`` decides everything else, so the
async client added later repeats nothing but this short send chain.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

import httpx
import tenacity

from ._core import (
    DEFAULT_MAX_STORED_BYTES,
    USER_AGENT,
    IntentCore,
    Replay,
    RetryEvent,
    RetryExhausted,
    Run,
    Wait,
    new_owner,
)
from ._credentials import resolve_api_key
from ._intent import IntentState, KeyFormat, canonical_request, new_key
from ._journal import IntentDraft, IntentRecord, Journal, open_journal
from ._providers import ProviderProfile, get_profile
from ._retry import RetryPolicy

__all__ = ["Client", "Operation"]

logger = logging.getLogger("payonce")

_IN_FLIGHT_POLL = 0.05


class Operation:
    """One business intent: every request made through it is the same intent, sent once.

    Created by ``client.intent(reference)``. ``key`` is known once the first request has
    been journaled (or at once, when the caller supplied it).
    """

    def __init__(self, client: Client, reference: str | None, key: str | None) -> None:
        self._client = client
        self.reference = reference
        self._key = key
        self._key_supplied = key is not None
        self._record: IntentRecord | None = None

    @property
    def key(self) -> str | None:
        return self._key

    @property
    def state(self) -> IntentState | None:
        """The intent's state in the journal, or None before the first request."""
        if self._key is None:
            return None
        record = self._client.journal.get(self._key)
        return record.state if record else None

    def _bind(self, record: IntentRecord) -> None:
        self._key = record.key
        self._key_supplied = True
        self._record = record

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: Mapping[str, Any] | None = None,
        content: bytes | None = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        canonical = canonical_request(
            method,
            path,
            params=params,
            json_body=json,
            form=data,
            content=content,
            content_type=_content_type(headers),
        )
        draft = self._client._core.draft(
            canonical,
            reference=self.reference,
            key=self._key,
            key_supplied=self._key_supplied,
            headers=headers,
        )
        return self._client._drive(self, draft)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def put(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("PUT", path, **kwargs)

    def patch(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("PATCH", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("DELETE", path, **kwargs)

    def __enter__(self) -> Operation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def __repr__(self) -> str:
        return f"<Operation key={self._key!r} reference={self.reference!r}>"


def _content_type(headers: Mapping[str, str] | None) -> str | None:
    for name, value in (headers or {}).items():
        if name.lower() == "content-type":
            return value
    return None


class Client:
    """A payment-provider client whose every operation takes effect exactly once.

    ``api_key`` defaults to ``PAYONCE_API_KEY``, then to the OS keyring (service
    ``payonce``, user = ``account``). ``journal`` is a path, a ``Journal``, or None for
    ``PAYONCE_JOURNAL`` / the user data directory.
    """

    def __init__(
        self,
        *,
        base_url: str,
        provider: str | ProviderProfile = "generic",
        account: str = "default",
        api_key: str | None = None,
        journal: Journal | str | os.PathLike[str] | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | httpx.Timeout = 30.0,
        key_format: KeyFormat = "ulid",
        verify: bool = True,
        max_stored_response_bytes: int = DEFAULT_MAX_STORED_BYTES,
        in_flight_wait: float = 30.0,
        lease_seconds: float | None = None,
        allow_plaintext_keyring: bool | None = None,
        on_retry: Callable[[RetryEvent], None] | None = None,
        clock: Callable[[], float] = time.time,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        profile = get_profile(provider)
        new_key(key_format)  # validates the format before anything is opened
        secret = resolve_api_key(
            api_key, account=account, allow_plaintext_keyring=allow_plaintext_keyring
        )
        retry = retry or RetryPolicy()
        http_timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        if lease_seconds is None:
            # Renewed at every attempt: it must outlast one attempt and the wait before it.
            slowest = max(
                t or 0.0 for t in (http_timeout.connect, http_timeout.read, http_timeout.write)
            )
            lease_seconds = 2 * slowest + max(retry.max_wait, retry.max_retry_after) + 30.0
        if not verify:
            logger.warning(
                "TLS certificate verification is OFF for %s: only ever do this against a "
                "test provider",
                base_url,
            )
        self._owns_journal = not isinstance(journal, Journal)
        self.journal: Journal = open_journal(journal)
        self._core = IntentCore(
            base_url=base_url,
            profile=profile,
            account=account,
            api_key=secret,
            journal=self.journal,
            retry=retry,
            key_format=key_format,
            max_stored_bytes=max_stored_response_bytes,
            lease_seconds=lease_seconds,
            clock=clock,
            on_retry=on_retry,
        )
        self._in_flight_wait = in_flight_wait
        self._http = httpx.Client(
            timeout=http_timeout,
            verify=verify,
            transport=transport,
            headers={"User-Agent": USER_AGENT},
        )

    @property
    def account(self) -> str:
        return self._core.account

    @property
    def provider(self) -> ProviderProfile:
        return self._core.profile

    def intent(self, reference: str | None = None, *, key: str | None = None) -> Operation:
        """The context manager for one business operation.

        The same ``reference`` (for the same account, method and path) is the same intent
        with the same key, in this process or after a restart.
        """
        return Operation(self, reference, key)

    def request(
        self,
        method: str,
        path: str,
        *,
        reference: str | None = None,
        key: str | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """A one-shot operation: ``client.post(path, json=..., reference="order-42")``."""
        with self.intent(reference, key=key) as op:
            return op.request(method, path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def _drive(self, op: Operation, draft: IntentDraft) -> httpx.Response:
        core = self._core
        owner = new_owner()
        deadline = time.monotonic() + self._in_flight_wait
        step = core.begin(draft, owner)
        while isinstance(step, Wait):
            if time.monotonic() >= deadline:
                raise core.in_flight(step.record)
            time.sleep(_IN_FLIGHT_POLL)
            step = core.begin(draft, owner)
        op._bind(step.record)
        if isinstance(step, Replay):
            return step.response
        return self._send(step)

    def _send(self, run: Run) -> httpx.Response:
        core = self._core
        try:
            for attempt in tenacity.Retrying(**core.retrying_kwargs(run)):
                with attempt:
                    core.start_attempt(run)
                    request = core.build_request(run, self._http)
                    try:
                        response = self._http.send(request)
                    except Exception as exc:
                        core.on_error(run, exc)
                        raise
                    return core.on_response(run, response)
        except RetryExhausted:
            raise core.give_up(run) from None
        raise AssertionError("unreachable: tenacity either returns or raises")

    def close(self) -> None:
        self._http.close()
        if self._owns_journal:
            self.journal.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
