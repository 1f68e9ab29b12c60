"""What both clients share, without I/O: the options (named, typed, checked at
construction), the credentials, the journal, and the operation's identity and verbs.

``Client`` and ``AsyncClient`` add only what differs: the HTTP client, the lease keeper's
flavour, and the short chains that send, sleep and wait.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import ipaddress
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any, Generic, Literal, TypedDict, TypeVar, Unpack, cast

import attrs
import httpx

from .._crash import crash_point
from .._credentials import resolve_api_key
from .._fork import ForkGuard
from .._journal._open import journal_clock, open_to_write, store_of
from .._journal._reads import Journal
from .._journal._reports import JournalCommitted
from .._lifecycle import (
    IntentDraft,
    IntentRecord,
    IntentState,
    KeyFormat,
    canonical_request,
    check_headers,
    default_lease_seconds,
    is_mismatch,
    new_key,
    scope_path,
    step_key,
    step_of_reference,
    step_reference,
    validate_key,
    validate_reference,
)
from .._lifecycle import _refusals as refusals
from .._lifecycle._steps import (
    AskedStep,
    Continue,
    JournaledStep,
    NewStep,
    PlacedStep,
    RefusalKind,
    Refuse,
    Replay,
    place,
)
from .._providers._profile import ProviderProfile, get_profile
from .._version import __version__
from ..errors import ConfigurationError, IntentMismatch, OutcomeUnknown, ProviderError
from ._core import IntentCore, RecoveryKeys
from ._deadline import default_attempt_timeout
from ._events import RetryEvent
from ._hooks import Hooks, HookSet
from ._lease_keeper import ThreadLeaseKeeper
from ._options import check_base_url, check_count, check_seconds, check_timeout
from ._outbox import Outbox
from ._responses import DEFAULT_MAX_STORED_BYTES
from ._retrying import RetryPolicy

if TYPE_CHECKING:
    from ._lease_task import TaskLeaseKeeper

__all__ = [
    "MUTATING",
    "BaseClient",
    "OutsideIntent",
    "SdkKeys",
    "Step",
    "current_operation",
    "OneShotOptions",
    "OneShotVerbs",
    "OperationBase",
    "RequestOptions",
    "Verbs",
    "client_label",
    "draft_request",
    "refuse_outside_own_block",
]

logger = logging.getLogger("payonce")

USER_AGENT = f"payonce/{__version__}"

TransportT = TypeVar("TransportT", httpx.BaseTransport, httpx.AsyncBaseTransport)
OperationT = TypeVar("OperationT", bound="OperationBase")
R = TypeVar("R")

_SETTLED = (IntentState.SUCCEEDED, IntentState.FAILED)


class RequestOptions(TypedDict, total=False):
    """What a request of an intent takes besides its method and path."""

    json: Any
    """A JSON body, canonicalised (sorted keys, no insignificant whitespace)."""
    data: Mapping[str, Any] | Sequence[tuple[str, Any]]
    """A form body (``application/x-www-form-urlencoded``)."""
    content: bytes
    """Raw body bytes, sent as they are."""
    params: Mapping[str, Any]
    """Query parameters."""
    headers: Mapping[str, str]
    """Extra request headers; credentials among them are never journaled."""


class OneShotOptions(RequestOptions, total=False):
    """A one-shot call's options: a request's, plus the intent's name."""

    reference: str | None
    """The caller's name for the intent (an order id): same reference, same key."""
    key: str | None
    """The caller's own idempotency key, instead of a fresh one."""


class Verbs(Generic[R]):
    """An operation's ``post``, ``put``, ``patch`` and ``delete``: ``request`` with that
    method."""

    def request(self, method: str, path: str, **options: Unpack[RequestOptions]) -> R:
        raise NotImplementedError

    def post(self, path: str, **options: Unpack[RequestOptions]) -> R:
        return self.request("POST", path, **options)

    def put(self, path: str, **options: Unpack[RequestOptions]) -> R:
        return self.request("PUT", path, **options)

    def patch(self, path: str, **options: Unpack[RequestOptions]) -> R:
        return self.request("PATCH", path, **options)

    def delete(self, path: str, **options: Unpack[RequestOptions]) -> R:
        return self.request("DELETE", path, **options)


class OneShotVerbs(Generic[R]):
    """A client's one-shot ``post``, ``put``, ``patch`` and ``delete``, which also take
    ``reference=`` and ``key=``."""

    def request(self, method: str, path: str, **options: Unpack[OneShotOptions]) -> R:
        raise NotImplementedError

    @staticmethod
    def one_shot(options: OneShotOptions) -> tuple[str | None, str | None, RequestOptions]:
        """A one-shot call's reference, key, and the options of its request."""
        kept = {name: value for name, value in options.items() if name not in ("reference", "key")}
        return options.get("reference"), options.get("key"), cast(RequestOptions, kept)

    def post(self, path: str, **options: Unpack[OneShotOptions]) -> R:
        return self.request("POST", path, **options)

    def put(self, path: str, **options: Unpack[OneShotOptions]) -> R:
        return self.request("PUT", path, **options)

    def patch(self, path: str, **options: Unpack[OneShotOptions]) -> R:
        return self.request("PATCH", path, **options)

    def delete(self, path: str, **options: Unpack[OneShotOptions]) -> R:
        return self.request("DELETE", path, **options)


SdkKeys = Literal["honour", "replace"]
"""What ``client.transport()`` does with an idempotency key a request already carries."""
OutsideIntent = Literal["journal", "refuse"]
"""What ``client.transport()`` does with a mutating request outside any intent block."""


MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
"""The methods whose requests are steps of the current intent; the others are reads."""

_OPEN: ContextVar[Mapping[object, OperationBase]] = ContextVar("payonce_open_intents")
"""The intent blocks open in this context, one at most per client (by its core): the current
intent of each client. A context variable, so a block follows the asyncio tasks started
inside it and is seen by no other thread or task."""


def current_operation(core: object) -> OperationBase | None:
    """The block of this client's (``core``) intent open in this context, if any."""
    return _OPEN.get({}).get(core)


_OPEN_IN_THREADS: weakref.WeakKeyDictionary[IntentCore, dict[OperationBase, threading.Thread]] = (
    weakref.WeakKeyDictionary()
)
"""Every block open in this process, by client (its core), with the thread it was opened
in: what a request outside any block of its own context is checked against
(``warn_of_blocks_in_other_threads``). Context variables are not copied into a thread
pool's threads, so there a block's SDK call is outside it, silently, without this."""
_OPEN_IN_THREADS_LOCK = threading.Lock()


def blocks_in_other_threads(core: IntentCore) -> list[tuple[OperationBase, threading.Thread]]:
    """The blocks of this client open in other live threads than this one (after a fork,
    the parent's other threads are not alive in the child: their blocks are not here)."""
    here = threading.current_thread()
    with _OPEN_IN_THREADS_LOCK:
        blocks = list(_OPEN_IN_THREADS.get(core, {}).items())
    return [(op, thread) for op, thread in blocks if thread is not here and thread.is_alive()]


def other_threads_advice(blocks: Sequence[tuple[OperationBase, threading.Thread]]) -> str:
    """What an error or a warning says of blocks open in other threads, and the fix."""
    named = "; ".join(f"{op._named()} in thread {thread.name!r}" for op, thread in blocks)
    return (
        f"a block of this client is open in another thread: {named}. A thread pool's "
        "threads (ThreadPoolExecutor.submit, loop.run_in_executor) do not inherit the "
        "block, so a call meant as its step is a one-shot of its own under a key drawn for "
        "this call, which a run again after a crash cannot find. Run the call in a copy "
        "of the block's context, one copy per call: inside the block, "
        "`pool.submit(contextvars.copy_context().run, fn, ...)` (a context runs in one "
        "thread at a time), or `await asyncio.to_thread(fn, ...)` (it copies the context); "
        "or give the integration outside_intent='refuse' to make such a call "
        "an error"
    )


def warn_of_blocks_in_other_threads(core: IntentCore, kind: str, request: str) -> None:
    """A mutating request outside any block of its own context while a block of the same
    client is open in another thread: most likely meant as that block's step, sent from a
    thread pool that did not inherit it. Logged as a WARNING at once (the block's own
    end-of-block warning never comes if the process is killed first)."""
    blocks = blocks_in_other_threads(core)
    if blocks:
        logger.warning(
            "%s went through %s outside any intent block of its thread's context, while %s",
            request,
            client_label(kind, core),
            other_threads_advice(blocks),
        )


def client_label(kind: str, core: IntentCore) -> str:
    """How an error names a payonce client: its class and what tells it from another."""
    return (
        f"payonce.{kind}(provider={core.profile.name!r}, account={core.account!r}, "
        f"base_url={core.base_url!r})"
    )


def refuse_outside_own_block(core: IntentCore, kind: str, request: str) -> None:
    """A mutating request through this client (``core``) outside any block of its own,
    while a block of another payonce client is open in this context: refused, nothing
    journaled or sent.

    It is almost always a block opened on the wrong client: on the sync client while the
    SDK call goes through the async one (``create_async``), or on a second client built
    with the same settings. Let through, the request would be no step of that block but a
    one-shot intent under a fresh key, and the same code run again after a crash would
    pay a second time, silently.
    """
    others = [op for owner, op in _OPEN.get({}).items() if owner is not core]
    if not others:
        return
    this = client_label(kind, core)
    blocks = "; ".join(
        f"{op._named()} on {op._client_label}"
        + (" (another client object with the same settings)" if op._client_label == this else "")
        for op in others
    )
    raise ConfigurationError(
        f"{request} went through {this}, which has no intent block open here, while "
        f"another payonce client's block is: {blocks}. It would be no step of that intent "
        "but a one-shot under a fresh key, which a run again after a crash would send "
        "again (a second payment); nothing was journaled or sent. Open the block on the "
        "client that carries the request (`async with <AsyncClient>.intent(...)` for an "
        "SDK's async calls, on the very client object the SDK was given), or open a block "
        "on each client: blocks of different clients may be open together"
    )


@attrs.define(eq=False)
class Step:
    """One mutating request of a block: its position, its draft, and what came of it."""

    number: int
    draft: IntentDraft
    caller_key: bool
    """Its key is the caller's own (set on purpose), not derived from the intent's."""
    state: IntentState | None = None
    """As the journal last showed it to this block; None: never journaled (refused first)."""
    key: str | None = None
    acknowledged: bool = False
    answered: bool = False
    """Its success was handed to the caller in this block (returned, not raised): the
    same request again is then a second one on purpose (see ``OperationBase._position``)."""
    refused: bool = False
    """Refused before anything was sent: its position holds another request, whose key and
    state ``key`` and ``state`` show. That outcome is no answer of this block's request,
    so it is never acknowledged by this block."""

    @property
    def settled(self) -> bool:
        return self.state in _SETTLED and not self.refused


class OperationBase:
    """What both operation flavours share: identity, steps, drafting, acknowledgement."""

    def __init__(
        self,
        client: BaseClient[Any, Any],
        reference: str | None,
        key: str | None,
        acknowledge: bool,
    ) -> None:
        self._core = client._core
        self._client_label = client_label(type(client).__name__, client._core)
        self.reference = None if reference is None else validate_reference(reference)
        self._acknowledge = acknowledge
        self._key = key
        self._key_supplied = key is not None
        self._state: IntentState | None = None
        self._steps: dict[int, Step] = {}
        """This block's steps by position, in the order they were first asked for."""
        self._stepping = threading.Lock()
        """Held while a step runs: the steps of one intent run one after another."""
        self._token: Token[Mapping[object, OperationBase]] | None = None
        self._folds_acknowledgement = False
        """A one-shot's: nothing runs between its answer and the end of its block, so its
        acknowledgement goes into the settle's transaction instead of one of its own."""
        self._reads = 0
        """Reads (GET, HEAD) that went through this client's transport inside the block:
        they make no step, but show that the code above was wired to this client."""
        self._key_per_call = False
        """A one-shot of a request through the transport outside any block, whatever key it
        carried: payonce cannot tell whether code run again would name that key again, so
        it is journaled as drawn for this one call, and no resume or worker resends it
        (``IntentRecord.key_per_call``)."""
        self._journaled: list[JournaledStep] | None = None
        """The steps earlier runs of this block journaled, once read (``_read_steps``)."""
        self._fresh = False
        """This run created the block's step 1: nothing was journaled before it."""
        self._reread = False
        """A request was refused where it was placed before the journaled steps were
        read: they are read, and it is placed again, once (``_misplaced``)."""
        self._last_placed: Step | None = None
        self._ended = False
        """The block has ended: a request through a copy of its context is refused."""
        self._went_on: tuple[Step, ProviderError] | None = None
        """The latest step whose refusal was replayed while a run had gone on past it
        (``ProviderError.later_steps``), and that refusal: the block must go on to those
        steps, or raise as it ends (``_exit``)."""

    @property
    def key(self) -> str | None:
        """The intent's idempotency key (its step 1's), once journaled (or supplied by the
        caller). Step n (2 and later) is keyed ``step_key(key, n)``: see ``steps``."""
        return self._key

    @property
    def state(self) -> IntentState | None:
        """The state of the intent's latest step as this operation last saw it in the
        journal (after its last request returned or raised), or None before the first
        request. It does not read the journal, so it is safe on an event loop."""
        return self._state

    @property
    def steps(self) -> list[tuple[int, str | None, IntentState | None]]:
        """The steps this block made so far: (position, key, state as last seen). A step
        refused because its position holds another request (``IntentMismatch``) shows that
        position, the key and the state of what the journal holds there. After a refusal
        replayed at a position a run went on past, the steps it journaled after it follow,
        as the journal showed them, until this block asks for them itself."""
        made = [(step.number, step.key, step.state) for step in self._steps.values()]
        if self._went_on is None:
            return made
        later = [
            (number, key, IntentState(state))
            for number, key, state in self._went_on[1].later_steps
            if number not in self._steps
        ]
        return made + later

    # -- the block ---------------------------------------------------------------------------

    def _enter(self) -> None:
        """Make this intent its client's current one in this context (task, thread)."""
        open_blocks = _OPEN.get({})
        current = open_blocks.get(self._core)
        if current is not None or self._token is not None:
            named = current if current is not None else self
            raise ConfigurationError(
                f"an intent block of this client is already open here ({named!r}): blocks "
                "of one client do not nest. Every request of one business operation is a "
                "step of its one block; run another operation after this block ends, or in "
                "its own thread or task started outside the block"
            )
        self._token = _OPEN.set({**open_blocks, self._core: self})
        with _OPEN_IN_THREADS_LOCK:
            blocks = _OPEN_IN_THREADS.setdefault(self._core, {})
            blocks[self] = threading.current_thread()

    def _leave(self) -> None:
        self._ended = True
        token, self._token = self._token, None
        if token is None:
            return
        with _OPEN_IN_THREADS_LOCK:
            _OPEN_IN_THREADS.get(self._core, {}).pop(self, None)
        try:
            _OPEN.reset(token)
        except ValueError:
            # Left in another context than it was entered in (a block handed to another
            # task): take this block out of that context's map instead.
            remaining = {core: op for core, op in _OPEN.get({}).items() if op is not self}
            _OPEN.set(remaining)

    # -- steps -------------------------------------------------------------------------------

    def _step(
        self,
        method: str,
        path: str,
        options: RequestOptions,
        *,
        caller_key: str | None = None,
    ) -> Step:
        """The draft of this block's next mutating request, at its position.

        Where it goes is ``_lifecycle._steps.place``'s decision, from the steps earlier runs
        journaled (``_journaled``, read once the block found any) and those this run
        placed. Position 1 is the intent as payonce always journaled it (its reference, its
        key). Position n >= 2 is keyed ``step_key(intent key, n)`` (or ``caller_key``, a key
        the caller set on purpose) and referenced ``step_reference(reference or key, n)``,
        which holds the position to the key it was first journaled under on every run
        again. A request placed where another is journaled (a changed step) is drafted
        there all the same: its claim refuses it (``IntentMismatch``), nothing sent.
        """
        if self._ended:
            raise refused_after_block(self._named(), f"{method.upper()} {path}")
        draft = self._draft(method, path, options)
        number = self._position(draft, caller_key, asked=f"{method.upper()} {path}")
        profile = self._core.profile
        if caller_key is not None:
            validate_key(caller_key, max_length=profile.key_max_length)
        if number == 1:
            if caller_key is not None and self._key_supplied and caller_key != self._key:
                raise ConfigurationError(
                    f"the request sets idempotency key {caller_key!r}, and its intent's key is "
                    f"{self._key!r}: one step has one key. Drop one of them"
                )
            if caller_key is not None:
                draft = attrs.evolve(draft, key=caller_key, key_supplied=True)
            if self._key_per_call:
                draft = attrs.evolve(draft, key_per_call=True)
            step = Step(1, draft, caller_key=caller_key is not None)
        else:
            assert self._key is not None
            derived = step_key(self._key, number, max_length=profile.key_max_length)
            step = Step(
                number,
                attrs.evolve(
                    draft,
                    key=caller_key or derived,
                    key_supplied=True,
                    # Binds position n to the key it was first journaled under, as the
                    # block's reference binds step 1: a caller key drawn per call (a
                    # uuid4) is refused on a run again instead of paying that step again.
                    reference=step_reference(self.reference or self._key, number),
                    step=number,
                    intent_key=self._key,
                    intent_reference=self.reference,
                    derived_key=derived,
                ),
                caller_key=caller_key is not None,
            )
        self._steps[number] = step
        self._last_placed = step
        return step

    def _position(self, draft: IntentDraft, caller_key: str | None, *, asked: str) -> int:
        """Where a request goes in this block (``_lifecycle._steps.place``), ``asked``
        naming it for a refusal. A repeat of a step that succeeded while another has not
        is refused here, nothing sent: a retry loop inside the block, or a second payment?
        """
        if self._key is None:
            return 1  # step 1 was never journaled: this is step 1 again
        request = AskedStep(
            method=draft.method,
            path=scope_path(draft.scope, account=draft.account, method=draft.method),
            fingerprint=draft.fingerprint,
            caller_key=caller_key,
        )
        placement = place(self._journaled or (), self._placed(), request)
        match placement:
            case Replay(number) | Continue(number) | NewStep(number):
                return number
            case Refuse(RefusalKind.CHANGED, number):
                return number  # drafted there, refused by its claim with both requests named
            case Refuse(RefusalKind.REPEATED, number, _, _, unfinished):
                assert unfinished is not None
                waiting = self._steps[unfinished.position]
                raise ConfigurationError(
                    f"{asked} is the same request as step {number} of "
                    f"{self._named()}, which succeeded, while step {waiting.number} "
                    f"{_how_it_ended(waiting)}: a retry of the operation from its start, "
                    "or the same payment a second time on purpose? payonce cannot tell, so "
                    "nothing was sent. To retry, put the retry around the whole block: run "
                    "the block again (the same reference replays the steps that succeeded "
                    f"and carries on at step {waiting.number}). To pay twice on purpose, "
                    "give the request an idempotency key of its own derived from the "
                    'order (the SDK\'s idempotency_key=f"order-{id}-second"; never a '
                    "uuid4, which a run again would refuse) or make it in a block of its own"
                )
        raise AssertionError(placement)  # pragma: no cover

    def _placed(self) -> list[PlacedStep]:
        """This run's steps as ``place`` reads them."""
        return [
            PlacedStep(
                position=number,
                method=step.draft.method,
                path=scope_path(
                    step.draft.scope, account=step.draft.account, method=step.draft.method
                ),
                fingerprint=step.draft.fingerprint,
                state=step.state,
                caller_key=step.draft.key if step.caller_key else None,
                answered=step.answered,
            )
            for number, step in self._steps.items()
        ]

    def _must_read_steps(self) -> bool:
        """Whether this block must read what earlier runs journaled before placing its
        next request: its step 1 was journaled before this run (found, not created), and
        it has not read them yet. A block whose step 1 this run created knows them all
        (none), so a new payment costs no read."""
        if self._journaled is not None or self._fresh or self._key is None:
            return False
        return bool(self._steps) or self._reread

    def _steps_reading(self) -> dict[str, str]:
        """What ``drive.block_steps`` reads this block's journaled steps by."""
        assert self._key is not None
        return {
            "key": self._key,
            "provider": self._core.profile.name,
            "account": self._core.account,
            "named": self.reference or self._key,
        }

    def _read_steps(self, journaled: list[JournaledStep]) -> None:
        self._journaled = journaled

    def _misplaced(self) -> bool:
        """After ``IntentMismatch``: whether the refused request was placed before this
        block read what earlier runs journaled, so that it must be placed again once they
        are read (the customer create skipped this run: the payment met step 1, the
        customer's). Its refused placement is taken back; nothing was journaled for it.
        Never for a one-shot (``client.post(..., reference=)``), whose one request is its
        intent: another request under its reference is refused."""
        if self._journaled is not None or self._fresh or self._reread or self._key is None:
            return False
        if self._folds_acknowledgement:
            # A one-shot names its intent's one request: under a reference journaled with
            # another, it is refused, never placed as a step of it.
            return False
        step = self._last_placed
        if step is not None and self._steps.get(step.number) is step:
            del self._steps[step.number]
        self._reread = True
        return True

    def _named(self) -> str:
        """The block's intent as an error names it."""
        if self.reference is None:
            # A block opened with neither: its key comes with its first request.
            return "an intent of no reference" if self._key is None else f"intent {self._key!r}"
        if self._key is None:
            return f"intent {self.reference!r}"
        return f"intent {self.reference!r} (key {self._key!r})"

    @contextlib.contextmanager
    def _next_step(
        self,
        method: str,
        path: str,
        options: RequestOptions,
        *,
        caller_key: str | None = None,
    ) -> Iterator[tuple[IntentDraft, Callable[[IntentRecord], None]]]:
        """The draft of the request's step, and what its drive binds records to, while no
        other step of this block may start: positions are given one at a time."""
        if not self._stepping.acquire(blocking=False):
            raise ConfigurationError(
                f"{method.upper()} {path} was asked of {self!r} while another of its steps "
                "was running: the steps of one intent run one after another (their "
                "positions are their identity). Nothing was journaled or sent for this "
                "one; the step that was running goes on, and may pay. Change the code to "
                "await each request before the next (steps asked together are refused "
                "every time), then run this same block again: it replays the step that "
                "ran. Never run it as a block under a new reference (a second payment). "
                "Truly concurrent operations need blocks of their own, each under its own "
                "reference from the first run on"
            )
        try:
            step = self._step(method, path, options, caller_key=caller_key)
            try:
                yield step.draft, functools.partial(self._bind_step, step)
            except OutcomeUnknown:
                # Sent to unknown by this very drive, after its record was bound as pending.
                step.state = IntentState.UNKNOWN
                raise
            except ProviderError as refusal:
                if refusal.later_steps:
                    self._went_on = (step, refusal)
                raise
            # Not reached when the step raised: its answer never came back to the caller.
            step.answered = step.state is IntentState.SUCCEEDED
        finally:
            self._stepping.release()

    def _bind_step(self, step: Step, record: IntentRecord) -> None:
        if not self._is_own_row(step, record):
            # A mismatch: step 1's stays unshown (the intent is not this block's until its
            # step 1 is), step n's shows what its position holds.
            if step.number > 1:
                self._show_refused(step, record)
            elif self._key is None and self.reference is not None:
                # Its reference's step 1, journaled as another request: this block's key,
                # by which it reads its journaled steps to place the request again.
                self._key = record.key
                self._key_supplied = True
            return
        if step.number == 1 and not self._key_supplied and record.key == step.draft.key:
            self._fresh = True  # the key this run drew: created now, nothing before it
        step.refused = False
        step.key = record.key
        step.state = record.state
        step.acknowledged = record.acknowledged_at is not None
        if step.number == 1:
            self._key = record.key
            self._key_supplied = True
        self._state = record.state

    def _is_own_row(self, step: Step, record: IntentRecord) -> bool:
        """Whether ``record``, found by the drive of ``step``, is that step's own request
        under its own key (step 1's: the one its reference is bound to, unless the caller
        set it), at the position asked for or at one after a declined step it passed
        over. If not, the step is refused (``IntentMismatch``): the row is another
        request's, or under another key."""
        if step.number == 1:
            return not is_mismatch(record, step.draft)  # the claim's own rule
        if record.fingerprint != step.draft.fingerprint or record.scope != step.draft.scope:
            return False
        return record.key == self._key_at(step, record.reference)

    def _key_at(self, step: Step, reference: str | None) -> str | None:
        """The key ``step`` has at the position step reference ``reference`` names: the
        caller's, else the one derived for that position; its own where a row has no
        step reference (journaled before they existed); None where ``reference`` is no
        position of this block's."""
        found = step_of_reference(reference)
        if step.caller_key or found is None:
            return step.draft.key
        intent, number = found
        if self._key is None or intent != (self.reference or self._key):
            return None
        return step_key(self._key, number, max_length=self._core.profile.key_max_length)

    def _show_refused(self, step: Step, record: IntentRecord) -> None:
        """``step``, refused because ``record``, another request, holds the position it
        was placed at, shows that position, its key and its state: what ``op.steps``
        lists for it.

        Only a row of this block's own position under the key this block has there: not
        a row of another block named alike, nor one a key the caller set points to
        elsewhere, nor a row under a key that changed between runs (none of them is what
        this block journaled at that position)."""
        found = step_of_reference(record.reference)
        if found is None or found[0] != (self.reference or self._key):
            return
        number = found[1]
        if record.key != self._key_at(step, record.reference):
            return
        if number != step.number:
            if number in self._steps:
                return
            del self._steps[step.number]
            step.number = number
            self._steps[number] = step
        step.key = record.key
        step.state = record.state
        step.refused = True

    def _draft(self, method: str, path: str, options: RequestOptions) -> IntentDraft:
        return draft_request(
            self._core,
            method,
            path,
            options,
            reference=self.reference,
            key=self._key,
            key_supplied=self._key_supplied,
        )

    def _exit(self, exc_type: type[BaseException] | None, exc: BaseException | None = None) -> None:
        """Leaving the block: normally, the caller has dealt with the outcome; one that
        crashed or raised finds it in client.unacknowledged() instead of paying again.

        The acknowledgement costs no transaction: it rides in the journal's next write (see
        ``payonce._journal._acks``), and a crash before that leaves the intent listed as
        unacknowledged, the safe side. Only an outcome this block saw settled is
        acknowledged, step by step: one still pending or unknown has none to acknowledge,
        and one another worker settles meanwhile is an outcome this block never saw.
        Already acknowledged (with the settle, or before a replay): nothing to do. Never
        touches the disk, so it is safe on an event loop. A block that ends normally with
        no request through its client at all is logged as a WARNING: its payment calls, if
        any, went around payonce (another client, an SDK not wired to it).

        A block whose last step was a refusal replayed while a run had gone on past it (the
        customer's other card paid at the next step) raises ``IntentMismatch`` instead of
        ending on the refusal (from it, when it propagates): the order may be paid. Its
        steps stay unacknowledged.
        """
        self._leave()
        if exc is None or isinstance(exc, Exception):
            # Not an interrupt or a cancellation: those go on as they are.
            ended_short = self._ended_before_later_steps()
            if ended_short is not None:
                raise ended_short from exc
        if exc_type is None and not self._steps and not self._reads:
            logger.warning(
                "the block of %s ended without a single request through %s: nothing in it "
                "was made exactly-once. If it made payment calls, they went around this "
                "client: through another client's transport (the sync one's block around an "
                "SDK's async calls, or a second client object), or through an SDK not wired "
                "to this client (its http_client, httpx_client or session not given "
                "payonce.integrations' or client.transport()). A block with nothing to do "
                "may ignore this",
                self._named(),
                self._client_label,
            )
        if exc_type is None and self._acknowledge:
            for step in self._steps.values():
                if step.key is not None and step.settled and not step.acknowledged:
                    self._core.store.acknowledge_later(step.key, now=self._core.clock())
                    step.acknowledged = True
        if exc_type is None:
            crash_point("after_block")

    def _ended_before_later_steps(self) -> IntentMismatch | None:
        """The error of a block that replayed a refusal a run had gone on past (the
        customer's other card paid at the next step) and asked for nothing after it: the
        refusal would read as the intent's outcome while the order may be paid. None when
        the block went on (the other card's request replayed, or refused where it differs),
        or replayed no such refusal."""
        if self._went_on is None:
            return None
        step, refusal = self._went_on
        first_later = refusal.later_steps[0][0]
        if max(self._steps) >= first_later:
            return None
        return refusals.block_ended_before_later_steps(step.draft, step.number, refusal)

    def _settled_keys(self) -> list[str]:
        """The keys of this block's settled steps: what ``acknowledge()`` acknowledges."""
        return [s.key for s in self._steps.values() if s.key is not None and s.settled]

    def __repr__(self) -> str:
        # Named by what the caller knows it by: its reference (a key before step 1 ran is
        # only the caller's own, and None says nothing), then how far it got.
        name = type(self).__name__
        named = f"reference={self.reference!r}" if self.reference is not None else ""
        if self._key is not None:
            named = f"{named} key={self._key!r}".strip()
        if not self._steps:
            return f"<{name} {named or 'without reference'}, no step yet>"
        return f"<{name} {named}, {len(self._steps)} step(s)>"


def refused_after_block(named: str, request: str) -> ConfigurationError:
    """A request through a copy of a block's context (a thread or task started inside it,
    ``contextvars.copy_context()``) after the block ended: never joined to it silently."""
    return ConfigurationError(
        f"{request} came after the block of {named} ended, through a copy of its context (a "
        "thread or task started inside it); nothing was journaled or sent. Wait for such "
        "work inside the block, or give it a block of its own"
    )


def _how_it_ended(step: Step) -> str:
    """What came of a step whose success this block did not hand back, for an error."""
    if step.state is IntentState.SUCCEEDED:
        return "succeeded but its answer never reached the caller"
    if step.state is None:
        return "raised before the journal had it"
    if step.refused:
        return "was refused, its request another than the one journaled there"
    return {
        IntentState.FAILED: "was refused by the provider",
        IntentState.UNKNOWN: "is unknown (it may have executed)",
        IntentState.ABANDONED: "was abandoned",
    }.get(step.state, f"is {step.state.value} (it raised before its answer came)")


_ENQUEUEABLE = ("POST", "PUT", "PATCH", "DELETE")
"""The methods ``enqueue`` takes: a GET or HEAD changes nothing, so there is nothing to
make happen once, and a resume would send a read nobody waits for."""


def draft_request(
    core: IntentCore,
    method: str,
    path: str,
    options: RequestOptions,
    *,
    reference: str | None,
    key: str | None,
    key_supplied: bool,
) -> IntentDraft:
    """The draft of one request of an intent: canonical, checked, fingerprinted."""
    headers = options.get("headers")
    canonical = canonical_request(
        method,
        path,
        params=options.get("params"),
        json_body=options.get("json"),
        form=options.get("data"),
        form_encoder=core.profile.encode_form,
        content=options.get("content"),
        content_type=_content_type(headers),
    )
    return core.drafter.draft(
        canonical, reference=reference, key=key, key_supplied=key_supplied, headers=headers
    )


def _content_type(headers: Mapping[str, str] | None) -> str | None:
    # Headers are checked when the draft is made (check_headers): here, skip what is not.
    if not isinstance(headers, Mapping):
        return None
    for name, value in headers.items():
        if isinstance(name, str) and name.lower() == "content-type":
            return value
    return None


def _loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class BaseClient(abc.ABC, Generic[TransportT, OperationT]):
    """Options, credentials and the journal: everything that is not I/O."""

    _operation: type[OperationT]
    """The operation flavour of this client (``Operation``, ``AsyncOperation``)."""
    _http: httpx.Client | httpx.AsyncClient
    _keeper: ThreadLeaseKeeper | TaskLeaseKeeper

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
        attempt_timeout: float | None = None,
        key_format: KeyFormat = "ulid",
        verify: bool = True,
        max_stored_response_bytes: int = DEFAULT_MAX_STORED_BYTES,
        in_flight_wait: float = 30.0,
        lease_seconds: float | None = None,
        allow_plaintext_keyring: bool | None = None,
        hooks: Hooks | Sequence[Hooks] | None = None,
        on_retry: Callable[[RetryEvent], None] | None = None,
        clock: Callable[[], float] = time.time,
        transport: TransportT | None = None,
        transport_only: bool = False,
        recovery_keys: RecoveryKeys | None = None,
    ) -> None:
        """Every option is checked here: a wrong one is a ``ConfigurationError`` now, not
        a surprise inside an attempt.

        Args:
            base_url: The provider's API root, ``http://`` or ``https://`` with a host and
                no credentials in it.
            provider: A profile name (``generic``, ``sandbox``, ``stripe``, ``adyen``,
                ``mollie``, or one registered with ``register_profile``) or a
                ``ProviderProfile``.
            account: Whose API key and whose intents; part of every intent's scope.
            api_key: Defaults to ``PAYONCE_API_KEY``, then the OS keyring (service
                ``payonce``, user = ``account``).
            journal: A path, a ``postgresql://`` URL, a payonce ``Journal``, or None for
                ``PAYONCE_JOURNAL`` or the default file in the user data directory.
            retry: How hard to retry (``RetryPolicy()`` by default).
            timeout: Seconds, or an ``httpx.Timeout``; every part finite and positive.
                Each bounds one wait (to connect, to send, for each read).
            attempt_timeout: Seconds one exchange may take in all, from asking for a
                connection to the answer's last byte; by default the sum of the
                ``timeout`` parts. An answer trickled past it is cut like a timeout.
            key_format: ``"ulid"`` (default) or ``"uuid4"`` for new keys.
            verify: TLS certificate verification; turning it off is logged.
            max_stored_response_bytes: Larger answers settle from status and headers only.
            in_flight_wait: Seconds to wait for another worker's attempt on the same intent
                before ``IntentInFlight``.
            lease_seconds: How long a worker's claim on an intent lasts (renewed while an
                attempt runs); by default long enough to outlast the slowest attempt.
            allow_plaintext_keyring: Accept a plaintext keyring file (off by default).
            hooks: A ``payonce.Hooks`` (or several) told of every attempt, retry, settlement,
                replay, unknown outcome, look-up, resume and reconciliation (see
                ``docs/observability.md``; ``payonce.otel`` has OpenTelemetry's).
            on_retry: Called with a ``RetryEvent`` before each wait between attempts: the
                short form of a ``Hooks`` with only ``retrying``.
            clock: The time source (tests move it instead of sleeping).
            transport: An httpx transport: a seam for tests and custom networking
                (``httpx.BaseTransport`` for ``Client``, ``httpx.AsyncBaseTransport`` for
                ``AsyncClient``).
            transport_only: This client's requests all come through ``client.transport()``
                with the SDK's own credentials: no API key of its own is looked up (one
                given as ``api_key`` is still used for requests that bring none). Without
                a key, its verbs, ``resume`` and ``reconcile`` raise ``ConfigurationError``;
                run those from a client (or the CLI) that has the key.
            recovery_keys: More API keys ``resume``, ``reconcile`` and the worker may send
                (and look up) a journaled intent with: a list, or a function of the
                intent's record returning some (a platform's key per merchant). Each intent
                is sent again only with the key whose fingerprint it journaled: this
                client's, one of these, or one in the keyring; none, it is skipped (see
                ``docs/operating.md``).
        """
        base_url = check_base_url(base_url)
        profile = get_profile(provider)
        new_key(key_format)  # checks the format before anything is opened
        if retry is None:
            retry = RetryPolicy()
        elif not isinstance(retry, RetryPolicy):
            raise ConfigurationError(f"retry must be a payonce.RetryPolicy, not {retry!r}")
        timeouts = check_timeout(timeout)
        if attempt_timeout is None:
            self._attempt_timeout = default_attempt_timeout(timeouts)
        else:
            self._attempt_timeout = check_seconds("attempt_timeout", attempt_timeout, positive=True)
        max_stored = check_count("max_stored_response_bytes", max_stored_response_bytes, minimum=0)
        in_flight_wait = check_seconds("in_flight_wait", in_flight_wait)
        if lease_seconds is None:
            lease_seconds = default_lease_seconds(
                slowest_wait=max(
                    t or 0.0 for t in (timeouts.connect, timeouts.read, timeouts.write)
                ),
                longest_pause=max(retry.max_wait, retry.max_retry_after),
            )
        lease_seconds = check_seconds("lease_seconds", lease_seconds, positive=True)
        if not callable(clock):
            raise ConfigurationError(f"clock must be callable, not {clock!r}")
        hook_set = HookSet.of(hooks, on_retry)
        secret: str | None = api_key
        if not transport_only or api_key is not None:
            secret = resolve_api_key(
                api_key, account=account, allow_plaintext_keyring=allow_plaintext_keyring
            )
        try:
            if secret is not None:
                check_headers(profile.auth_headers(secret))
        except ConfigurationError:
            # It would fail inside every attempt instead. Never quoted, not even in part.
            raise ConfigurationError(
                f"the API key of account {account!r} holds characters an HTTP header cannot "
                "carry (line breaks, control characters, non-ASCII): check how it was copied"
            ) from None
        if httpx.URL(base_url).scheme == "http" and not _loopback(httpx.URL(base_url).host):
            logger.warning(
                "base_url %s is plain http:// to a host that is not this machine: the API "
                "key and every payment travel unencrypted. Use https:// outside tests",
                base_url,
            )
        if not verify:
            logger.warning(
                "TLS certificate verification is OFF for %s: only ever do this against a "
                "test provider",
                base_url,
            )
        self._owns_journal = not isinstance(journal, Journal)
        self.journal: Journal = open_to_write(journal)
        """The public journal: reads and operator commands (the writes are ``_core.store``'s)."""
        store = store_of(self.journal)
        self._commit_watcher: Callable[[JournalCommitted], None] | None = None
        if hook_set.wants(Hooks.journal_committed):
            self._commit_watcher = functools.partial(hook_set.emit, Hooks.journal_committed)
            store.watch_commits(self._commit_watcher)
        self._core = IntentCore(
            base_url=base_url,
            profile=profile,
            account=account,
            api_key=secret,
            journal=self.journal,
            store=store,
            retry=retry,
            key_format=key_format,
            max_stored_bytes=max_stored,
            lease_seconds=lease_seconds,
            # Leases, attempts' dates and the waits judged by them are shared with every
            # host of the journal: all of them by one clock, the journal's.
            clock=journal_clock(self.journal, clock),
            hooks=hook_set,
            in_flight_wait=in_flight_wait,
            recovery_keys=recovery_keys,
            allow_plaintext_keyring=allow_plaintext_keyring,
        )
        self._http_options: dict[str, Any] = {
            "timeout": timeouts,
            "verify": verify,
            "headers": {"User-Agent": USER_AGENT},
        }
        self._transport: TransportT | None = transport
        self._verify = verify
        self._fork = ForkGuard()
        self._connect(transport, self._http_options)

    def _stop_watching(self) -> None:
        """On close: a journal shared with other clients stops telling this one's hooks."""
        if self._commit_watcher is not None:
            self._core.store.unwatch_commits(self._commit_watcher)
            self._commit_watcher = None

    def _in_this_process(self) -> None:
        """After a fork, an HTTP client and a lease keeper of the child's own: a pooled
        keep-alive connection shared with the parent would hand one process the other's
        answers (see ``payonce._fork``). The journal reopens itself the same way."""
        if self._fork.forked(self._http, self._keeper):
            self._connect(self._transport, self._http_options)

    @abc.abstractmethod
    def _connect(self, transport: TransportT | None, options: dict[str, Any]) -> None:
        """Open the HTTP client and the lease keeper of this flavour."""

    def intent(
        self, reference: str | None = None, *, key: str | None = None, acknowledge: bool = True
    ) -> OperationT:
        """The context manager for one business operation (``async with`` for
        ``AsyncClient``).

        The same ``reference`` (for the same account, method and path) is the same intent
        with the same key, in this process or after a restart. Leaving the block normally
        acknowledges the outcome; pass ``acknowledge=False`` to acknowledge it yourself
        once your own database has recorded it.
        """
        return self._operation(self, reference, key, acknowledge)

    def _current_block(
        self, method: str, path: str, reference: str | None, key: str | None
    ) -> OperationT | None:
        """The block of this client open here, for a one-shot call made inside it: that
        call is the block's next step, and cannot name another intent.

        Outside any block of this client but inside another client's, a one-shot that
        names its intent (``reference=``, ``key=``) is that intent, the same on a run again,
        so it goes; one that names none would get a fresh key each run, so it is refused
        (``refuse_outside_own_block``) when it is a mutating request."""
        current = current_operation(self._core)
        if current is None:
            if reference is None and key is None and method.upper() in MUTATING:
                request = f"{method.upper()} {path}"
                refuse_outside_own_block(self._core, type(self).__name__, request)
                warn_of_blocks_in_other_threads(self._core, type(self).__name__, request)
            return None
        if reference is not None or key is not None:
            raise ConfigurationError(
                f"a one-shot call with reference= or key= inside the block of {current!r}: "
                "inside a block every request is a step of its intent. Call it without "
                "them (it becomes the next step), or outside the block"
            )
        return cast(OperationT, current)

    def _one_shot_intent(
        self, reference: str | None, key: str | None, *, key_per_call: bool = False
    ) -> OperationT:
        """The block of one one-shot call (``client.post(...)``); ``key_per_call``: a
        request through the transport outside any block (``OperationBase._key_per_call``)."""
        operation = self._operation(self, reference, key, True)
        operation._folds_acknowledgement = True
        operation._key_per_call = key_per_call
        return operation

    def _outbox_draft(
        self,
        method: str,
        path: str,
        reference: str,
        json: Any,
        data: Mapping[str, Any] | Sequence[tuple[str, Any]] | None,
        headers: Mapping[str, str] | None,
    ) -> IntentDraft:
        """The draft of an intent to enqueue: a request as ``request`` takes it, named."""
        # Sent later only with the key that journaled it: this client's own.
        self._core.require_api_key(f"enqueue({method!r}, {path!r})")
        if not isinstance(method, str) or method.upper() not in _ENQUEUEABLE:
            raise ConfigurationError(
                f"enqueue({method!r}, {path!r}): only a request that changes something at "
                f"the provider ({', '.join(_ENQUEUEABLE)}) is an intent to enqueue; nothing "
                "was written. Send a read directly, after your transaction commits "
                "(client.get(...))"
            )
        if reference is None:
            raise ConfigurationError(
                "enqueue needs reference= (your order id, say): it is what makes a retried "
                "handler's second enqueue the same intent rather than a second payment"
            )
        options: RequestOptions = {}
        if json is not None:
            options["json"] = json
        if data is not None:
            options["data"] = data
        if headers is not None:
            options["headers"] = headers
        return draft_request(
            self._core,
            method,
            path,
            options,
            reference=validate_reference(reference, required=True),
            key=None,
            key_supplied=False,
        )

    @functools.cached_property
    def _outbox(self) -> Outbox:
        return Outbox(self._core)

    @property
    def account(self) -> str:
        return self._core.account

    @property
    def provider(self) -> ProviderProfile:
        return self._core.profile
