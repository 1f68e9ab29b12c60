"""Reconciliation's runtime side: which unknown intents to ask about, the look-up request,
giving the look-up's lease back, and the result a pass reports.

What a look-up's answer means, and which transition it applies, is the drive's
(``payonce._lifecycle._drive.reconcile``); the clients carry it out as they carry out a
send.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import attrs
import httpx

from .._journal._rows import DamagedRow, Intents
from .._lifecycle import IntentRecord, IntentState, ReconcileOutcome, step_of_reference
from .._lifecycle._drive import Reconciliation
from .._owners import owner_ended
from ..errors import ConfigurationError, JournalError
from ._core import IntentCore
from ._events import IntentReconciled
from ._hooks import Hooks

__all__ = [
    "ReconcileResult",
    "check_lookup",
    "end",
    "lookup_request",
    "reported",
    "result",
    "targets",
    "unknown",
]

logger = logging.getLogger("payonce")


@attrs.frozen
class ReconcileResult:
    """What one reconciliation found and what it did."""

    key: str
    reference: str | None
    before: IntentState
    after: IntentState
    outcome: ReconcileOutcome
    """``found``, ``not_found``, ``cannot_tell``, ``still_unknown``, ``error``, ``skipped``
    or ``resent`` (a ``str``)."""
    detail: str
    damaged: bool = False
    """Its journal row no longer decodes: not looked up (outcome ``error``; ``detail`` says
    what is wrong; ``payonce.journal.DamagedRow``)."""


def unknown(core: IntentCore) -> Intents:
    """The unknown intents of this client's account and provider, oldest first, with the
    rows of theirs that no longer decode in ``damaged``."""
    found = core.journal.list_intents(states=[IntentState.UNKNOWN])
    name, account = core.profile.name, core.account
    return Intents.of(
        [r for r in reversed(found) if (r.provider, r.account) == (name, account)],
        [d for d in found.damaged if (d.provider, d.account) == (name, account)],
    )


def targets(core: IntentCore, key_or_reference: str | None) -> list[IntentRecord | DamagedRow]:
    """The intents of this client's account to reconcile: one key/reference (with the
    steps of the block it names), or all unknown.

    ``--all`` takes only this client's provider: another provider's intents must be looked
    up at that provider, with its key lifetime. A named one is returned whatever its
    provider, and the drive says why it is skipped (``skip_reason``). The rows of the
    account and provider that no longer decode come after them, to be named, never looked
    up.
    """
    if key_or_reference is None:
        every = unknown(core)
        return [*every, *every.damaged]
    # A block's reference names its steps too: "reconcile order-1" must not report all
    # clear while its step 2 is unknown (each step is an intent of its own key).
    named = core.journal.find(key_or_reference)
    records = [*named]
    for record in named:
        records += [s for s in core.journal.steps(record.key) if s not in records]
    mine: list[IntentRecord | DamagedRow] = [r for r in records if r.account == core.account]
    return mine + [d for d in named.damaged if d.account == core.account]


def end(core: IntentCore, key: str, owner: str) -> None:
    """Give the look-up's lease back. When that cannot be written (a full disk), the lease
    stays with an owner that will never use it again: this process's next reconciliation
    of the intent may take it at once, and any other once it expires. So that failure is
    not the pass's news: the error that came first (recording the finding) is."""
    try:
        core.store.release(key, owner=owner)
    except JournalError as exc:
        owner_ended(owner)
        # Said once: after a failure already on its way out, this one is its echo.
        level = logging.DEBUG if exc.__context__ is not None else logging.WARNING
        logger.log(level, "intent %s: the look-up's lease was not given back: %s", key, exc)
    except BaseException:
        owner_ended(owner)
        raise


def check_lookup(core: IntentCore, record: IntentRecord) -> None:
    """Refuse to look ``record`` up with a profile that has no status look-up."""
    if core.profile.lookup is None:
        raise ConfigurationError(
            f"provider profile {core.profile.name!r} has no status look-up, so intent "
            f"{record.key} cannot be reconciled automatically: check it at the provider, "
            "then `payonce abandon` it or give the profile a Lookup"
        )


def lookup_request(
    core: IntentCore,
    record: IntentRecord,
    client: httpx.Client | httpx.AsyncClient,
    auth: Mapping[str, str] | None = None,
) -> httpx.Request:
    check_lookup(core, record)
    lookup = core.profile.lookup
    assert lookup is not None
    value = record.key if lookup.by == "key" else record.reference
    if lookup.by == "reference" and step_of_reference(record.reference) is not None:
        # A step's reference is payonce's own (``order-1#step2``), never the merchant
        # reference the provider knows: a look-up by it would find nothing, and "nothing"
        # would read as "never executed".
        raise ConfigurationError(
            f"provider {core.profile.name!r} looks intents up by reference, and intent "
            f"{record.key} is a later step of a block: its reference {record.reference!r} "
            "is payonce's own, which the provider does not know. Check it at the provider "
            "by hand"
        )
    if value is None:
        raise ConfigurationError(
            f"provider {core.profile.name!r} looks intents up by reference, and intent "
            f"{record.key} has none: check it at the provider by hand"
        )
    headers = core.auth_headers(auth)
    # The account the intent's request named (a connected account's Stripe-Account): the
    # look-up asks that account, or it finds nothing there and "nothing" reads as absent.
    scoped = {name.lower() for name in core.profile.account_scope_headers}
    headers.update((name, value) for name, value in record.request_headers if name in scoped)
    return client.build_request(
        "GET",
        core.base_url + lookup.path,
        params=lookup.params(value),
        headers=headers,
    )


def reported(core: IntentCore, result: ReconcileResult) -> None:
    """Tell the hooks what one intent of a pass came to."""
    if core.hooks:
        event = IntentReconciled(
            key=result.key,
            reference=result.reference,
            provider=core.profile.name,
            account=core.account,
            before=result.before,
            after=result.after,
            outcome=result.outcome,
            detail=result.detail,
        )
        core.hooks.emit(Hooks.reconciled, event)


def result(reconciliation: Reconciliation) -> ReconcileResult:
    """What a pass reports of one reconciliation."""
    record = reconciliation.record
    return ReconcileResult(
        record.key,
        record.reference,
        record.state,
        reconciliation.after,
        reconciliation.outcome,
        reconciliation.detail,
    )
