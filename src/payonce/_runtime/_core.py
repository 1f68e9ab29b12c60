"""What both executors share: a client's settings, the request of an attempt, and how
each journal command of a drive is carried out and told.

Which command comes next is the drive's (``payonce._lifecycle._drive``); ``Client`` and
``AsyncClient`` differ only in how they send bytes, sleep, and reach the journal (the async
one from a journal thread). What each step tells the hooks and the log is in ``_telling``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import httpx

from .._crash import crash_armed, crash_atrace, crash_point, crash_trace
from .._credentials import keyring_candidates
from .._journal._plans import AsyncEdge, Call, Plan
from .._journal._reads import Journal
from .._journal._rows import DamagedRow
from .._journal._store import IntentStore
from .._lifecycle import (
    BootReading,
    Candidate,
    Claim,
    ClaimKind,
    IntentRecord,
    KeyFormat,
    LookupKind,
    Transition,
    choose_credential,
    credential_fingerprint,
    credential_in,
    credential_missing,
    header_value_problem,
    rule,
)
from .._lifecycle._drive import (
    Answered,
    ClaimIntent,
    ClaimKey,
    Command,
    DriveSettings,
    EndAttempt,
    Failed,
    LookedUp,
    LookupRetried,
    MarkUnknown,
    ReadAttempts,
    ReadBlock,
    ReadIntent,
    Rebind,
    Reconciled,
    Release,
    Replay,
    Resending,
    Run,
    Settle,
    Sleep,
    StartAttempt,
    Verified,
)
from .._lifecycle._refusals import answer_not_kept, of_step_row
from .._owners import owner_ended
from .._providers._profile import ProviderProfile
from ..errors import ConfigurationError, JournalError
from ._drafting import Drafter
from ._events import log_extra
from ._hooks import HookSet
from ._lease_keeper import Lease
from ._redacting import Redactor
from ._responses import from_lookup, replayed, stored, tagged
from ._retrying import RetryPolicy
from ._telling import Teller, logger

__all__ = ["IntentCore", "RecoveryKeys", "SystemClock"]

RecoveryKeys = Iterable[str] | Callable[[IntentRecord], Iterable[str]]
"""More API keys a client may send an intent again with (``recovery_keys=``): a list, or a
function of the intent's record that names its candidates (a platform's key per merchant,
read from its own store). Each is used only for an intent its fingerprint journaled."""


@attrs.frozen
class SystemClock:
    """A drive's clock: the client's wall clock (tests move it), the monotonic one, and
    this host's boot clock."""

    wall: Callable[[], float]

    def now(self) -> float:
        return self.wall()

    def monotonic(self) -> float:
        return time.monotonic()

    def boot(self) -> BootReading | None:
        return boot_reading()


@functools.cache
def _this_boot() -> tuple[str, str] | None:
    """This machine and the kernel's boot id (Linux); None elsewhere. A process's boot
    never changes (a fork's is its parent's). The machine is its host name and its
    ``/etc/machine-id`` together, never the name alone: two machines named alike (cloned
    VMs, replicas given one ``hostname:``) would take each other for itself after a reboot.
    Without a machine id it is "" and no reboot is judged by it (``boot_elapsed``)."""
    with contextlib.suppress(OSError):
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        if boot_id:
            machine_id = _machine_id()
            return (f"{socket.gethostname()}@{machine_id}" if machine_id else ""), boot_id
    return None


def _machine_id() -> str:
    with contextlib.suppress(OSError):
        return Path("/etc/machine-id").read_text().strip()
    return ""


def boot_reading() -> BootReading | None:
    """This host's boot clock now (``CLOCK_BOOTTIME``: seconds since boot, suspended time
    included, never stepped), or None where there is none (not Linux)."""
    this = _this_boot()
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if this is None or boottime is None:
        return None
    return BootReading(this[0], this[1], time.clock_gettime(boottime))


class IntentCore:
    """What Client and AsyncClient share beneath the drive; what it tells is its ``tell``'s."""

    def __init__(
        self,
        *,
        base_url: str,
        profile: ProviderProfile,
        account: str,
        api_key: str | None,
        journal: Journal,
        store: IntentStore,
        retry: RetryPolicy,
        key_format: KeyFormat,
        max_stored_bytes: int,
        lease_seconds: float,
        clock: Callable[[], float],
        hooks: HookSet,
        in_flight_wait: float,
        recovery_keys: RecoveryKeys | None = None,
        allow_plaintext_keyring: bool | None = None,
    ) -> None:
        self.base_url = base_url
        self.profile = profile
        self.account = account
        self._api_key = api_key
        self.journal = journal
        self.store = store
        """The journal's private writes: every transition is applied through it."""
        self.retry = retry
        self.max_stored_bytes = max_stored_bytes
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.hooks = hooks
        self.tell = Teller(hooks, profile)
        """What the drives of this client tell the hooks and the log."""
        # Fixed for the client's life, so computed once rather than on every intent.
        self._base = httpx.URL(base_url)
        self._own_urls = None if "?" in base_url or "#" in base_url else base_url + "/"
        """What every URL journaled by a client of this base URL starts with."""
        self._moved: set[str] = set()
        """Keys of intents this client resent to another origin than the journaled one,
        warned of once each."""
        self._auth_headers = {} if api_key is None else profile.auth_headers(api_key)
        """The client's own credentials; none for a client built for ``transport()`` only,
        whose requests bring their own."""
        if recovery_keys is not None and not callable(recovery_keys):
            if isinstance(recovery_keys, str | bytes):
                raise ConfigurationError(
                    "recovery_keys takes a list of API keys (or a function of an intent's "
                    "record that returns some), not one key: pass [key]"
                )
            recovery_keys = tuple(recovery_keys)
        self._recovery_keys = recovery_keys
        self._allow_plaintext_keyring = allow_plaintext_keyring
        static_keys = () if recovery_keys is None or callable(recovery_keys) else recovery_keys
        self._secrets: tuple[str, ...] = (
            *([] if api_key is None else [api_key, *self._auth_headers.values()]),
            *(v for key in static_keys for v in (key, *profile.auth_headers(key).values())),
        )
        self.redactor = Redactor.of(self._secrets)
        """What an exception's words pass through before a log, a result or the CLI: this
        client's keys, and each key recovery took from the keyring or a ``recovery_keys``
        function once it was chosen to send with (``_redacting_also``)."""
        self.credential = self.credential_of(None)
        """The fingerprint of this client's own credential (None: it has none)."""
        self.drafter = Drafter(profile, account, base_url, key_format, self.credential)
        """Turns each request of the client into an intent's draft."""
        self.settings = DriveSettings(
            profile=profile,
            retry=retry,
            clock=SystemClock(clock),
            redact=self._redact,
            in_flight_wait=in_flight_wait,
            journal_location=journal.location,
        )
        """What every drive of this client knows."""

    # -- the intent --------------------------------------------------------------------------

    def claim_next_resumable(
        self, owner: str, after: tuple[object, str] | None
    ) -> Claim | DamagedRow | None:
        """Lease the next pending intent of this account that no live worker holds.

        ``after`` is the (created_at, key) of the intent this pass handled last. Hosts
        resuming at once skip the rows the others are claiming instead of queueing on them.
        """
        return self.store.claim_next_pending(
            account=self.account,
            provider=self.profile.name,
            owner=owner,
            now=self.clock(),
            lease_seconds=self.lease_seconds,
            after=after,
        )

    def lease(self, run: Run) -> Lease:
        """The run's lease, for the lease keeper to renew while an attempt waits."""

        def renew() -> bool:
            if self.store.renew_lease(
                run.key, owner=run.owner, now=self.clock(), lease_seconds=self.lease_seconds
            ):
                return True
            # The keeper renews a snapshot of its leases: this run's own settle may have
            # released the lease meanwhile. Lost means another worker holds it, or took
            # it over and went on with attempts of its own before releasing it.
            current = self.journal.get(run.key)
            if current is None or current.lease_owner not in (None, run.owner):
                return False
            return current.lease_owner == run.owner or current.attempt_count <= run.attempt

        return Lease(f"intent {run.key}", renew, log_extra=log_extra(run.record))

    @property
    def reconcilable(self) -> bool:
        """Whether an unknown intent of this profile can be asked about (a status look-up)."""
        return self.profile.lookup is not None

    @staticmethod
    def run_over(run: Run, failure: BaseException | None) -> None:
        """Both clients call this when a drive of ``run`` has returned or raised ``failure``.

        A drive the journal failed (its settle could not be written: a full disk, a lost
        journal) ended still holding its lease and will never renew or release it: this
        process's next call of the intent may take it at once, and settle it under its key
        as the error advised, rather than be told for a whole lease that "another worker" is
        sending it. Nothing else ends a lease early: a drive cancelled or interrupted while
        its request may still be at the provider, or while a journal call still runs in its
        thread, keeps it until it expires or is given back."""
        if isinstance(failure, JournalError) and run.record.lease_owner == run.owner:
            owner_ended(run.owner)

    def auth_headers(self, given: Mapping[str, str] | None = None) -> dict[str, str]:
        """The credentials a request of this client carries: ``given`` (a request's own,
        through ``client.transport()``, used in this process and never journaled), else
        the client's API key."""
        return dict(self._auth_headers if given is None else given)

    @property
    def has_api_key(self) -> bool:
        return bool(self._auth_headers)

    def credential_of(self, auth: Mapping[str, str] | None) -> str | None:
        """The fingerprint of the credential a request carries: ``auth`` (a transported
        request's own), else this client's key; None when it carries none."""
        headers = self._auth_headers if auth is None else auth
        secret = credential_in(headers, auth_header=self.profile.auth_header)
        return None if secret is None else credential_fingerprint(secret)

    def recovery_auth(self, record: IntentRecord) -> dict[str, str] | None:
        """The credentials to send ``record`` again (or look it up) with, when no request
        brings its own (a resume, a reconciliation, the worker): the candidate whose
        fingerprint the intent journaled (``choose_credential``), None when that is this
        client's own key. None matching: ``CredentialMismatch``, nothing sent, naming the
        fingerprint wanted and what was tried."""
        tried: list[Candidate] = []

        def tracked() -> Iterator[Candidate]:
            for candidate in self._candidates(record):
                tried.append(candidate)
                yield candidate

        chosen = choose_credential(record.credential, tracked())
        if chosen is None:
            missing = credential_missing(record, tried)
            # A step 2 or later of a block is named as its block names it.
            raise of_step_row(missing, record, max_length=self.profile.key_max_length)
        if chosen.secret == self._api_key:
            return None
        headers = self.profile.auth_headers(chosen.secret)
        self._redacting_also([chosen.secret, *headers.values()])
        return headers

    def _redact(self, text: str) -> str:
        # The redactor in force now: it grows as recovery chooses keys to send with.
        return self.redactor.text(text)

    def _redacting_also(self, secrets: list[str]) -> None:
        """Keep ``secrets`` out of what is written about errors from now on: a key the
        keyring or a ``recovery_keys`` function gave is known only once it is chosen."""
        if all(secret in self._secrets for secret in secrets):
            return
        self._secrets = (*self._secrets, *(s for s in secrets if s not in self._secrets))
        self.redactor = Redactor.of(self._secrets)

    def _candidates(self, record: IntentRecord) -> Iterator[Candidate]:
        """This client's key, the keys it was handed (``recovery_keys``), then the
        keyring's (the intent's account's entry first): the slow ones last, read only when
        the others are not the one."""
        if self._api_key is not None:
            yield Candidate(self._api_key, "this client's API key")
        keys = self._recovery_keys
        if keys is not None:
            given = keys(record) if callable(keys) else keys
            for number, key in enumerate(given):
                # One no header could carry as given is passed over: never sent, so never
                # quoted by an HTTP stack's error either.
                if isinstance(key, str) and key and header_value_problem(key) is None:
                    yield Candidate(key, f"recovery_keys[{number}]")
        yield from keyring_candidates(
            record.account, allow_plaintext_keyring=self._allow_plaintext_keyring
        )

    def require_api_key(self, what: str, *, recovery: bool = False) -> None:
        """Refuse ``what`` on a client built for ``transport()`` only: it has no API key of
        its own to send with (nor, for a ``recovery``, keys handed to it: ``recovery_keys``)."""
        if not self._auth_headers and not (recovery and self._recovery_keys is not None):
            raise ConfigurationError(
                f"{what} needs this client's own API key, and it was built with "
                f"transport_only=True and no api_key: its requests go through "
                "client.transport() with the SDK's own credentials. Build a client with an "
                "API key (api_key=, PAYONCE_API_KEY or the keyring) for this"
            )

    # -- one attempt -------------------------------------------------------------------------

    def build_request(
        self,
        run: Run,
        client: httpx.Client | httpx.AsyncClient,
        auth: Mapping[str, str] | None = None,
    ) -> httpx.Request:
        """The same bytes and the same key on every attempt, taken from the journal; the
        credentials are this process's (``auth``: a transported request's own)."""
        if self.hooks:
            self.tell.attempt_started(run)
        if run.ambiguous:
            self._warn_if_moved(run.record)
        return self.journaled_request(run.record, client, auth)

    def asked_again_request(
        self,
        record: IntentRecord,
        client: httpx.Client | httpx.AsyncClient,
        auth: Mapping[str, str] | None = None,
    ) -> httpx.Request:
        """A settled intent's journaled request, sent again under its key to get back an
        answer too large to journal. It certainly executed, so never to another origin than
        the journaled one: a provider there has not seen the key and would execute it
        again (a resume may follow a failover; this only fetches an answer)."""
        if not (self._own_urls is not None and record.url.startswith(self._own_urls)):
            journaled, here = _origin(httpx.URL(record.url)), _origin(self._base)
            if journaled != here:
                raise answer_not_kept(
                    record,
                    f"it was sent to {journaled}, and this client's base URL is {here}: a "
                    "resend there could execute it again. Read it with a client of the "
                    "journaled base URL",
                )
        return self.journaled_request(record, client, auth)

    def journaled_request(
        self,
        record: IntentRecord,
        client: httpx.Client | httpx.AsyncClient,
        auth: Mapping[str, str] | None = None,
    ) -> httpx.Request:
        """The intent's journaled request under its key, as every attempt sends it."""
        headers = dict(record.request_headers)
        content_type = headers.get("content-type")
        if self.profile.key_field is None:  # else prepare_body puts it in the body
            headers[self.profile.key_header] = self.profile.key_header_value(record.key)
        headers.update(self._auth_headers if auth is None else auth)
        body = record.body
        if self.profile.prepares(record.method, httpx.URL(record.url).path):
            body = self.profile.prepare_body(body, content_type, record.key)
        return client.build_request(
            record.method,
            self.sent_url(record.url),
            content=body,
            headers=headers,
            extensions=self._crash_extensions(client),
        )

    def _warn_if_moved(self, record: IntentRecord) -> None:
        """A resend (a resume, a reconcile, a call again) goes to this client's base URL,
        by design (a failover, a move to another endpoint): said once an intent, of one an
        attempt of which may have reached the provider, when its origin is not the
        journaled one, since a resend to another provider, or another account's
        endpoint, would not find the key and could execute twice. (One never sent
        anywhere may go anywhere: no provider saw its key.)"""
        if self._own_urls is not None and record.url.startswith(self._own_urls):
            return
        journaled, here = _origin(httpx.URL(record.url)), _origin(self._base)
        if journaled == here or record.key in self._moved:
            return
        self._moved.add(record.key)
        logger.warning(
            "intent %s was journaled for %s and is sent to %s, this client's base URL: "
            "payonce resends the journaled path where the provider answers now; make sure "
            "it is the same provider and account that saw the key, or the resend could "
            "execute twice",
            record.key,
            journaled,
            here,
            extra=log_extra(record),
        )

    def sent_url(self, journaled: str) -> httpx.URL | str:
        """Where an intent journaled at ``journaled`` is sent by this client."""
        if self._own_urls is not None and journaled.startswith(self._own_urls):
            # Journaled by a client of this base URL (nearly always): that very URL, which
            # httpx parses once, rather than three parses and a merge to the same result.
            return journaled
        # The path comes from the journal, the host from this client: after a failover or a
        # move to another endpoint, the intent is resent where the provider now answers. The
        # journaled path already holds the base URL's own path (``/v71`` of Adyen's).
        return self._base.copy_with(raw_path=httpx.URL(journaled).raw_path)

    def sent_to(self, journaled: str) -> str:
        """What the journal records of where an attempt of an intent journaled at
        ``journaled`` is sent: ``sent_url``, which never holds userinfo (a base URL with
        it is refused, and a journaled URL with it is not this client's, so only its path
        is sent), nor credentials in its query (payonce puts none there)."""
        return str(self.sent_url(journaled))

    def clock_request(self, client: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        """A request whose answer only tells the provider's time (its ``Date``): a ``HEAD``
        of the base URL, which executes nothing, with no credentials."""
        return client.build_request("HEAD", self._base)

    @staticmethod
    def _crash_extensions(client: httpx.Client | httpx.AsyncClient) -> dict[str, Any] | None:
        if not crash_armed():
            return None
        return {"trace": crash_atrace if isinstance(client, httpx.AsyncClient) else crash_trace}

    # -- a drive's commands ------------------------------------------------------------------

    def journal_command(self, command: Command, *, after: BaseException | None = None) -> Any:
        """Carry out one of a drive's journal commands (``JOURNAL_COMMANDS``), then tell
        what came of it. ``after``: what the send or look-up this command records raised;
        a journal that fails to record it names it as its cause's context, so the caller's
        traceback still shows what happened first."""
        try:
            return self.store.carry_out(self.journal_plan(command))
        except BaseException as exc:
            self.failed(command, exc, after)
            raise

    @staticmethod
    def failed(command: Command, error: BaseException, after: BaseException | None) -> None:
        """A journal command raised ``error``: name ``after`` (what the send or look-up it
        records raised) as its context. A write-ahead the journal failed ends its drive
        before anything is sent, yet may have committed (on a primary whose synchronous
        standby's wait was cancelled): its owner never writes again, so this process's
        next call of the intent takes its lease at once (``run_over`` does the same for a
        drive under way)."""
        if after is not None:
            _follows(error, after)
        if isinstance(command, ClaimIntent) and isinstance(error, JournalError):
            owner_ended(command.owner)

    def journal_edge(self) -> AsyncEdge | None:
        """What carries ``journal_plan``'s writes out on the running event loop, where the
        journal's engine has one (PostgreSQL); None where a journal thread must."""
        return self.store.async_edge()

    def journal_plan(self, command: Command) -> Plan[Any]:
        """One of a drive's journal commands as a plan (``_journal._plans``), telling what
        came of it: ``journal_command`` carries it out in this thread; an ``AsyncClient``
        on an engine with an async edge, on its event loop."""
        store, now = self.store, self.clock()
        match command:
            case ClaimIntent(draft, owner):
                claim: Claim = yield from store.claim.plan(
                    draft,
                    owner=owner,
                    now=now,
                    lease_seconds=self.lease_seconds,
                    sent_to=self.sent_to(draft.url),
                    boot=boot_reading(),
                )
                if claim.kind is ClaimKind.CREATED:
                    crash_point("after_write_ahead")
                return claim
            case ReadAttempts(key):
                return (yield Call(lambda: self.journal.attempts(key)))
            case ReadIntent(key):
                return (yield Call(lambda: self.journal.get(key)))
            case Rebind(key, owner, credential):
                yield from store.rebind_credential.plan(key, owner=owner, credential=credential)
                logger.info(
                    "intent %s: none of its attempts reached the provider; it is sent with "
                    "credential %s from now on",
                    key,
                    credential,
                )
                return None
            case ReadBlock(key, provider, account, named):
                rows = functools.partial(
                    self.journal.block_rows, key, provider=provider, account=account, named=named
                )
                return (yield Call(rows))
            case StartAttempt(run):
                number = yield from store.start_attempt.plan(
                    run.key,
                    owner=run.owner,
                    now=now,
                    lease_seconds=self.lease_seconds,
                    sent_to=self.sent_to(run.record.url),
                    boot=boot_reading(),
                )
                crash_point("after_write_ahead")
                return number
            case EndAttempt(run, transition, status_code, error, verdict, provider_date):
                debug = logger.isEnabledFor(logging.DEBUG)
                if debug and verdict is not None and status_code is not None:
                    self.tell.log_answer(run, status_code, verdict)
                yield from store.end_attempt.plan(
                    run.key,
                    run.attempt,
                    transition=transition,
                    owner=run.owner,
                    now=now,
                    status_code=status_code,
                    error=error,
                    provider_date=provider_date,
                )
                if self.hooks:
                    self.tell.attempt_ended(run, transition, status_code, error)
                if transition in _REFUSALS and status_code is not None:
                    ambiguous = bool(rule(transition).attempt_ambiguous)
                    self.tell.log_refused(run, status_code, executed=ambiguous)
                return None
            case Settle(run, transition, response, verdict, provider_date):
                if logger.isEnabledFor(logging.DEBUG):
                    self.tell.log_answer(run, response.status_code, verdict)
                return (yield from self._settle(run, transition, response, now, provider_date))
            case MarkUnknown(run, transition, reason):
                record = yield from store.mark_unknown.plan(
                    run.key, transition=transition, owner=run.owner, now=now, reason=reason
                )
                key_gone = transition is Transition.KEY_WINDOW_PASSED or (
                    transition is Transition.PER_CALL_KEY and self.profile.lookup is None
                )
                self.tell.went_unknown(record, reason, key_gone=key_gone)
                return record
            case Release(run, _):
                yield from store.release.plan(run.key, owner=run.owner)
                return None
            case LookedUp(run, kind, outcome, detail, response, sees):
                self.tell.lookup_ended(run.record, kind, response, before_resend=True, sees=sees)
                yield from store.looked_up.plan(
                    run.key,
                    owner=run.owner,
                    now=now,
                    outcome=outcome,
                    detail=detail,
                    status_code=None if response is None else response.status_code,
                )
                return None
            case Verified(run, transition, detail, response, found):
                return (yield from self._verified(run, transition, detail, response, found, now))
            case ClaimKey(key, owner):
                return (
                    yield from store.claim_key.plan(
                        key, owner=owner, now=now, lease_seconds=self.lease_seconds, unknown=True
                    )
                )
            case Reconciled():
                return (yield from self._reconciled(command, now))
        raise AssertionError(f"not a journal command: {command!r}")

    def _reconciled(self, command: Reconciled, now: float) -> Plan[IntentRecord]:
        record, response = command.record, command.response
        if response is not None:
            self.tell.lookup_ended(
                record, command.kind, response, before_resend=False, sees=command.sees
            )
        status = None if response is None else response.status_code
        found = command.found
        after = yield from self.store.reconciled.plan(
            record.key,
            transition=command.transition,
            owner=command.owner,
            now=now,
            outcome=command.outcome,
            detail=command.detail,
            status_code=status,
            response=None if found is None or status is None else from_lookup(found, status),
        )
        logger.info(
            "intent %s reconciled: %s (%s)",
            record.key,
            command.outcome,
            command.detail,
            extra=log_extra(record, after.state),
        )
        return after

    def _settle(
        self,
        run: Run,
        transition: Transition,
        response: httpx.Response,
        now: float,
        provider_date: float | None,
    ) -> Plan[IntentRecord]:
        record = yield from self.store.settle.plan(
            run.key,
            transition=transition,
            owner=run.owner,
            now=now,
            response=stored(response, record=run.record, max_bytes=self.max_stored_bytes),
            attempt=run.attempt,
            acknowledge_success=run.acknowledge_on_success,
            provider_date=provider_date,
        )
        if logger.isEnabledFor(logging.INFO):
            self.tell.log_settled(record, response.status_code)
        provider_replayed = None  # read from the response only if someone asks
        if self.hooks:
            provider_replayed = self.profile.was_replayed(response)
            self.tell.attempt_ended(run, transition, response.status_code, None)
            self.tell.settled(record, provider_replayed=provider_replayed)
        tagged(
            response,
            record,
            replayed=False,
            provider_replayed=provider_replayed,
            profile=self.profile,
        )
        return record

    def _verified(
        self,
        run: Run,
        transition: Transition,
        detail: str,
        response: httpx.Response,
        found: dict[str, Any],
        now: float,
    ) -> Plan[IntentRecord]:
        self.tell.lookup_ended(run.record, LookupKind.FOUND, response, before_resend=True)
        status = response.status_code
        record = yield from self.store.reconciled.plan(
            run.key,
            transition=transition,
            owner=run.owner,
            now=now,
            outcome="found",
            detail=detail,
            status_code=status,
            response=from_lookup(found, status),
        )
        logger.info(
            "intent %s settled from the provider's record: %s",
            run.key,
            detail,
            extra=log_extra(record),
        )
        self.tell.settled(record, provider_replayed=True)
        return record

    def asked_again(self, record: IntentRecord, answer: Answered | Failed) -> Answered | Failed:
        """What came of sending a settled intent's request again under its key (its
        answer's body was not journaled): the answer tagged as the replay it is."""
        if isinstance(answer, Answered):
            logger.info(
                "intent %s: its answer's body was not journaled; asked the provider again "
                "under its key: HTTP %d",
                record.key,
                answer.response.status_code,
                extra=log_extra(record),
            )
            tagged(
                answer.response, record, replayed=True, provider_replayed=None, profile=self.profile
            )
        return answer

    def told(self, command: Replay | Resending | Sleep | LookupRetried) -> httpx.Response | None:
        """Carry out a command that only builds an answer or tells something."""
        match command:
            case Replay(record, provider_replayed=True, found=found):
                # ``found``: a settled intent's answer, its body the provider's record (its
                # own was not journaled): a replay. Otherwise settled by this call's look-up.
                answer = replayed(record, found=found)
                if answer is not None:
                    tagged(answer, record, replayed=found is not None, provider_replayed=True)
                return answer
            case Replay(record):
                response = replayed(record)
                if response is not None and self.hooks:
                    self.tell.answered_from_journal(record, response.status_code)
                return response
            case Resending(run):
                logger.info(
                    "intent %s: the provider has no record of it; resending",
                    run.key,
                    extra=log_extra(run.record),
                )
            case Sleep(seconds, run, retry) if run is not None and retry is not None:
                self.tell.retrying_after(run, seconds, retry)
            case LookupRetried(record, kind, response):
                self.tell.lookup_ended(record, kind, response, before_resend=False)
        return None


_REFUSALS = (Transition.ATTEMPT_REFUSED, Transition.ATTEMPT_REFUSED_UNPROVEN)


def _follows(error: BaseException, earlier: BaseException) -> None:
    """Chain ``earlier`` under ``error``'s implicit context, as raising ``error`` inside an
    ``except`` for ``earlier`` would have."""
    seen = {id(error)}
    tail = error
    while tail.__context__ is not None:
        tail = tail.__context__
        if id(tail) in seen or tail is earlier:
            return
        seen.add(id(tail))
    if tail is not earlier:
        tail.__context__ = earlier


def _origin(url: httpx.URL) -> str:
    """``scheme://host:port`` of ``url`` (never its userinfo, path or query)."""
    port = url.port if url.port is not None else {"http": 80, "https": 443}.get(url.scheme)
    return f"{url.scheme}://{url.host}:{port}"
