"""What one drive's executor keeps between its commands, whichever I/O carries them out.

``Client._execute`` and ``AsyncClient._execute`` differ only in how they send, look up,
sleep and reach the journal. The rest of carrying a drive out is the same for both and
lives here: showing the caller's operation the records it should show, holding the lease
of the run a drive started (and letting it go), telling what was replayed or resent, and
ending the run whatever the drive ended with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, assert_never

import attrs

from .._lifecycle import Claim, ClaimKind, IntentRecord
from .._lifecycle import _drive as drive
from ._core import IntentCore
from ._lease_keeper import Lease

__all__ = ["IN_PROCESS", "Execution"]

IN_PROCESS = (drive.Holding, drive.Replay, drive.Resending, drive.LookupRetried, drive.Leased)
"""The commands an executor carries out without I/O of its own (``Execution.carry_out``)."""

InProcess = drive.Holding | drive.Replay | drive.Resending | drive.LookupRetried | drive.Leased


class _Keeper(Protocol):
    def hold(self, lease: Lease) -> None: ...

    def let_go(self, lease: Lease) -> None: ...


@attrs.define
class Execution:
    """One drive being carried out. ``bind``: told each record the caller's operation
    should show (None for drives no operation watches: resume, reconcile)."""

    core: IntentCore
    keeper: _Keeper
    bind: Callable[[IntentRecord], None] | None
    run: drive.Run | None = None
    """The run the drive started (``Holding``): ended in ``end``."""
    lease: Lease | None = None
    leased: tuple[str, str] | None = None
    """(key, owner) of the intent a reconciliation leased: the executor ends that lease
    with its own I/O, as it reaches the journal."""

    def journaled(self, answer: Any) -> None:
        """A journal command answered ``answer``: a claim shows the operation its record."""
        # Unless it found another request's intent (a mismatch): a step refused as unknown
        # or in flight still shows its key.
        if (
            self.bind is not None
            and isinstance(answer, Claim)
            and answer.kind is not ClaimKind.MISMATCH
        ):
            self.bind(answer.record)

    def carry_out(self, command: InProcess) -> Any:
        """The answer to one of the ``IN_PROCESS`` commands."""
        core = self.core
        match command:
            case drive.Holding(run):
                self.run = run
                if self.bind is not None:
                    self.bind(run.record)
                self.keeper.hold(lease := core.lease(run))
                self.lease = lease
                core.tell.drive_started(run)
                return None
            case drive.Replay(record):
                if self.bind is not None:
                    self.bind(record)
                return core.told(command)
            case drive.Resending() | drive.LookupRetried():
                return core.told(command)
            case drive.Leased(key, owner):
                self.leased = (key, owner)
                return None
            case _:
                assert_never(command)

    def let_go(self) -> tuple[str, str] | None:
        """Stop renewing the run's lease; the reconciliation lease (if any) the executor
        must end next, before ``end``."""
        if self.lease is not None:
            self.keeper.let_go(self.lease)
        return self.leased

    def end(self, failure: BaseException | None) -> None:
        """The drive is over (``failure``: what it raised): end its run, if it started one."""
        run = self.run
        if run is None:
            return
        if self.bind is not None:
            self.bind(run.record)
        self.core.run_over(run, failure)
        self.core.tell.drive_ended(run)
