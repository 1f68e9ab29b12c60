"""What must hold after every step and at the end of a run (issue 26):

1. no business operation executes twice at the provider (an operation named ``X*N`` is one
   the shop's code sends N times on purpose: it may execute N times, ``*0`` never);
2. nothing is lost: after the quiet end (faults off, every process finished, a resume and
   a reconciliation of each account), every intent is settled, abandoned, or unknown and
   listed by the CLI's own read (``intents list --state unknown``); none pending; every
   key the provider executed is in the journal;
3. what a caller is told agrees with what the provider did: a 2xx it is handed is the
   provider's answer to that very operation; the journal's "succeeded" was executed under
   its key, its "failed" was not;
4. a run again of an order's code after a crash completes it or raises a payonce error:
   it never starts it again, and never raises anything but a ``payonce.PayonceError``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import attrs
import httpx

from payonce import IntentState
from payonce._journal._sqlite import SQLiteJournal

if TYPE_CHECKING:
    from ._processes import Process
    from ._world import World

__all__ = ["Checker", "Violation"]

INVARIANTS = {
    1: "an operation executed twice at the provider",
    2: "something lost",
    3: "a caller told what the provider did not do",
    4: "a run again after a crash started the operation again",
}


@attrs.frozen
class Violation:
    invariant: int
    detail: str
    kind: str = ""
    """A short name of the class, for counting findings across runs."""

    def __str__(self) -> str:
        return f"invariant {self.invariant} ({INVARIANTS[self.invariant]}): {self.detail}"


class Checker:
    def __init__(self, world: World) -> None:
        self.world = world
        self.violations: list[Violation] = []
        self._seen_executions = 0

    def violated(self, invariant: int, detail: str, kind: str = "") -> None:
        violation = Violation(invariant, detail, kind or f"invariant-{invariant}")
        self.violations.append(violation)
        self.world.story.append(f"!! {violation}")

    # -- after every step ---------------------------------------------------------------------

    def after_step(self) -> None:
        provider = self.world.provider
        executions = provider.executions
        for execution in executions[self._seen_executions :]:
            if not execution.succeeded:
                continue
            earlier = [
                e
                for e in executions
                if e.succeeded and e.operation == execution.operation and e is not execution
            ]
            allowed = _allowed(execution.operation)
            if len(earlier) < allowed:
                continue
            if not earlier:
                self.violated(
                    1 if not execution.rerun else 4,
                    f"{execution.operation} executed ({execution.object_id} under key "
                    f"{execution.key}, by {execution.by}): its code expects it refused",
                    "executed, should be refused",
                )
                continue
            first = earlier[0]
            if first.account != execution.account:
                kind = "paid again at another account (credential not part of the intent)"
            elif first.key != execution.key:
                kind = "paid again under another key"
            else:
                kind = "paid again under the same key (key forgotten)"
            self.violated(
                4 if execution.rerun else 1,
                f"{execution.operation} executed twice: {first.object_id} at {first.account} "
                f"under key {first.key} (by {first.by}), then {execution.object_id} at "
                f"{execution.account} under key {execution.key} (by {execution.by}"
                + (", a run again after a crash)" if execution.rerun else ")"),
                kind,
            )
        self._seen_executions = len(executions)

    def told(self, process: Process, operation: str, response: httpx.Response) -> None:
        """A process was handed ``response`` as the answer to ``operation``."""
        if not 200 <= response.status_code < 300:
            return
        body = _json(response.content)
        if body is None or body.get("operation") != operation:
            got = "no JSON answer" if body is None else f"the answer to {body.get('operation')}"
            self.violated(
                3, f"{process.name} was told success for {operation} with {got}", "wrong answer"
            )
            return
        if self.world.provider.executed(str(body.get("id"))) is None:
            self.violated(
                3, f"{process.name} was told {operation} succeeded; the provider never did it"
            )

    def unexpected(self, process: Process, error: Exception) -> None:
        invariant = 4 if process.rerun else 3
        self.violated(
            invariant,
            f"{process.name} ({process.task}) raised {type(error).__name__}: {error}, "
            "not a payonce error",
            f"raised {type(error).__name__}",
        )

    # -- at the end ---------------------------------------------------------------------------

    def at_end(self) -> None:
        world = self.world
        journal = SQLiteJournal(world.journal_path, group_commit=False, check_integrity=False)
        try:
            unknown = {r.key for r in journal.list_intents(states=[IntentState.UNKNOWN])}
            records = journal.list_intents()
            for record in records:
                operation = (_json(record.body or b"") or {}).get("operation")
                under_key = [e for e in world.provider.executions_under(record.key) if e.succeeded]
                if record.state is IntentState.PENDING:
                    self.violated(
                        2,
                        f"intent {record.key} ({record.reference}, {operation}) is still "
                        "pending after the final resume",
                        "pending after recovery",
                    )
                elif record.state is IntentState.UNKNOWN and record.key not in unknown:
                    self.violated(2, f"unknown intent {record.key} not listed as unknown")
                elif record.state is IntentState.SUCCEEDED and not any(
                    e.operation == operation for e in under_key
                ):
                    self.violated(
                        3,
                        f"intent {record.key} ({operation}) is journaled succeeded; the "
                        "provider never executed it under its key",
                        "succeeded, never executed",
                    )
                elif record.state is IntentState.FAILED and any(
                    e.operation == operation for e in under_key
                ):
                    self.violated(
                        3,
                        f"intent {record.key} ({operation}) is journaled failed; the provider "
                        "executed it",
                        "failed, executed",
                    )
            journaled = {r.key for r in records}
            for execution in world.provider.executions:
                if execution.key is not None and execution.key not in journaled:
                    self.violated(
                        2,
                        f"the provider executed {execution.operation} under key "
                        f"{execution.key}, which the journal does not hold",
                        "executed, not journaled",
                    )
        finally:
            journal.close()


def _allowed(operation: str) -> int:
    """How many times the shop's code means ``operation`` to execute."""
    _, star, times = operation.rpartition("*")
    return int(times) if star and times.isdigit() else 1


def _json(content: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(content)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
