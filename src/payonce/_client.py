"""``payonce.Client`` and the per-operation context manager.

``IntentCore`` decides everything; ``_BaseClient`` holds the configuration and everything
that needs no I/O. ``Client`` and ``AsyncClient`` (``_async_client.py``) repeat only the
short chains that send bytes, sleep and wait.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any

import httpx
import tenacity

from . import _reconcile
from ._core import (
    DEFAULT_MAX_STORED_BYTES,
    USER_AGENT,
    IntentCore,
    Replay,
    ResumeResult,
    RetryEvent,
    RetryExhausted,
    Run,
    Wait,
    new_owner,
)
from ._credentials import resolve_api_key
from ._intent import IntentState, KeyFormat, canonical_request, new_key
from ._journal import IntentDraft, IntentRecord, IntentStore, Journal, open_store
from ._providers import ProviderProfile, get_profile
from ._reconcile import ReconcileResult
from ._retry import RetryPolicy
from .errors import ConfigurationError, IntentStateError, PayonceError

__all__ = ["Client", "Operation"]

logger = logging.getLogger("payonce")

IN_FLIGHT_POLL = 0.05
"""Seconds between looks at an intent another worker is sending."""


class _OperationBase:
    """What both operation flavours share: identity, drafting, acknowledgement."""

    def __init__(
        self, client: _BaseClient, reference: str | None, key: str | None, acknowledge: bool
    ) -> None:
        self._base = client
        self.reference = reference
        self._acknowledge = acknowledge
        self._key = key
        self._key_supplied = key is not None

    @property
    def key(self) -> str | None:
        """The idempotency key, once the intent is journaled (or supplied by the caller)."""
        return self._key

    @property
    def state(self) -> IntentState | None:
        """The intent's state in the journal, or None before the first request."""
        if self._key is None:
            return None
        record = self._base.journal.get(self._key)
        return record.state if record else None

    def _bind(self, record: IntentRecord) -> None:
        self._key = record.key
        self._key_supplied = True

    def _draft(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: Mapping[str, Any] | None = None,
        content: bytes | None = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> IntentDraft:
        canonical = canonical_request(
            method,
            path,
            params=params,
            json_body=json,
            form=data,
            content=content,
            content_type=_content_type(headers),
        )
        return self._base._core.draft(
            canonical,
            reference=self.reference,
            key=self._key,
            key_supplied=self._key_supplied,
            headers=headers,
        )

    def _acknowledge_on_exit(self, exc_type: type[BaseException] | None) -> bool:
        # Leaving the block normally means the caller has dealt with the outcome; one that
        # crashed or raised finds it in client.unacknowledged() instead of paying again.
        return exc_type is None and self._acknowledge and self._key is not None

    def _acknowledge_quietly(self) -> None:
        assert self._key is not None
        with contextlib.suppress(IntentStateError):
            self._base.journal.acknowledge(self._key, now=self._base._core.clock())

    def __repr__(self) -> str:
        return f"<{type(self).__name__} key={self._key!r} reference={self.reference!r}>"


def _content_type(headers: Mapping[str, str] | None) -> str | None:
    for name, value in (headers or {}).items():
        if name.lower() == "content-type":
            return value
    return None


class Operation(_OperationBase):
    """One business intent: every request made through it is the same intent, sent once.

    Created by ``client.intent(reference)``. ``key`` is known once the first request has
    been journaled (or at once, when the caller supplied it).
    """

    def __init__(
        self, client: Client, reference: str | None, key: str | None, acknowledge: bool
    ) -> None:
        super().__init__(client, reference, key, acknowledge)
        self._client = client

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send the intent's request (once), or replay its journaled outcome.

        Takes ``json=``, ``data=`` (form), ``content=``, ``params=`` and ``headers=``.
        """
        return self._client._drive(self, self._draft(method, path, **kwargs))

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def put(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("PUT", path, **kwargs)

    def patch(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("PATCH", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("DELETE", path, **kwargs)

    def acknowledge(self) -> None:
        """Mark the settled outcome as recorded on the caller's side."""
        if self._key is not None:
            self._client.acknowledge(self._key)

    def __enter__(self) -> Operation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._acknowledge_on_exit(exc_type):
            self._acknowledge_quietly()


class _BaseClient:
    """Configuration, credentials and the journal: everything that is not I/O."""

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
    ) -> None:
        if httpx.URL(base_url).userinfo:
            raise ConfigurationError(
                "base_url must not carry credentials (user:password@): pass api_key= instead"
            )
        profile = get_profile(provider)
        new_key(key_format)  # validates the format before anything is opened
        secret = resolve_api_key(
            api_key, account=account, allow_plaintext_keyring=allow_plaintext_keyring
        )
        retry = retry or RetryPolicy()
        self._timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        if lease_seconds is None:
            # Renewed while an attempt runs; it must still outlast a stall of the renewer.
            slowest = max(
                t or 0.0 for t in (self._timeout.connect, self._timeout.read, self._timeout.write)
            )
            lease_seconds = 2 * slowest + max(retry.max_wait, retry.max_retry_after) + 30.0
        self._verify = verify
        if not verify:
            logger.warning(
                "TLS certificate verification is OFF for %s: only ever do this against a "
                "test provider",
                base_url,
            )
        self._owns_journal = not isinstance(journal, Journal)
        self.journal: IntentStore = open_store(journal)
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

    @property
    def account(self) -> str:
        return self._core.account

    @property
    def provider(self) -> ProviderProfile:
        return self._core.profile

    def _http_options(self) -> dict[str, Any]:
        return {
            "timeout": self._timeout,
            "verify": self._verify,
            "headers": {"User-Agent": USER_AGENT},
        }


class Client(_BaseClient):
    """A payment-provider client whose every operation takes effect exactly once.

    Keyword options (shared with ``AsyncClient``):

    - ``base_url``: the provider's API root (no credentials in it).
    - ``provider``: a profile name (``generic``, ``sandbox``, ``stripe``, ``adyen``,
      ``mollie``) or a ``ProviderProfile``.
    - ``account``: whose API key and whose intents; part of every intent's scope.
    - ``api_key``: defaults to ``PAYONCE_API_KEY``, then the OS keyring (service
      ``payonce``, user = ``account``).
    - ``journal``: a path, a ``postgresql://`` URL, a ``Journal``, or None for
      ``PAYONCE_JOURNAL`` / the user data directory.
    - ``retry``: a ``RetryPolicy``. ``timeout``: seconds or an ``httpx.Timeout``.
    - ``key_format``: ``"ulid"`` (default) or ``"uuid4"``.
    - ``verify``: TLS verification, on unless turned off explicitly (logged).
    - ``max_stored_response_bytes``: larger answers settle from status and headers only.
    - ``in_flight_wait``: seconds to wait for another worker's attempt before
      ``IntentInFlight``. ``lease_seconds``: the lease length (renewed while sending).
    - ``allow_plaintext_keyring``: accept a plaintext keyring file (off by default).
    - ``on_retry``: a hook receiving a ``RetryEvent`` before each wait.
    - ``clock``: a time source (tests move it instead of sleeping).
    - ``transport``: an httpx transport (a seam for tests and custom networking).
    """

    def __init__(self, *, transport: httpx.BaseTransport | None = None, **options: Any) -> None:
        super().__init__(**options)
        self._http = httpx.Client(transport=transport, **self._http_options())
        self._renewer = _ThreadLeaseRenewer(self._core)

    def intent(
        self, reference: str | None = None, *, key: str | None = None, acknowledge: bool = True
    ) -> Operation:
        """The context manager for one business operation.

        The same ``reference`` (for the same account, method and path) is the same intent
        with the same key, in this process or after a restart. Leaving the block normally
        acknowledges the outcome; pass ``acknowledge=False`` to acknowledge it yourself
        once your own database has recorded it.
        """
        return Operation(self, reference, key, acknowledge)

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

    # -- after a crash: resume, reconcile, abandon, acknowledge -------------------------------

    def resume(self) -> list[ResumeResult]:
        """Drive every pending intent of this account that no live worker holds to an end.

        Each is resent with its stored bytes under its key, unless an attempt may have
        reached the provider longer ago than the key lifetime allows: then it goes unknown.
        One intent's failure never stops the rest.
        """
        core = self._core
        results: list[ResumeResult] = []
        after: tuple[float, str] | None = None
        while True:
            owner = new_owner()
            claim = core.claim_next_resumable(owner, after)
            if claim is None:
                return results
            record = claim.record
            after = (record.created_at, record.key)
            response, error = None, None
            try:
                response = self._send(core.resume_claimed(claim, owner))
            except PayonceError as exc:
                error = exc
            results.append(core.resume_result(record, response, error))

    def reconcile(self, key_or_reference: str) -> list[ReconcileResult]:
        """Ask the provider about the unknown intent(s) with this key or reference."""
        return [self._reconcile(r) for r in _reconcile.targets(self._core, key_or_reference)]

    def reconcile_all(self) -> list[ReconcileResult]:
        """Reconcile every unknown intent of this account, oldest first."""
        return [self._reconcile(r) for r in _reconcile.targets(self._core, None)]

    def _reconcile(self, record: IntentRecord) -> ReconcileResult:
        core = self._core
        owner = new_owner()
        claimed = _reconcile.begin(core, record, owner)
        if isinstance(claimed, ReconcileResult):
            return claimed
        try:
            for attempt in tenacity.Retrying(**core.retrying_kwargs(None)):
                with attempt:
                    request = _reconcile.lookup_request(core, claimed, self._http)
                    try:
                        response = self._http.send(request)
                    except httpx.TransportError as exc:
                        raise _reconcile.transport_failure(exc) from exc
                    return _reconcile.conclude(core, claimed, owner, response)
        except RetryExhausted as exc:
            return _reconcile.give_up(core, claimed, owner, str(exc))
        finally:
            core.journal.release(record.key, owner=owner)
        raise AssertionError("unreachable: tenacity either returns or raises")

    def abandon(self, key: str, *, reason: str) -> IntentRecord:
        """Close a pending or unknown intent for good, as an operator decision."""
        return self.journal.abandon(key, reason=reason, now=self._core.clock())

    def acknowledge(self, key: str) -> IntentRecord:
        """The caller has recorded this intent's settled outcome on its side."""
        return self.journal.acknowledge(key, now=self._core.clock())

    def unacknowledged(self) -> list[IntentRecord]:
        """Settled intents of this account whose outcome the caller has not acknowledged."""
        return self.journal.unacknowledged(account=self.account)

    # -- sending -----------------------------------------------------------------------------

    def _drive(self, op: Operation, draft: IntentDraft) -> httpx.Response:
        core = self._core
        owner = new_owner()
        deadline = time.monotonic() + self._in_flight_wait
        step = core.begin(draft, owner)
        while isinstance(step, Wait):
            if time.monotonic() >= deadline:
                raise core.in_flight(step.record)
            time.sleep(IN_FLIGHT_POLL)
            step = core.begin(draft, owner)
        op._bind(step.record)
        if isinstance(step, Replay):
            return step.response
        return self._send(step)

    def _send(self, run: Run) -> httpx.Response:
        try:
            with self._renewer.holding(run):
                return self._attempts(run)
        except RetryExhausted:
            raise self._core.give_up(run) from None

    def _attempts(self, run: Run) -> httpx.Response:
        core = self._core
        for attempt in tenacity.Retrying(**core.retrying_kwargs(run)):
            with attempt:
                core.start_attempt(run)
                request = core.build_request(run, self._http)
                try:
                    response = self._http.send(request)
                except BaseException as exc:  # KeyboardInterrupt too: give the lease back
                    core.on_error(run, exc)
                    raise
                return core.on_response(run, response)
        raise AssertionError("unreachable: tenacity either returns or raises")

    def close(self) -> None:
        self._renewer.close()
        self._http.close()
        if self._owns_journal:
            self.journal.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class LeaseRenewer:
    """Keeps the leases of a client's attempts in flight alive.

    A lease must outlast the slowest attempt, or another worker could take the intent over
    and send it while this one still waits for the answer. The flavours differ only in
    what ticks: a thread, or an asyncio task.
    """

    def __init__(self, core: IntentCore) -> None:
        self._core = core
        self._runs: set[Run] = set()
        self.interval = core.lease_seconds / 3

    def track(self, run: Run) -> None:
        self._runs.add(run)

    def untrack(self, run: Run) -> None:
        self._runs.discard(run)

    def _snapshot(self) -> list[Run]:
        return list(self._runs)

    def renew_all(self) -> None:
        for run in self._snapshot():
            try:
                self._core.renew(run)
            except PayonceError as exc:
                logger.warning("intent %s: lease renewal failed: %s", run.key, exc)


class _ThreadLeaseRenewer(LeaseRenewer):
    def __init__(self, core: IntentCore) -> None:
        super().__init__(core)
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def holding(self, run: Run) -> Iterator[None]:
        with self._lock:
            self.track(run)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._tick, name="payonce-lease-renewer", daemon=True
                )
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self.untrack(run)

    def _snapshot(self) -> list[Run]:
        with self._lock:
            return list(self._runs)

    def _tick(self) -> None:
        while not self._stopped.wait(self.interval):
            self.renew_all()

    def close(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
