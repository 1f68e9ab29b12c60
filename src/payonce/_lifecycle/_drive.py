"""The drive: what to do next for one intent, given what came of the last thing done.

A drive is a generator in the manner of httpx's auth flows and tenacity's ``iter()``: it
yields a command (journal a named transition, send the request, look the intent up,
sleep), receives what came of it, and finally returns the answer the caller gets or raises
the error the caller gets. It does no I/O: time comes in through a ``Clock``, answers and
journal records through ``send()``. ``payonce._runtime``'s executors carry the commands out
and decide nothing; the sync and the async one run the very same drive.

The same steps serve a caller's request (``call``: claim it, then replay, wait, refuse or
send), ``resume`` (``resume``: an intent already claimed) and verify before resend (inside
both): ::

    claim ─┬─ final ───────────────▶ replay ──▶ return / raise the stored refusal
           ├─ unknown, mismatch ───▶ raise
           ├─ leased ──────────────▶ sleep, claim again (until in_flight_wait)
           └─ created / claimed ───▶ hold the lease ─▶ attempts:
                 [verify: look up ─▶ found: settle from it | absent long enough: resend]
                 start ─▶ send ─▶ 2xx/4xx: settle ─▶ return / raise
                                  401/403: end the attempt ─▶ raise
                                  retryable: end the attempt ─▶ sleep ─▶ next attempt
                                  attempts ran out: unknown (may have executed) or release
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator, Sequence
from typing import Any, Protocol

import attrs
import httpx

from ..errors import IntentError, JournalError, PayonceError, ProviderError
from . import _refusals as refusals
from ._claims import Claim, ClaimKind
from ._credential import credential_mismatch, may_rebind
from ._guards import (
    ATTEMPT_ENDED,
    ATTEMPTS_OVER,
    RECONCILED,
    RESUMED,
    UNLOOKED,
    VERIFIED,
    Moment,
    choose,
)
from ._identity import journaled_fingerprint_matches, scope_path
from ._key_age import (
    ASSUMED_LIFETIME_RESEND_WINDOW,
    BootReading,
    KeyWindow,
    boot_elapsed,
    first_sent_boot,
    may_have_executed,
    provider_first_sent,
    provider_sent_before,
    resend_refusal,
)
from ._provider_clock import ProviderClock, provider_date
from ._records import AttemptRecord, IntentDraft, IntentRecord, KeyTerms
from ._states import IntentState, Transition
from ._steps import (
    JournaledStep,
    is_this_blocks_step,
    journaled_steps,
    later_positions,
)
from ._verdicts import (
    LOOKUP_FAILURES,
    AnswerRules,
    LookupKind,
    LookupRules,
    LookupVerdict,
    Outcome,
    ReconcileOutcome,
    Verdict,
    classify_error,
    classify_lookup,
    classify_lookup_error,
    classify_response,
)
from ._verify import Verification, quiet_after

__all__ = [
    "IN_FLIGHT_POLL",
    "Answered",
    "AskAgain",
    "ClaimIntent",
    "Clock",
    "Command",
    "Drive",
    "DriveProfile",
    "DriveSettings",
    "EndAttempt",
    "Failed",
    "Holding",
    "LookUp",
    "LookedUp",
    "MarkUnknown",
    "ReadAttempts",
    "ReadIntent",
    "ReadBlock",
    "ReadClock",
    "Rebind",
    "Release",
    "Replay",
    "Resending",
    "RetryRules",
    "Run",
    "Send",
    "Settle",
    "Sleep",
    "StartAttempt",
    "Verified",
    "ClaimKey",
    "Leased",
    "LookupRetried",
    "Reconciled",
    "Reconciliation",
    "Reconciling",
    "block_steps",
    "call",
    "reconcile",
    "resume",
    "skip_reason",
]

IN_FLIGHT_POLL = 0.05
"""Seconds between looks at an intent another worker is sending."""


class Clock(Protocol):
    """The drive's only sources of time."""

    def now(self) -> float:
        """Wall-clock seconds: key ages, leases, when an earlier attempt stops running."""
        ...

    def monotonic(self) -> float:
        """Seconds that never step: ``max_elapsed``, how long to wait for another worker."""
        ...

    def boot(self) -> BootReading | None:
        """This host's boot clock (``BootReading``), None where it has none: a bound on a
        key's age that no step of the wall clock moves."""
        ...


class DriveProfile(AnswerRules, Protocol):
    """What a drive asks of a provider profile (``ProviderProfile``)."""

    @property
    def name(self) -> str: ...

    @property
    def key_lifetime(self) -> float: ...

    @property
    def key_lifetime_documented(self) -> bool: ...

    @property
    def max_processing(self) -> float: ...

    @property
    def verifies(self) -> bool: ...

    @property
    def lookup(self) -> LookupRules | None: ...

    @property
    def key_max_length(self) -> int:
        """The longest key the provider takes: a step's key is derived to fit it."""
        ...

    @property
    def marks_replays(self) -> bool:
        """Whether every replay carries one of ``replay_headers``."""
        ...

    @property
    def replay_headers(self) -> tuple[str, ...]: ...

    @property
    def declined_in_body(self) -> Callable[[bytes], bool]:
        """Whether a 2xx answer's body declines the payment all the same (Adyen's 200
        ``Refused``): for the words of a refusal about such a step."""
        ...

    def judged_by(self, journaled: KeyTerms | None) -> DriveProfile:
        """This profile, its key window judged by the stricter of its own key terms and
        ``journaled``, an intent's (``ProviderProfile.judged_by``)."""
        ...


class RetryRules(Protocol):
    """How hard to try (``payonce.RetryPolicy``)."""

    @property
    def max_elapsed(self) -> float: ...

    def next_wait(self, tried: int, elapsed: float, retry_after: float | None) -> float | None:
        """The wait before the next attempt, or None when there is none."""
        ...

    def backoff(self, retry_number: int) -> float: ...


@attrs.frozen
class DriveSettings:
    """What a drive knows besides the intent: one client's, for all its intents."""

    profile: DriveProfile
    retry: RetryRules
    clock: Clock
    redact: Callable[[str], str]
    """What a foreign page's words pass through before they reach an error or the journal."""
    in_flight_wait: float
    """Seconds to wait for another worker's attempt before ``IntentInFlight``."""
    journal_location: str
    """Named by an error about the journal's own content."""
    provider_clock: ProviderClock = attrs.field(factory=ProviderClock, eq=False)
    """What the provider's answers said of its clock: the latest reading, for this client's
    drives to judge keys' ages by (``payonce._lifecycle._provider_clock``)."""

    @property
    def reconcilable(self) -> bool:
        """Whether an unknown intent of this profile can be asked about (a status look-up)."""
        return self.profile.lookup is not None


@attrs.define(eq=False)
class Run:
    """One drive of one intent by one worker, holding its lease: what the drive has learnt
    so far. The executors read it; only the drive changes it."""

    record: IntentRecord
    """The intent as the last journal write of this run left it."""
    owner: str
    attempt: int
    ambiguous: bool
    """True once any attempt of this intent may have reached the provider."""
    began: float
    """When this drive began (monotonic): verification waits count against
    ``max_elapsed`` too."""
    started: bool = True
    """False until the current attempt's start is journaled (the first one is, by claim)."""
    last_reason: str = ""
    verification: Verification | None = None
    """Set after an attempt that may have executed, for a profile that verifies before it
    resends: the look-ups still to make (see ``payonce._lifecycle._verify``)."""
    acknowledge_on_success: bool = False
    """Acknowledge in the settle's own transaction if it succeeds: a one-shot call, where
    nothing runs between the answer and the acknowledgement."""
    resumed: bool = False
    """An intent journaled earlier and still pending, picked up by this run."""
    key_window: KeyWindow | None = None
    """Once an attempt of the intent may have executed (before this run, for a resumed one;
    else by this run's own first such attempt): until when its key is surely remembered. No
    attempt of the run goes out that could end past it."""
    sent_at: float | None = None
    """This host's clock when the current attempt went out, read before its start was
    journaled (the claim's own time for a new intent's first attempt): where a key window
    of the run's own begins."""

    @property
    def key(self) -> str:
        return self.record.key


# -- commands: what the drive asks its executor to do ---------------------------------------


@attrs.frozen
class ClaimIntent:
    """Journal: claim the draft's intent; a new one is written ahead (and its first attempt
    started) in the same transaction. Answers a ``Claim``."""

    draft: IntentDraft
    owner: str


@attrs.frozen
class ReadAttempts:
    """Journal: the intent's attempts so far. Answers a list of ``AttemptRecord``."""

    key: str


@attrs.frozen
class Rebind:
    """Journal: the claimed intent is sent with ``credential`` from now on (none of its
    attempts may have executed, ``may_rebind``). Answers None."""

    key: str
    owner: str
    credential: str | None


@attrs.frozen
class ReadIntent:
    """Journal: the intent journaled under ``key``. Answers an ``IntentRecord``, or None
    when there is none."""

    key: str


@attrs.frozen
class ReadBlock:
    """Journal: the rows of the block whose step 1 is keyed ``key``, of ``provider`` and
    ``account``, its steps referenced from ``named`` (``order-7#step2``). Answers a list
    of ``IntentRecord``."""

    key: str
    provider: str
    account: str
    named: str


@attrs.frozen
class StartAttempt:
    """Journal (``ATTEMPT_STARTED``, flushed): the next attempt's start, before it is sent.
    Answers its number."""

    run: Run
    transition: Transition = Transition.ATTEMPT_STARTED


@attrs.frozen
class EndAttempt:
    """Journal: how the current attempt ended, when that does not settle the intent."""

    run: Run
    transition: Transition
    status_code: int | None = None
    error: str | None = None
    verdict: Verdict | None = None
    provider_date: float | None = None
    """The provider's time in the attempt's answer (its ``Date``), journaled beside ours."""


@attrs.frozen
class Settle:
    """Journal: the provider's definitive answer, stored. Answers the settled record; the
    executor tags ``response`` with it."""

    run: Run
    transition: Transition
    response: httpx.Response
    verdict: Verdict
    provider_date: float | None = None
    """The provider's time in the answer (its ``Date``), journaled beside ours."""


@attrs.frozen
class MarkUnknown:
    """Journal: the intent may have executed and will not be resent. Answers the record."""

    run: Run
    transition: Transition
    reason: str


@attrs.frozen
class Release:
    """Journal: give the lease back; the intent stays as it is. ``transition`` None: no
    transition is applied (a damaged intent left untouched)."""

    run: Run
    transition: Transition | None


@attrs.frozen
class LookedUp:
    """Journal (``LOOKED_UP``): a look-up before a resend that settles nothing. ``kind``
    None: it got no answer."""

    run: Run
    kind: LookupKind | None
    outcome: ReconcileOutcome
    detail: str
    response: httpx.Response | None
    sees: bool = True
    """False: the look-up cannot see this request (``LookupVerdict.sees``)."""
    transition: Transition = Transition.LOOKED_UP


@attrs.frozen
class Verified:
    """Journal: a look-up before a resend found the provider's record; the intent settles
    from it, nothing is resent. Answers the settled record."""

    run: Run
    transition: Transition
    detail: str
    response: httpx.Response
    found: dict[str, Any]


@attrs.frozen
class ClaimKey:
    """Journal: take an unknown intent's lease to look it up. Answers a ``Claim``, or None
    when the intent is gone."""

    key: str
    owner: str


@attrs.frozen
class Reconciled:
    """Journal: what a reconciliation's look-up means for the intent (a ``RECONCILED_*``
    transition), with the look-up beside it. Answers the record. ``response`` is the
    look-up's answer (None: attempts ran out without one)."""

    record: IntentRecord
    owner: str
    transition: Transition
    outcome: ReconcileOutcome
    detail: str
    response: httpx.Response | None = None
    kind: LookupKind | None = None
    found: dict[str, Any] | None = None
    sees: bool = True
    """False: the look-up cannot see this request (``LookupVerdict.sees``)."""


@attrs.frozen
class Leased:
    """The drive holds the intent's lease for a look-up: give it back when the drive ends,
    whatever happened (its transition gives it back too; this is the net under it)."""

    key: str
    owner: str


@attrs.frozen
class LookupRetried:
    """To be told: a look-up to be asked again (``kind`` None: it got no answer)."""

    record: IntentRecord
    kind: LookupKind | None
    response: httpx.Response | None


@attrs.frozen
class Holding:
    """The run holds the intent's lease from now until the drive ends: keep it alive."""

    run: Run


@attrs.frozen
class Send:
    """Send the run's current attempt. Answers ``Answered`` or ``Failed``."""

    run: Run


@attrs.frozen
class LookUp:
    """Ask the provider's status endpoint about the intent. Answers ``Answered`` or
    ``Failed``."""

    record: IntentRecord


@attrs.frozen
class AskAgain:
    """Send a settled intent's journaled request again, under its key, to get its answer
    back (the provider replays what it stored for the key): nothing is journaled. Answers
    ``Answered`` or ``Failed``."""

    record: IntentRecord


@attrs.frozen
class ReadClock:
    """Ask the provider what time it is: any answer's ``Date`` tells it (a ``HEAD`` of the
    base URL, which executes nothing and carries no credentials). Answers ``Answered`` or
    ``Failed``."""


@attrs.frozen
class Sleep:
    """Wait. ``retry``: the verdict on the attempt this wait follows, to be told."""

    seconds: float
    run: Run | None = None
    retry: Verdict | None = None


@attrs.frozen
class Replay:
    """The settled intent's journaled answer as a response (None when none is stored)."""

    record: IntentRecord
    provider_replayed: bool = False
    """Settled from the provider's record (verify), rather than replayed from the journal."""
    found: dict[str, Any] | None = None
    """The provider's record a status look-up found, as the answer's body in place of the
    journaled one (whose body was not kept)."""


@attrs.frozen
class Resending:
    """To be told: look-ups found nothing after the earlier attempt could no longer run."""

    run: Run


Command = (
    ClaimIntent
    | ReadAttempts
    | Rebind
    | ReadIntent
    | ReadBlock
    | StartAttempt
    | EndAttempt
    | Settle
    | MarkUnknown
    | Release
    | LookedUp
    | Verified
    | Holding
    | Send
    | LookUp
    | AskAgain
    | ReadClock
    | Sleep
    | Replay
    | Resending
    | ClaimKey
    | Reconciled
    | Leased
    | LookupRetried
)

JOURNAL_COMMANDS = (
    ClaimIntent,
    ReadAttempts,
    Rebind,
    ReadIntent,
    ReadBlock,
    StartAttempt,
    EndAttempt,
    Settle,
    MarkUnknown,
    Release,
    LookedUp,
    Verified,
    ClaimKey,
    Reconciled,
)
"""The commands an executor carries out in the journal (off the event loop, for async)."""


# -- events: what came of a send or a look-up ------------------------------------------------


@attrs.frozen
class Answered:
    response: httpx.Response


@attrs.frozen
class Failed:
    error: BaseException
    """Raised while sending or reading the answer (an interrupt or a cancellation too)."""


Drive = Generator[Command, Any, httpx.Response]


@attrs.frozen
class Reconciliation:
    """What one reconciliation found and did: ``reconcile``'s end."""

    record: IntentRecord
    """The intent as it was before."""
    after: IntentState
    outcome: ReconcileOutcome
    detail: str


Reconciling = Generator[Command, Any, Reconciliation]


# -- the drives -----------------------------------------------------------------------------


def call(
    settings: DriveSettings, draft: IntentDraft, owner: str, *, acknowledge_on_success: bool
) -> Drive:
    """A caller's request of an intent: claim it, then replay, wait, refuse, or send it.

    Where in its block the request goes was decided before (``_steps.place``); a position
    that holds another request is refused. An error about step n >= 2 of a block names the
    step, its intent's reference and its own key."""
    asked = [draft]  # the position the request reached: an error names that one
    try:
        return (yield from _call(settings, asked, owner, acknowledge_on_success))
    except IntentError as error:
        if asked[-1].step == 1:
            error.step = 1
        else:
            refusals.of_step(error, asked[-1])
        raise


def _call(
    settings: DriveSettings, asked: list[IntentDraft], owner: str, acknowledge_on_success: bool
) -> Drive:
    clock = settings.clock
    give_up_waiting = clock.monotonic() + settings.in_flight_wait
    draft = asked[-1]
    while True:
        claim: Claim = yield ClaimIntent(draft, owner)
        record = claim.record
        # An intent journaled earlier: its key window is judged by the key terms it was
        # journaled with too, where those are stricter than this client's profile.
        journaled = _judged(settings, record)
        # The key age within which payonce resends on its own an intent that may have
        # executed (a pending one after a crash, an unknown one): short where the lifetime
        # is assumed.
        within = _automatic_within(journaled, asked=False)
        if _credential_refused(claim, draft):
            # The provider keeps keys per account: under another credential its key is a
            # new payment there, its look-up finds nothing, its answer is another's.
            attempts = (
                [] if claim.kind is not ClaimKind.CLAIMED else (yield ReadAttempts(record.key))
            )
            if not may_rebind(claim.kind is ClaimKind.CLAIMED, attempts):
                if claim.kind is ClaimKind.CLAIMED:
                    yield Release(_unheld(record, owner), None)
                raise credential_mismatch(draft, record)
            # Nothing of it reached any account (a key refused, then fixed): it is the
            # new credential's from now on.
            yield Rebind(record.key, owner, draft.credential)
            record = attrs.evolve(record, credential=draft.credential)
            claim = attrs.evolve(claim, record=record)
            journaled = _judged(settings, record)
        match claim.kind:
            case ClaimKind.CREATED:
                assert claim.attempt_number is not None
                run = Run(
                    record,
                    owner,
                    attempt=claim.attempt_number,
                    ambiguous=False,
                    began=clock.monotonic(),
                    acknowledge_on_success=acknowledge_on_success,
                    sent_at=record.first_sent_at,
                )
                return (yield from _send(settings, run))
            case ClaimKind.CLAIMED:
                run = yield from _resumed(journaled, claim, owner, within=within)
                run.acknowledge_on_success = acknowledge_on_success
                return (yield from _send(journaled, run))
            case ClaimKind.FINAL:
                return (yield from _replay_step(journaled, draft, record))
            case ClaimKind.MISMATCH:
                # Where the request goes was placed before (``_steps.place``, a declined
                # step passed over there): its position holds another request.
                raise refusals.mismatch(
                    draft,
                    record,
                    reconcilable=settings.reconcilable,
                    declined=_declined_in_body(record, settings.profile),
                )
            case ClaimKind.UNKNOWN:
                if settings.reconcilable:
                    raise refusals.unknown(record, reconcilable=True)
                # No status look-up to ask with: resent under its key while the provider
                # surely still remembers it, as payonce's own retries did (a replay of what
                # it executed, or one execution), and claimed again as a pending intent.
                taken: Claim | None = yield ClaimKey(record.key, owner)
                if taken is None or taken.record.lease_owner != owner:
                    if clock.monotonic() >= give_up_waiting:
                        raise refusals.in_flight(record)
                    yield Sleep(IN_FLIGHT_POLL)
                    continue
                yield Leased(record.key, owner)
                after, _ = yield from _reconcile_by_resend(journaled, taken.record, owner, within)
                if after.state is IntentState.UNKNOWN:
                    raise refusals.unknown(after, reconcilable=False, key_gone=True)
            case ClaimKind.LEASED:
                if clock.monotonic() >= give_up_waiting:
                    raise refusals.in_flight(record)
                yield Sleep(IN_FLIGHT_POLL)


_SENT_BY_ITS_CREDENTIAL = (ClaimKind.CLAIMED, ClaimKind.FINAL, ClaimKind.UNKNOWN)
"""What a claim may come to for a journaled intent that the call then sends, looks up or
answers for: only with the credential that journaled it (``_credential``)."""


def _credential_refused(claim: Claim, draft: IntentDraft) -> bool:
    """Whether a call with ``draft`` must not go on with the journaled intent it claimed:
    its credential is not the one that journaled it. A settled answer journaled with no
    credential (a journal older than credentials were) is replayed, as before: nothing
    is sent for it."""
    journaled = claim.record.credential
    if claim.kind not in _SENT_BY_ITS_CREDENTIAL or journaled == draft.credential:
        return False
    return not (claim.kind is ClaimKind.FINAL and journaled is None)


def block_steps(
    settings: DriveSettings, *, key: str, provider: str, account: str, named: str
) -> Generator[Command, Any, list[JournaledStep]]:
    """The steps the block whose step 1 is keyed ``key`` journaled in earlier runs, as
    ``_steps.place`` reads them: what a block reads once, when its first request found
    it journaled before."""
    records: list[IntentRecord] = yield ReadBlock(key, provider, account, named)
    profile = settings.profile
    return journaled_steps(
        records, intent_key=key, intent=named, rules=profile, max_length=profile.key_max_length
    )


def _judged(settings: DriveSettings, record: IntentRecord) -> DriveSettings:
    """``settings`` for driving ``record``: its key window judged by the stricter of the
    profile's key terms and those the intent was journaled with. A process that rebuilt
    the profile from the journaled name (a worker, ``payonce resume``) would otherwise
    judge an app's ``square_profile(key_lifetime=600)`` by the built-in Square's 24 hours."""
    profile = settings.profile.judged_by(record.key_terms)
    return settings if profile is settings.profile else attrs.evolve(settings, profile=profile)


def _replay_step(settings: DriveSettings, draft: IntentDraft, record: IntentRecord) -> Drive:
    """A settled step's journaled outcome. A step n >= 2 the provider refused is replayed
    with what its block journaled after it: a run went on past the refusal (the customer's
    other card, passing it over), and the refusal alone would read as the intent's outcome
    while step n+1 may have paid (``_refusals.went_on_after``; the block raises as it
    ends unless it goes on to them)."""
    if record.state is not IntentState.FAILED or draft.step < 2:
        return (yield from _replay(settings, record))
    later: list[tuple[int, IntentRecord]] = []
    for position in later_positions(draft, max_length=settings.profile.key_max_length):
        found: IntentRecord | None = yield ReadIntent(position.key)
        if found is None or not is_this_blocks_step(found, position):
            break
        later.append((position.step, found))
    try:
        return (yield from _replay(settings, record))
    except ProviderError as refusal:
        if later:
            refusals.went_on_after(refusal, later)
        raise


def _declined_in_body(record: IntentRecord, profile: DriveProfile) -> bool:
    """Whether ``record`` succeeded with an answer whose body declines the payment."""
    answer = record.response
    return (
        record.state is IntentState.SUCCEEDED
        and answer is not None
        and answer.body_stored
        and profile.declined_in_body(answer.body)
    )


def resume(settings: DriveSettings, claim: Claim, owner: str) -> Drive:
    """A pending intent ``owner`` has claimed (``resume``): resend it under its key, unless
    its key was drawn for its one call (then it goes unknown: ``PER_CALL_KEY``). An error
    about a step 2 or later of a block names it as the block would."""
    settings = _judged(settings, claim.record)
    try:
        within = _automatic_within(settings, asked=False)
        run = yield from _resumed(settings, claim, owner, within=within, on_its_own=True)
        return (yield from _send(settings, run))
    except IntentError as error:
        refusals.of_step_row(error, claim.record, max_length=settings.profile.key_max_length)
        raise


def _resumed(
    settings: DriveSettings,
    claim: Claim,
    owner: str,
    *,
    within: float | None,
    on_its_own: bool = False,
) -> Generator[Command, Any, Run]:
    """An existing pending intent ``owner`` has claimed: resend under its key, unless an
    attempt may have executed and the key may be gone at the provider by now (or older than
    ``within``: resent on payonce's own, its key lifetime assumed; None when an operator
    asked for the resend, ``payonce reconcile --resend``). ``on_its_own``: no caller and no
    operator asked for it (a resume, a worker), so an intent under a key drawn for its one
    call is not resent: the code that made it may have paid again under another key."""
    record = claim.record
    profile, clock = settings.profile, settings.clock
    if not _intact(record):
        yield Release(_unheld(record, owner), None)
        raise JournalError(
            f"intent {record.key}: its journaled request no longer matches the fingerprint "
            "it was journaled with, so the journal was edited by hand or damaged; it is "
            "not sent. Restore the journal from a backup, or check the payment at the "
            "provider and abandon the intent",
            location=settings.journal_location,
        )
    attempts: Sequence[AttemptRecord] = yield ReadAttempts(record.key)
    ambiguous = may_have_executed(attempts)
    run = Run(
        record,
        owner,
        attempt=0,
        ambiguous=ambiguous,
        began=clock.monotonic(),
        started=False,
        resumed=True,
    )
    if choose(RESUMED, Moment(per_call_key=on_its_own and record.key_per_call)) is (
        Transition.PER_CALL_KEY
    ):
        # Before any look at the clock or the provider: nothing is sent for it here.
        run.record = yield MarkUnknown(
            run, Transition.PER_CALL_KEY, refusals.per_call_key(record.key)
        )
        raise refusals.unknown(
            run.record, reconcilable=settings.reconcilable, key_gone=not settings.reconcilable
        )
    until = quiet_after(attempts, profile.max_processing)
    if profile.verifies and until is not None:
        # After a crash with an attempt in flight, as after a timeout: look before sending.
        # The journal dates attempts by the wall clock; from here on the wait counts on the
        # monotonic one, so a wall clock stepped forward cannot cut it short.
        remaining = until - clock.now()
        run.verification = Verification(until=clock.monotonic() + remaining)
    # The provider forgets the key by its clock: where an attempt may have executed, its
    # age is judged by that clock, read afresh if the last reading is stale.
    provider_now = (yield from _provider_now(settings)) if ambiguous else None
    refusal = _key_gone(settings, record, attempts, provider_now, executed=ambiguous, within=within)
    if ambiguous:
        run.key_window = _key_window(settings, record, attempts, provider_now, within=within)
    moment = Moment(resend_refused=refusal is not None)
    if choose(RESUMED, moment) is Transition.KEY_WINDOW_PASSED:
        assert refusal is not None
        run.record = yield MarkUnknown(run, Transition.KEY_WINDOW_PASSED, refusal)
        # Refused only by the assumed lifetime's short window: an operator who knows the
        # provider still keeps the key may have it resent.
        operator_may = within is not None and (
            _key_gone(settings, record, attempts, provider_now, executed=ambiguous) is None
        )
        raise refusals.unknown(
            run.record,
            reconcilable=settings.reconcilable,
            key_gone=True,
            operator_may_resend=operator_may,
        )
    return run


def _key_gone(
    settings: DriveSettings,
    record: IntentRecord,
    attempts: Sequence[AttemptRecord],
    provider_now: float | None,
    *,
    executed: bool,
    within: float | None = None,
) -> str | None:
    """Why a resend of ``record`` under its key is no longer safe (the provider may have
    forgotten the key), or None while it is (``resend_refusal``)."""
    return resend_refusal(
        record.first_sent_at,
        settings.clock.now(),
        settings.profile.key_lifetime,
        executed=executed,
        provider_now=provider_now,
        provider_first=provider_first_sent(attempts),
        provider_sent_by=provider_sent_before(attempts),
        within=within,
        at_least=_boot_elapsed(settings, attempts),
    )


def _boot_elapsed(settings: DriveSettings, attempts: Sequence[AttemptRecord]) -> float | None:
    """Seconds surely elapsed since the first send by this host's boot clock, which no
    step of the wall clock moves (``boot_elapsed``)."""
    return boot_elapsed(first_sent_boot(attempts), settings.clock.boot())


def _key_window(
    settings: DriveSettings,
    record: IntentRecord,
    attempts: Sequence[AttemptRecord],
    provider_now: float | None,
    *,
    within: float | None,
) -> KeyWindow | None:
    """The window within which a resend of ``record`` (an attempt may have executed) must
    end, read from both clocks now; None for an intent never sent."""
    if record.first_sent_at is None:
        return None
    clock = settings.clock
    return KeyWindow(
        record.first_sent_at,
        settings.profile.key_lifetime,
        clock.now(),
        provider_now,
        provider_first_sent(attempts),
        provider_sent_before(attempts),
        within,
        clock.monotonic(),
        _boot_elapsed(settings, attempts),
    )


def _automatic_within(settings: DriveSettings, *, asked: bool) -> float | None:
    """The key age within which payonce resends on its own an intent that may have executed
    (a pending one after a crash, an unknown one of a profile without a status look-up, a
    replay's answer got again): an assumed (not documented) key lifetime's short window
    unless an operator asked for the resend (``payonce reconcile --resend``); else 90% of
    the lifetime (None). A provider that keeps keys shorter than assumed would execute a
    later resend again."""
    if asked or settings.profile.key_lifetime_documented:
        return None
    return ASSUMED_LIFETIME_RESEND_WINDOW


def _provider_now(settings: DriveSettings) -> Generator[Command, Any, float | None]:
    """The provider's time now: the client's latest reading while it is fresh, else the
    provider is asked (``ReadClock``), and asked again after a failure as a look-up is (the
    retry policy's waits, within its bounds): one lost answer must not leave a key's age to
    this host's clock. None when it cannot tell (no answer, an answer without ``Date``);
    the key's age is then judged by the journaled answers' dates too (``resend_refusal``)."""
    clock, retry = settings.clock, settings.retry
    began, tried = clock.monotonic(), 0
    while (known := settings.provider_clock.now(clock.monotonic())) is None:
        tried += 1
        result: Answered | Failed = yield ReadClock()
        if isinstance(result, Answered):
            if _read_clock(settings, result.response) is not None:
                return settings.provider_clock.now(clock.monotonic())
            status = result.response.status_code
            if status < 500 and status != 429:  # it answers, with no Date: it keeps none
                return None
        elif classify_lookup_error(result.error) is None:  # not a transport failure
            return None
        wait = retry.next_wait(tried, clock.monotonic() - began, None)
        if wait is None:
            return None
        yield Sleep(wait)
    return known


def _unheld(record: IntentRecord, owner: str) -> Run:
    return Run(record, owner, attempt=0, ambiguous=False, began=0.0, started=False)


def _intact(record: IntentRecord) -> bool:
    path = scope_path(record.scope, account=record.account, method=record.method)
    return journaled_fingerprint_matches(
        method=record.method,
        path=path,
        url=record.url,
        request_headers=record.request_headers,
        body=record.body,
        fingerprint=record.fingerprint,
    )


def _send(settings: DriveSettings, run: Run) -> Drive:
    """The run's attempts, retried with backoff until one settles it or they run out."""
    yield Holding(run)
    retry, clock = settings.retry, settings.clock
    began = clock.monotonic()
    tries = 0
    while True:
        tries += 1
        outcome = yield from _attempt(settings, run)
        if isinstance(outcome, httpx.Response):
            return outcome
        wait = retry.next_wait(tries, clock.monotonic() - began, outcome.retry_after)
        if wait is None:
            raise (yield from _give_up(settings, run))
        # The key window is a deadline for every attempt of a resend: the next one must
        # end (the provider may run it for max_processing) while the key is surely
        # remembered, or it could execute twice.
        if (past := _past_window(settings, run, leaving_in=wait)) is not None:
            raise (yield from _give_up(settings, run, key_gone=past))
        yield Sleep(wait, run, retry=outcome)


@attrs.frozen
class _PastWindow:
    """Why the run's next attempt could end when its key may be gone."""

    why: str
    operator_may_resend: bool
    """Only the assumed lifetime's short window refuses it: an operator's ``payonce
    reconcile KEY --resend`` still may resend it."""


def _past_window(settings: DriveSettings, run: Run, *, leaving_in: float) -> _PastWindow | None:
    """Whether an attempt of ``run`` leaving ``leaving_in`` seconds from now could end (the
    provider may run it for ``max_processing``) when its key may be gone; None while it
    would end inside the key window, or the run has none (nothing of it may have executed).
    The provider's latest reading moves the window's clock on first."""
    if run.key_window is None:
        return None
    monotonic = settings.clock.monotonic()
    window = run.key_window = run.key_window.read(settings.provider_clock.now(monotonic), monotonic)
    ends = monotonic + leaving_in + settings.profile.max_processing
    why = window.refusal_at(ends)
    if why is None:
        return None
    operator_may = (
        window.within is not None and attrs.evolve(window, within=None).refusal_at(ends) is None
    )
    return _PastWindow(why, operator_may)


def _own_window(settings: DriveSettings, run: Run, date: float | None) -> KeyWindow | None:
    """The key window of a run whose current attempt is the intent's first that may have
    executed: the key's age counts from when it went out, by the provider's clock where its
    answer (``date``, its ``Date``) told it, as a resume's is judged."""
    if run.sent_at is None:
        return None
    clock = settings.clock
    now, monotonic = clock.now(), clock.monotonic()
    provider_first = None if date is None else date - max(0.0, now - run.sent_at)
    return KeyWindow(
        run.sent_at,
        settings.profile.key_lifetime,
        now,
        settings.provider_clock.now(monotonic),
        provider_first,
        date,
        _automatic_within(settings, asked=False),
        monotonic,
    )


def _attempt(
    settings: DriveSettings, run: Run
) -> Generator[Command, Any, httpx.Response | Verdict]:
    """One attempt: the answer it settled, or the verdict of a retryable outcome."""
    if run.verification is not None:
        verified = yield from _verify(settings, run, run.verification)
        if verified is not None:
            return verified
    # Judged again as it goes out, not only when the resend began or before the wait: a
    # resume's first attempt, or one after verify's look-ups, leaves later than that.
    if (past := _past_window(settings, run, leaving_in=0.0)) is not None:
        raise (yield from _give_up(settings, run, key_gone=past))
    if not run.started:
        run.sent_at = settings.clock.now()
        run.attempt = yield StartAttempt(run)
        run.started = True
    result: Answered | Failed = yield Send(run)
    if isinstance(result, Failed):
        return (yield from _failed(settings, run, result.error))
    return (yield from _answered(settings, run, result.response))


def _answered(
    settings: DriveSettings, run: Run, response: httpx.Response
) -> Generator[Command, Any, httpx.Response | Verdict]:
    verdict = classify_response(response, settings.profile, redact=settings.redact)
    transition = choose(ATTEMPT_ENDED, Moment(verdict.outcome, verdict.ambiguous))
    status = response.status_code
    diagnosis = verdict.diagnosis  # redacted: a foreign page may quote the request back
    # The provider's clock, from its own answers only: a proxy's page tells the proxy's.
    date = _read_clock(settings, response) if verdict.diagnosis is None else None
    match transition:
        case Transition.SUCCEEDED | Transition.FAILED:
            run.record = yield Settle(run, transition, response, verdict, date)
            return _deliver(settings, run.record, response)
        case Transition.ATTEMPT_REFUSED | Transition.ATTEMPT_REFUSED_UNPROVEN:
            yield EndAttempt(run, transition, status, diagnosis, verdict, date)
            raise refusals.authentication(run.record, response, foreign=verdict.ambiguous)
        case _:  # retryable, ambiguous or not
            return (
                yield from _retryable(
                    settings, run, verdict, transition, status, error=diagnosis, date=date
                )
            )


def _read_clock(settings: DriveSettings, response: httpx.Response) -> float | None:
    """The provider's time in an answer (its ``Date``), taken in as the client's latest
    reading of the provider's clock."""
    date = provider_date(response)
    settings.provider_clock.read(date, settings.clock.monotonic())
    return date


def _failed(
    settings: DriveSettings, run: Run, error: BaseException
) -> Generator[Command, Any, Verdict]:
    """An attempt raised: retry transport failures, journal anything else and re-raise."""
    verdict = classify_error(error)
    moment = Moment(None) if verdict is None else Moment(verdict.outcome, verdict.ambiguous)
    transition = choose(ATTEMPT_ENDED, moment)
    name = type(error).__name__
    if verdict is not None and transition in (
        Transition.ATTEMPT_AMBIGUOUS,
        Transition.ATTEMPT_NOT_EXECUTED,
    ):
        return (yield from _retryable(settings, run, verdict, transition, error=name))
    # Provably never left (the intent stays pending, free, and not ambiguous), or not a
    # transport failure at all (a bug, an interrupt): the attempt may have left, so the
    # intent stays pending under its key and a later call resends it safely within the
    # provider's key lifetime. Either way the error goes through.
    yield EndAttempt(run, transition, error=name)
    raise error


def _retryable(
    settings: DriveSettings,
    run: Run,
    verdict: Verdict,
    transition: Transition,
    status_code: int | None = None,
    *,
    error: str | None = None,
    date: float | None = None,
) -> Generator[Command, Any, Verdict]:
    if verdict.ambiguous and not run.ambiguous and run.key_window is None:
        # The intent's first attempt that may have executed: every later one is a resend
        # under its key, bounded by the key window as a resume's are, or a call retrying
        # for as long as max_elapsed allows could outlive the key and pay twice.
        run.key_window = _own_window(settings, run, date)
    run.ambiguous = run.ambiguous or verdict.ambiguous
    run.last_reason = verdict.reason
    yield EndAttempt(run, transition, status_code, error, verdict, date)
    run.started = False
    if verdict.ambiguous and settings.profile.verifies:
        # Counted on the monotonic clock: a wall clock stepped forward while the earlier
        # attempt may still run at the provider must not let the resend go out sooner.
        until = settings.clock.monotonic() + settings.profile.max_processing
        run.verification = Verification(until=until)
    return verdict


def _give_up(
    settings: DriveSettings, run: Run, *, key_gone: _PastWindow | None = None
) -> Generator[Command, Any, PayonceError]:
    """Attempts ran out (or stopped: the next could end past the key window, ``key_gone``
    says why): the error to raise, after journaling what is known."""
    if choose(ATTEMPTS_OVER, Moment(ambiguous=run.ambiguous)) is Transition.EXHAUSTED:
        transition = Transition.EXHAUSTED
        if key_gone is None:
            reason = f"retries exhausted; last failure: {run.last_reason}"
        else:
            # Not sent: the key window passed for the next attempt, as for a resume.
            transition = Transition.KEY_WINDOW_PASSED
            if run.last_reason:
                reason = (
                    "retries stopped, the next one could end when a resend is no longer "
                    f"safe: {key_gone.why}; last failure: {run.last_reason}"
                )
            else:  # a resend's first attempt, due to leave later than the resume began
                reason = (
                    "not resent: the provider may run it for "
                    f"{settings.profile.max_processing:g}s, so it could end when a resend "
                    f"is no longer safe: {key_gone.why}"
                )
        run.record = yield MarkUnknown(run, transition, reason)
        return refusals.unknown(
            run.record,
            reconcilable=settings.reconcilable,
            key_gone=key_gone is not None,
            automatic_window=_automatic_within(settings, asked=False),
            operator_may_resend=key_gone is not None and key_gone.operator_may_resend,
        )
    # Exhausted, never executed: the intent stays pending and the lease goes.
    yield Release(run, Transition.EXHAUSTED_UNSENT)
    return refusals.unavailable(run.record, run.last_reason)


def _replay(settings: DriveSettings, record: IntentRecord) -> Drive:
    if record.state is IntentState.ABANDONED:
        raise refusals.abandoned(record)
    response: httpx.Response | None = yield Replay(record)
    if response is None:
        raise refusals.unknown(
            record,
            reconcilable=settings.reconcilable,
            automatic_window=_automatic_within(settings, asked=False),
        )
    assert record.response is not None  # replayed: an answer is stored
    if not record.response.body_stored:
        response = yield from _answer_again(settings, record)
    return _deliver(settings, record, response)


def _answer_again(settings: DriveSettings, record: IntentRecord) -> Drive:
    """The answer of a settled intent whose body was too large to journal, got again
    without executing anything twice: the record its status look-up finds, else the
    provider's replay of the same request under the same key while it still remembers the
    key. The look-up comes first: it reads, where a resend of an intent that certainly
    executed would execute it again at a provider that forgot the key sooner than its
    profile assumes. Never a response with an empty body an SDK cannot parse: when neither
    can be had, an error that says so."""
    profile = settings.profile
    stored = record.response
    assert stored is not None
    why: list[str] = []
    lookup = profile.lookup
    if lookup is None:
        why.append("the provider profile has no status look-up")
    elif lookup.by != "key" and record.reference is None:
        why.append("the status look-up finds intents by reference, and it has none")
    else:
        looked: Answered | Failed = yield LookUp(record)
        if isinstance(looked, Answered):
            verdict = classify_lookup(looked.response, lookup, record)
            if verdict.kind is LookupKind.FOUND and verdict.record is not None:
                found: httpx.Response | None = yield Replay(
                    record, provider_replayed=True, found=verdict.record
                )
                assert found is not None
                return found
            why.append(f"its status look-up found no record to answer with ({verdict.detail})")
        else:
            why.append(f"its status look-up failed ({type(looked.error).__name__})")
    attempts: Sequence[AttemptRecord] = yield ReadAttempts(record.key)
    clock, retry = settings.clock, settings.retry
    began, tried = clock.monotonic(), 0
    while True:
        provider_now = yield from _provider_now(settings)
        # Judged again before every try, as each retry of a resend is: the try must end
        # while the key is surely remembered, and the provider may run it for
        # max_processing (an answer got again near the window's end is a resend after it).
        window = _key_window(
            settings,
            record,
            attempts,
            provider_now,
            within=_automatic_within(settings, asked=False),
        )
        ends = clock.monotonic() + profile.max_processing
        expired = None if window is None else window.refusal_at(ends)
        if expired is not None:
            why.append(f"a resend under its key is no longer safe: {expired}")
            break
        tried += 1
        result: Answered | Failed = yield AskAgain(record)
        if isinstance(result, Answered) and result.response.status_code == stored.status:
            if _marked_replay(settings.profile, result.response):
                return result.response
            # The provider marks every replay, and this answer has no mark: it executed the
            # request again (it forgot the key, or another provider answered there). Never
            # handed back as the intent's answer; a person must look.
            why.append(
                "the provider answered a resend under its key without marking it a replay: "
                "it may have executed it a second time (check at the provider, and refund "
                "the duplicate if so)"
            )
            break
        retry_after: float | None = None
        if isinstance(result, Failed):
            if classify_lookup_error(result.error) is None:  # a bug, an interrupt
                raise result.error
            answered = type(result.error).__name__
        else:
            answered = f"HTTP {result.response.status_code}, not {stored.status}"
            answer = classify_response(result.response, settings.profile, redact=settings.redact)
            if answer.outcome is not Outcome.RETRY:
                # A definitive other answer: the provider does not replay this key. A 2xx
                # one is an execution: of this resend, as a new request, a second time.
                why.append(
                    f"the provider did not replay it under its key ({answered}): it may have "
                    "executed it a second time (check at the provider, in its dashboard, "
                    "and refund the duplicate if so)"
                    if result.response.is_success
                    else f"the provider did not replay it under its key ({answered})"
                )
                break
            retry_after = answer.retry_after
        # A transport failure, a 5xx, a 429 or a 409 in flight: the same key, asked again
        # as any attempt is, so one bad moment does not cost the caller its answer.
        wait = retry.next_wait(tried, clock.monotonic() - began, retry_after)
        if wait is None:
            why.append(f"the provider did not replay it under its key ({answered})")
            break
        yield Sleep(wait)
    raise refusals.answer_not_kept(record, "; ".join(why))


def _marked_replay(profile: DriveProfile, response: httpx.Response) -> bool:
    """An answer that may stand for the intent's own: marked a replay, or from a provider
    that does not mark replays at all (nothing to tell it by)."""
    if not profile.marks_replays:
        return True
    marks = (response.headers.get(name, "").lower() for name in profile.replay_headers)
    return "true" in marks


def _deliver(
    settings: DriveSettings, record: IntentRecord, response: httpx.Response
) -> httpx.Response:
    """The answer of a settled intent: returned when it succeeded, raised otherwise."""
    if record.state is IntentState.SUCCEEDED:
        return response
    verdict = classify_response(response, settings.profile, redact=settings.redact)
    raise refusals.refused(record, response, verdict)


# -- verify before resend --------------------------------------------------------------------

_JOURNALED = {LookupKind.UNDECIDED: ReconcileOutcome.STILL_UNKNOWN}
"""A look-up before a resend that settles nothing, as journaled (no record: ``_absent``;
anything else is an error)."""


def _verify(
    settings: DriveSettings, run: Run, verification: Verification
) -> Generator[Command, Any, httpx.Response | Verdict | None]:
    """Look the intent up until its record settles it (its answer returned), or nothing
    found after the earlier attempt can no longer run lets it be resent (None). A verdict:
    waiting longer would pass ``max_elapsed``; the attempts end there."""
    profile, clock = settings.profile, settings.clock
    lookup = profile.lookup
    assert lookup is not None
    while True:
        step = verification.next(clock.monotonic())
        if step is None:
            run.verification = None
            yield Resending(run)
            return None
        if isinstance(step, float):
            if clock.monotonic() + step > run.began + settings.retry.max_elapsed:
                reason = "no look-up could tell whether it executed before max_elapsed"
                return Verdict(Outcome.RETRY, ambiguous=True, reason=reason)
            yield Sleep(step)
            continue
        result: Answered | Failed = yield LookUp(run.record)
        if isinstance(result, Failed):
            if not isinstance(result.error, LOOKUP_FAILURES):
                raise result.error
            detail = f"status look-up failed: {type(result.error).__name__}"
            yield LookedUp(run, None, ReconcileOutcome.ERROR, detail, None)
            verification.answered(
                LookupKind.RETRY, clock.monotonic(), _backoff(settings, verification)
            )
            continue
        response = result.response
        _read_clock(settings, response)
        verdict = classify_lookup(response, lookup, run.record)
        transition = choose(VERIFIED, Moment(lookup=verdict.kind, found=verdict.state))
        if transition is Transition.LOOKED_UP:
            outcome = (
                _absent(verdict)
                if verdict.kind is LookupKind.ABSENT
                else _JOURNALED.get(verdict.kind, ReconcileOutcome.ERROR)
            )
            yield LookedUp(run, verdict.kind, outcome, verdict.detail, response, verdict.sees)
            verification.answered(verdict.kind, clock.monotonic(), _backoff(settings, verification))
            continue
        assert verdict.record is not None
        run.record = yield Verified(run, transition, verdict.detail, response, verdict.record)
        run.verification = None
        answer: httpx.Response | None = yield Replay(run.record, provider_replayed=True)
        assert answer is not None  # settled from a record: its answer is stored
        return _deliver(settings, run.record, answer)


def _backoff(settings: DriveSettings, verification: Verification) -> float:
    # The retry policy's backoff, but not so fast that a short one floods the provider with
    # look-ups while the earlier attempt may still run.
    floor = settings.profile.max_processing / 10
    return max(settings.retry.backoff(verification.asked + 1), floor)


# -- reconciliation ---------------------------------------------------------------------------


def skip_reason(settings: DriveSettings, record: IntentRecord) -> str | None:
    """Why this client does not look the intent up, or None when it does."""
    if record.state is not IntentState.UNKNOWN:
        return f"{record.state.value}: nothing to reconcile"
    if record.provider != settings.profile.name:
        return (
            f"sent through provider profile {record.provider!r}: reconcile it with a client "
            "for that provider"
        )
    return None


def reconcile(
    settings: DriveSettings, record: IntentRecord, owner: str, *, resend: bool = False
) -> Reconciling:
    """Ask the provider about an unknown intent, never guess, and journal what its answer
    means, once. A profile without a status look-up cannot be asked: the intent is resent
    under its key while the key is surely remembered (``_reconcile_by_resend``); ``resend``:
    an operator asked for that, so an assumed key lifetime's window is 90% of it, not
    ``ASSUMED_LIFETIME_RESEND_WINDOW``. With a look-up:

    - a record with a definitive status: stored, succeeded or failed;
    - no record, the key still within its lifetime (and no earlier attempt still able to
      run): back to ``pending``, a resend under the same key cannot execute twice;
    - no record past that, a record not final yet, an unreadable or refused answer, or no
      answer at all: stays ``unknown`` with the reason.

    An error about a step 2 or later of a block names it as the block would.
    """
    settings = _judged(settings, record)
    try:
        return (yield from _reconcile(settings, record, owner, resend))
    except IntentError as error:
        refusals.of_step_row(error, record, max_length=settings.profile.key_max_length)
        raise


def _reconcile(
    settings: DriveSettings, record: IntentRecord, owner: str, resend: bool
) -> Reconciling:
    if (reason := skip_reason(settings, record)) is not None:
        return Reconciliation(record, record.state, ReconcileOutcome.SKIPPED, reason)
    claim: Claim | None = yield ClaimKey(record.key, owner)
    if claim is None or claim.record.lease_owner != owner:
        return Reconciliation(
            record, record.state, ReconcileOutcome.SKIPPED, "another worker holds it right now"
        )
    yield Leased(record.key, owner)
    current = claim.record
    lookup = settings.profile.lookup
    if lookup is None:
        within = _automatic_within(settings, asked=resend)
        return (yield from _resent(settings, current, owner, within, resend=resend))
    retry, clock = settings.retry, settings.clock
    began = clock.monotonic()
    tried = 0
    while True:
        tried += 1
        result: Answered | Failed = yield LookUp(current)
        if isinstance(result, Failed):
            failure = classify_lookup_error(result.error)
            if failure is None:  # not a transport failure: a bug, an interrupt, a bad profile
                raise result.error
            yield LookupRetried(current, None, None)
            last = failure.detail
        else:
            assert lookup is not None  # the look-up was made
            _read_clock(settings, result.response)
            verdict = classify_lookup(result.response, lookup, current)
            if verdict.kind is not LookupKind.RETRY:
                concluded = yield from _concluded(
                    settings, current, owner, verdict, result.response, resend=resend
                )
                if resend and concluded.after is IntentState.PENDING:
                    # The operator asked for the resend: made now, under its key, within 90%
                    # of the lifetime, not left to a resume that keeps to the short window
                    # of an assumed lifetime (and would send it back to unknown).
                    return (yield from _send_now(settings, concluded, owner, within=None))
                return concluded
            yield LookupRetried(current, verdict.kind, result.response)
            last = verdict.detail
        wait = retry.next_wait(tried, clock.monotonic() - began, None)
        if wait is None:
            detail = f"status look-up failed: {last}"
            transition = choose(RECONCILED, Moment(lookup=None))
            outcome = ReconcileOutcome.ERROR
            return (yield from _reconciled(current, owner, transition, outcome, detail))
        yield Sleep(wait)


def _concluded(
    settings: DriveSettings,
    record: IntentRecord,
    owner: str,
    verdict: LookupVerdict,
    response: httpx.Response,
    *,
    resend: bool,
) -> Reconciling:
    profile, clock = settings.profile, settings.clock
    now = clock.now()
    kind, detail = verdict.kind, verdict.detail
    still_running = resend_refused = operator_may = False
    refusal: str | None = None
    if kind is LookupKind.ABSENT:
        attempts: Sequence[AttemptRecord] = yield ReadAttempts(record.key)
        quiet = quiet_after(attempts, profile.max_processing)
        # A slow server may still be executing an earlier attempt: "no record" proves
        # nothing yet, and back to pending would let a resend run beside it (a provider
        # that guards such a duplicate, resend="same-key", answers it 409 instead).
        still_running = profile.verifies and quiet is not None and now < quiet
        # The look-up's answer just told the provider's time: the key's age is its clock's.
        judged = functools.partial(
            resend_refusal,
            record.first_sent_at,
            now,
            profile.key_lifetime,
            provider_now=settings.provider_clock.now(clock.monotonic()),
            provider_first=provider_first_sent(attempts),
            provider_sent_by=provider_sent_before(attempts),
            at_least=_boot_elapsed(settings, attempts),
        )
        # A look-up by key finds nothing once the provider forgot the key: "no record" is
        # evidence only within the window a resend is made in (an assumed lifetime's short
        # one unless an operator asked), as a resume judges it.
        refusal = judged(within=_automatic_within(settings, asked=resend))
        resend_refused = refusal is not None
        operator_may = resend_refused and judged() is None
    # Under a key drawn for its one call, "no record" sends nothing: the code run again may
    # have paid under another key. An operator who is sure may (``resend``).
    per_call = record.key_per_call and not resend
    moment = Moment(
        lookup=kind,
        found=verdict.state,
        still_running=still_running,
        resend_refused=resend_refused,
        per_call_key=per_call,
    )
    transition = choose(RECONCILED, moment)
    if kind is LookupKind.FOUND:
        outcome = ReconcileOutcome.FOUND
    elif still_running:
        assert quiet is not None
        outcome = ReconcileOutcome.STILL_UNKNOWN
        detail = (
            f"the provider has no record yet, but an earlier attempt may still be executing "
            f"there for {quiet - now:.0f}s more: reconcile again after that"
        )
    elif kind is LookupKind.ABSENT and per_call:
        outcome = _absent(verdict)
        detail = refusals.per_call_key(record.key, looked_up=verdict.detail)
    elif kind is LookupKind.ABSENT:
        outcome = _absent(verdict)
        # The look-up's own words: for a request it cannot see (a Stripe confirm), "no
        # record" would read as "never executed".
        detail = (
            f"{verdict.detail}, but the key may have expired there ({refusal}). "
            + (
                f"If you know the provider still remembers the key, `payonce reconcile "
                f"{record.key} --resend` resends it under the key; else check"
                if operator_may
                else "Check"
            )
            + " by hand, then abandon it or pay again under a new reference"
            if resend_refused
            else f"{verdict.detail}; the key is still valid: safe to resend under it"
        )
    elif kind is LookupKind.REFUSED:
        outcome = ReconcileOutcome.ERROR
    else:  # a record not final yet, several records, an unreadable answer
        outcome = ReconcileOutcome(kind.value)
    found = verdict.record if kind is LookupKind.FOUND else None
    command = Reconciled(
        record, owner, transition, outcome, detail, response, kind, found, verdict.sees
    )
    after: IntentRecord = yield command
    if kind is LookupKind.REFUSED:
        raise refusals.lookup_refused(record, response)
    return Reconciliation(record, after.state, outcome, detail)


def _absent(verdict: LookupVerdict) -> ReconcileOutcome:
    """``not_found``, or ``cannot_tell`` where the look-up cannot see the request (a Stripe
    confirm): its empty answer must not read as "it did not happen"."""
    return ReconcileOutcome.NOT_FOUND if verdict.sees else ReconcileOutcome.CANNOT_TELL


def _reconcile_by_resend(
    settings: DriveSettings,
    record: IntentRecord,
    owner: str,
    within: float | None,
    *,
    on_its_own: bool = False,
) -> Generator[Command, Any, tuple[IntentRecord, str]]:
    """An unknown intent of a profile without a status look-up, its lease held: back to
    pending (``reconciled by resend``) while a resend under its key cannot execute twice,
    judged as ``_resumed`` judges one (the provider's clock, the profile's margin), else it
    stays unknown (``reconciled, key window passed``). ``on_its_own``: no caller and no
    operator asked (a reconciliation, a worker): an intent under a key drawn for its one
    call stays unknown (``reconciled, key drawn per call``). The record after, and why."""
    if on_its_own and record.key_per_call:
        transition = choose(UNLOOKED, Moment(per_call_key=True))
        detail = refusals.per_call_key(record.key)
        outcome = ReconcileOutcome.STILL_UNKNOWN
        kept: IntentRecord = yield Reconciled(record, owner, transition, outcome, detail)
        return kept, detail
    attempts: Sequence[AttemptRecord] = yield ReadAttempts(record.key)
    provider_now = yield from _provider_now(settings)
    refusal = _key_gone(settings, record, attempts, provider_now, executed=True, within=within)
    transition = choose(UNLOOKED, Moment(resend_refused=refusal is not None))
    if transition is Transition.RECONCILED_BY_RESEND:
        outcome = ReconcileOutcome.RESENT
        detail = (
            "the provider profile has no status look-up and the key is still within its "
            "lifetime: resent under its key (the provider replays what it executed, or "
            "executes it once)"
        )
    else:
        outcome = ReconcileOutcome.STILL_UNKNOWN
        detail = (
            "the provider profile has no status look-up, and a resend under its key is no "
            f"longer safe: {refusal}"
        )
        if within is not None and (
            _key_gone(settings, record, attempts, provider_now, executed=True) is None
        ):
            # Short of 90% of an assumed lifetime: an operator who knows may still resend.
            detail += (
                "; if you know the provider still remembers the key, `payonce reconcile "
                f"{record.key} --resend` resends it under the key"
            )
    after: IntentRecord = yield Reconciled(record, owner, transition, outcome, detail)
    return after, detail


def _resent(
    settings: DriveSettings,
    record: IntentRecord,
    owner: str,
    within: float | None,
    *,
    resend: bool,
) -> Reconciling:
    """``reconcile`` of an unknown intent of a profile without a status look-up: resent
    under its key while the key is surely remembered (``_reconcile_by_resend``); one under
    a key drawn per call only when an operator asked (``resend``)."""
    after, detail = yield from _reconcile_by_resend(
        settings, record, owner, within, on_its_own=not resend
    )
    if after.state is IntentState.UNKNOWN:
        # What to do, for the one reading the reconciliation (the journal keeps the why).
        by_hand = (
            f"; check at the provider whether it executed, then abandon it: `payonce abandon "
            f"{record.key} --reason ...`"
        )
        outcome = ReconcileOutcome.STILL_UNKNOWN
        return Reconciliation(record, after.state, outcome, detail + by_hand)
    resent = Reconciliation(record, after.state, ReconcileOutcome.RESENT, detail)
    return (yield from _send_now(settings, resent, owner, within=within))


def _send_now(
    settings: DriveSettings, reconciled: Reconciliation, owner: str, *, within: float | None
) -> Reconciling:
    """A reconciled intent back to pending, sent at once under its key (``within`` as in
    ``_resumed``); the reconciliation reports where the send left it."""
    record, detail, outcome = reconciled.record, reconciled.detail, reconciled.outcome
    claim: Claim | None = yield ClaimKey(record.key, owner)
    if claim is None or claim.record.lease_owner != owner:
        held = "; another worker took it to send"
        return Reconciliation(record, reconciled.after, outcome, detail + held)
    run: Run | None = None
    try:
        run = yield from _resumed(settings, claim, owner, within=within)
        yield from _send(settings, run)
    except IntentError as error:
        # The resend's own end (a refusal, attempts run out again) is journaled by the
        # send; the reconciliation reports where it left the intent.
        current = claim.record if run is None else run.record
        return Reconciliation(record, current.state, outcome, f"{detail}; then: {error}")
    assert run is not None  # the send returned
    return Reconciliation(record, run.record.state, outcome, detail)


def _reconciled(
    record: IntentRecord,
    owner: str,
    transition: Transition,
    outcome: ReconcileOutcome,
    detail: str,
    response: httpx.Response | None = None,
    kind: LookupKind | None = None,
    found: dict[str, Any] | None = None,
) -> Reconciling:
    command = Reconciled(record, owner, transition, outcome, detail, response, kind, found)
    after: IntentRecord = yield command
    return Reconciliation(record, after.state, outcome, detail)
