"""Whether a resend under an intent's key can still not execute twice.

A provider remembers a key for its profile's ``key_lifetime``; past it the same key is a
new request. payonce stops resending at 90% of that lifetime, so a clock a little off or a
provider a little early never turns a retry into a second payment. An intent none of whose
attempts may have reached the provider may be sent at any age: the provider never saw it.

The provider forgets a key by its own clock, and says what time it is in every answer (its
``Date``, see ``_provider_clock``). So where the provider's time now is known, a key's age
is judged by it:

- the first attempt got an answer: the provider's time then (its ``Date``, less how long the
  attempt took here) against the provider's time now; this host's clock plays no part;
- it got none (a crash or a timeout): when it was sent is known only by this host's clock
  then. While this host's clock agrees with the provider's now (within ``CLOCK_TOLERANCE``)
  that is taken as it is. When it does not, either clock may have been the wrong one when
  the attempt was sent, so the key is given the older of the two ages they allow: a clock
  stepped back (or slow) since cannot make an old key look young, and one stepped ahead
  cannot either.

Whichever of those applies, any answer the provider gave to any attempt of the intent
bounds it too: the first attempt left before that answer was written, so the key is at
least as old as that answer's ``Date`` by the provider's clock now. A first attempt that got
no answer, sent while this host's clock was ahead (and since corrected), cannot make a key
the provider has long since seen look young while a later attempt's answer says otherwise.

Where the provider's time now cannot be had (asking it failed every try) but journaled
answers of the provider's dated the first attempt (or one after it), the key's age is also
what those dates give by this host's clock now, the older age standing: a clock that was
ahead when the first attempt was sent (and was stepped back since) cannot make a key the
provider dated long ago look young.

Without the provider's time (its answers carry no ``Date``, or it could not be asked) the
key's age is this host's clock's, as it was before.

This host's clock may have been stepped since the first send (a clock ahead, corrected by
NTP before the re-run): the wall clock's age of the key is then too young. Each attempt is
also dated by the boot clock (``BootReading``: the kernel's boot, and ``CLOCK_BOOTTIME``,
which no step of the wall clock moves), so where this host's clock judges, the key is at
least as old as ``boot_elapsed`` says: the boot clock's seconds since the first send in the
same boot; after a reboot of the same host, at least the seconds since that boot.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import attrs

__all__ = [
    "ASSUMED_LIFETIME_RESEND_WINDOW",
    "CLOCK_TOLERANCE",
    "KEY_LIFETIME_MARGIN",
    "PRUNE_AFTER_KEY_LIFETIMES",
    "AttemptLike",
    "BootReading",
    "DatedAttempt",
    "KeyWindow",
    "boot_elapsed",
    "first_sent_boot",
    "may_have_executed",
    "provider_first_sent",
    "provider_sent_before",
    "resend_refusal",
]

ASSUMED_LIFETIME_RESEND_WINDOW = 15 * 60.0
"""Seconds after its first send within which payonce resends on its own an intent that may
have executed (a pending one after a crash, an unknown one: a call again, ``payonce resume``,
``payonce reconcile``, the worker) when its key lifetime is assumed, not documented
(``ProviderProfile.key_lifetime_documented``).
Half the shortest key lifetime a payment API is known to document (30 minutes): a provider
that keeps keys for less than it assumes would otherwise execute the resend again. Past it,
and within 90% of the assumed lifetime, only an operator's ``payonce reconcile --resend``
resends it."""
KEY_LIFETIME_MARGIN = 0.1
"""Resend only while the first attempt is younger than 90% of the provider's key lifetime."""
PRUNE_AFTER_KEY_LIFETIMES = 2.0
"""An intent younger than this many of its provider's key lifetimes is never pruned: a
caller retrying the business operation that late must still find it, or pay again."""
CLOCK_TOLERANCE = 60.0
"""Seconds by which the clocks of the hosts sharing a journal may disagree. A first attempt
dated further in the future means the clock moved back or the record is foreign."""


@attrs.frozen
class BootReading:
    """This host's boot clock at one moment: which boot of which host, and the seconds
    since that boot (``CLOCK_BOOTTIME``, counting suspended time; no wall-clock step moves
    it)."""

    host: str
    boot_id: str
    seconds: float


def first_sent_boot(attempts: Iterable[DatedAttempt]) -> BootReading | None:
    """The boot clock when the key's first attempt was sent, as journaled with it (its
    ``boot``, ``host/boot id``, and ``boottime``); None when it was not."""
    first = min(attempts, key=lambda attempt: attempt.number, default=None)
    if first is None or first.boot is None or first.boottime is None:
        return None
    host, _, boot_id = first.boot.rpartition("/")
    return BootReading(host, boot_id, first.boottime)


def boot_elapsed(first_sent: BootReading | None, now: BootReading | None) -> float | None:
    """Seconds surely elapsed since the first send, by the boot clock: the difference of
    the two readings in the same boot (the same kernel: its containers share it); on the
    same host after a reboot, at least the seconds since this boot (the first send came
    before it). None when it cannot tell: no reading, another host, a reading that went
    back (not one clock)."""
    if first_sent is None or now is None:
        return None
    if first_sent.boot_id == now.boot_id:
        elapsed = now.seconds - first_sent.seconds
        return elapsed if elapsed >= 0 else None
    if first_sent.host and first_sent.host == now.host:  # "": the machine cannot be told
        return now.seconds
    return None


class AttemptLike(Protocol):
    @property
    def in_flight(self) -> bool: ...

    @property
    def ambiguous(self) -> bool | None: ...


class DatedAttempt(Protocol):
    @property
    def number(self) -> int: ...

    @property
    def started_at(self) -> float: ...

    @property
    def ended_at(self) -> float | None: ...

    @property
    def provider_date(self) -> float | None: ...

    @property
    def boot(self) -> str | None: ...

    @property
    def boottime(self) -> float | None: ...


def provider_first_sent(attempts: Iterable[DatedAttempt]) -> float | None:
    """The provider's time when the key's first attempt was sent: that attempt's answer's
    ``Date``, less how long the attempt took by this host's clock (never less than nothing).
    None when the first attempt got no answer, or one without a ``Date``.

    Only the first attempt's own answer dates it: an offset between the clocks learnt from
    a later answer says nothing of this host's clock when the first one was sent."""
    first = min(attempts, key=lambda attempt: attempt.number, default=None)
    if first is None or first.provider_date is None or first.ended_at is None:
        return None
    return first.provider_date - max(0.0, first.ended_at - first.started_at)


def provider_sent_before(attempts: Iterable[DatedAttempt]) -> float | None:
    """The provider's time by which the key's first attempt had surely been sent: the
    earliest ``Date`` of any attempt's answer (the first attempt left before every later
    one, and each answer was written after its attempt arrived). None without any."""
    dates = [attempt.provider_date for attempt in attempts if attempt.provider_date is not None]
    return min(dates, default=None)


@attrs.frozen
class KeyWindow:
    """What an intent's resend under its key was judged by when it began (``resend_refusal``
    of an attempt that may have executed: a resume's, or a call's once one of its own
    attempts may have executed), kept to judge each attempt of it again as it goes out:
    both clocks taken on by the monotonic clock's seconds since, so neither can step, and
    the provider's moved on by each later reading of it (``read``)."""

    first_sent_at: float
    key_lifetime: float
    now: float
    provider_now: float | None
    provider_first: float | None
    provider_sent_by: float | None
    within: float | None
    taken_at: float
    """The monotonic clock when the clocks above were read."""
    at_least: float | None = None
    """Seconds surely elapsed since the first send then, by the boot clock
    (``boot_elapsed``)."""

    def refusal_at(self, monotonic: float) -> str | None:
        """Why a resend still running at ``monotonic`` (the monotonic clock) could execute
        twice, or None while the key is surely remembered until then."""
        ahead = max(0.0, monotonic - self.taken_at)
        return resend_refusal(
            self.first_sent_at,
            self.now + ahead,
            self.key_lifetime,
            provider_now=None if self.provider_now is None else self.provider_now + ahead,
            provider_first=self.provider_first,
            provider_sent_by=self.provider_sent_by,
            within=self.within,
            at_least=None if self.at_least is None else self.at_least + ahead,
        )

    def read(self, provider_now: float | None, monotonic: float) -> KeyWindow:
        """The window as the provider's time ``provider_now`` (a fresh reading of its
        clock at ``monotonic``; None: none) also tells it: the later of that and the time
        carried forward. A provider's clock that jumped ahead has aged the key by its own
        reckoning, which is the one it forgets keys by; one read earlier than carried makes
        no key younger. Only the provider's time when the window was taken changes (what
        the reading says it was then), so all else goes on being carried as it was."""
        if provider_now is None:
            return self
        then = provider_now - max(0.0, monotonic - self.taken_at)
        if self.provider_now is not None and self.provider_now >= then:
            return self
        return attrs.evolve(self, provider_now=then)


def may_have_executed(attempts: Iterable[AttemptLike]) -> bool:
    """Whether any attempt may have reached the provider: ambiguous, or still in flight
    (its worker died before journaling how it ended)."""
    return any(attempt.in_flight or attempt.ambiguous for attempt in attempts)


def resend_refusal(
    first_sent_at: float | None,
    now: float,
    key_lifetime: float,
    *,
    executed: bool = True,
    provider_now: float | None = None,
    provider_first: float | None = None,
    provider_sent_by: float | None = None,
    within: float | None = None,
    at_least: float | None = None,
) -> str | None:
    """Why a resend under the key is no longer safe, or None while it still is.

    ``within``: a key age past which not to resend though it is short of 90% of
    ``key_lifetime`` (an unknown intent resent by payonce on its own where the lifetime is
    assumed, not documented: ``ASSUMED_LIFETIME_RESEND_WINDOW``).

    Without ``provider_now`` (the provider's time could not be read), the journaled
    ``provider_first`` and ``provider_sent_by`` judge the key's age too, by this host's
    clock now: the older of that and this host's clock's own age stands.

    ``executed``: whether an attempt may have reached the provider. The key's age matters
    only then; a first attempt dated in the future is refused either way, since nothing
    about such a record can be trusted.

    ``provider_now``: the provider's time now (a fresh reading of its ``Date``), None when
    unknown; ``provider_first``: the provider's time when the first attempt was sent
    (``provider_first_sent``), None when unknown; ``provider_sent_by``: the provider's time
    by which it had surely been sent (``provider_sent_before``), a bound on the key's age
    whatever this host's clock said then. With ``provider_now``, the key's age is the
    provider's clock's, as the module says.

    ``at_least``: seconds surely elapsed since the first send by this host's boot clock
    (``boot_elapsed``), None when unknown: wherever this host's clock dates the first send,
    the key is at least that old, whatever steps the wall clock took since.
    """
    if first_sent_at is None:
        return None
    if at_least is not None and now - first_sent_at >= -CLOCK_TOLERANCE:
        # A first send dated by a clock ahead then and set right since looks younger than
        # it is; the boot clock never stepped. (One dated in the future stays refused.)
        first_sent_at = min(first_sent_at, now - at_least)
    window, past = key_lifetime * (1 - KEY_LIFETIME_MARGIN), _past(key_lifetime)
    if within is not None and within < window:
        window, past = within, _past_assumed(within, key_lifetime)
    if not executed or provider_now is None:
        refusal = _by_this_host(first_sent_at, now, window, past, executed=executed)
        if refusal is not None or not executed:
            return refusal
        return _by_the_answers_dates(now, window, past, provider_first, provider_sent_by)
    refusal = _by_the_first_send(first_sent_at, now, window, past, provider_now, provider_first)
    if refusal is not None or provider_sent_by is None:
        return refusal
    if provider_now - provider_sent_by < window:
        return None
    skew = now - provider_now
    return (
        f"{_disagreeing(skew) if abs(skew) > CLOCK_TOLERANCE else ''}by the provider's clock "
        f"it answered an attempt {provider_now - provider_sent_by:.0f}s ago, and the first "
        f"attempt was sent before that: {past}"
    )


def _by_the_first_send(
    first_sent_at: float,
    now: float,
    window: float,
    past: str,
    provider_now: float,
    provider_first: float | None,
) -> str | None:
    """``resend_refusal`` by when the first attempt was sent, the provider's time known."""
    skew = now - provider_now
    off = abs(skew) > CLOCK_TOLERANCE
    if provider_first is not None:
        age = provider_now - provider_first
        clocks = _disagreeing(skew) if off else ""
        if age < -CLOCK_TOLERANCE:
            return (
                f"{clocks}the provider's answer to its first attempt is dated {-age:.0f}s "
                "ahead of the provider's time now: the provider's clock moved back; a "
                "resend could execute twice"
            )
        if age >= window:
            return f"{clocks}by the provider's clock it was first sent {age:.0f}s ago, {past}"
        # Neither clock is settled by trusting the other: a provider's Date can be wrong too
        # (a cached answer, an edge with a clock of its own). Either saying the key may be
        # gone is enough not to resend; reconciliation asks the provider which was right.
        local = now - first_sent_at
        if local >= window:
            return f"{clocks}yet by this host's clock it was first sent {local:.0f}s ago, {past}"
        return None
    if not off:
        return _by_this_host(first_sent_at, now, window, past, executed=True)
    # The first attempt got no answer, and the clocks disagree now: this host's clock may
    # have been right when it was sent (and stepped since), or as far off as it is now.
    ages = {"the provider's": provider_now - first_sent_at, "this host's": now - first_sent_at}
    possible = {clock: age for clock, age in ages.items() if age >= -CLOCK_TOLERANCE}
    unanswered = (
        f"{_disagreeing(skew)}and its first attempt got no answer, so when it was sent is "
        "known only by this host's clock then"
    )
    if not possible:
        return (
            f"{unanswered}, which dates it {-max(ages.values()):.0f}s in the future by "
            "either clock: the record is not this journal's own, or the clocks moved "
            "back; a resend could execute twice"
        )
    clock, age = max(possible.items(), key=lambda item: item[1])
    if age < window:
        return None
    return f"{unanswered}: by {clock} clock now it was first sent {age:.0f}s ago, {past}"


def _by_the_answers_dates(
    now: float,
    window: float,
    past: str,
    provider_first: float | None,
    provider_sent_by: float | None,
) -> str | None:
    """``resend_refusal`` by the journaled answers' dates, the provider's time now not
    known: the provider's clock then against this host's now. This host's clock may be the
    wrong one now, or may have been when the first attempt was sent; the older age stands
    (a resend refused wrongly is reconciled, one made wrongly pays twice)."""
    unread = "the provider's time could not be read now, and by this host's clock now"
    if provider_first is not None and now - provider_first >= window:
        return (
            f"{unread} the provider's answer to its first attempt dates that attempt "
            f"{now - provider_first:.0f}s ago, {past}"
        )
    if provider_sent_by is not None and now - provider_sent_by >= window:
        return (
            f"{unread} the provider answered an attempt {now - provider_sent_by:.0f}s ago, "
            f"and the first attempt was sent before that: {past}"
        )
    return None


def _past(key_lifetime: float) -> str:
    """Why an age refuses a resend: past the window, which ends short of the lifetime."""
    return (
        f"near or beyond the provider's key lifetime of {key_lifetime:.0f}s (payonce resends "
        f"only within {1 - KEY_LIFETIME_MARGIN:.0%} of it); a resend could execute twice"
    )


def _past_assumed(within: float, key_lifetime: float) -> str:
    """Why an age refuses an unknown intent's resend by payonce on its own, the provider's
    key lifetime being assumed, not documented."""
    return (
        f"beyond the {within:.0f}s within which payonce resends on its own an intent that "
        "may have executed "
        f"when the provider's key lifetime ({key_lifetime:.0f}s) is assumed, not documented: "
        "a provider that keeps keys for less would execute it twice"
    )


def _disagreeing(skew: float) -> str:
    way = "ahead of" if skew > 0 else "behind"
    return (
        f"this host's clock is {abs(skew):.0f}s {way} the provider's (its Date header), so "
        "the provider's clock judges the key's age; "
    )


def _by_this_host(
    first_sent_at: float, now: float, window: float, past: str, *, executed: bool
) -> str | None:
    """The key's age by this host's clock alone: the provider's time is not known."""
    age = now - first_sent_at
    if age < -CLOCK_TOLERANCE:
        return (
            f"its first attempt is dated {-age:.0f}s in the future: this host's clock moved "
            "back, or the record is not this journal's own; a resend could execute twice"
        )
    if not executed or age < window:
        return None
    return f"first sent {age:.0f}s ago, {past}"
