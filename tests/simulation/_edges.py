"""payonce's I/O edges, replaced for the length of one run: time, entropy, liveness,
lease keeping and the journal's background flusher. Never a decision of payonce.

- time: the executor's ``time.sleep`` (a command boundary that lets virtual time pass),
  the monotonic clock, the boot clock (``_core.boot_reading``), the journal's wall clock;
- entropy: payonce's new keys (``new_key``) and owner names (``new_owner``);
- liveness: every simulated process names its owners as calls of this OS process
  (``new_owner``), so payonce's own ``owner_is_dead`` judges them as it judges its own
  calls: alive until ended; a crash ends every owner of the crashed process
  (``owner_ended``), as the OS answers for a SIGKILLed pid; the table of ended owners is
  the run's own;
- threads: the lease keeper of each client is replaced by one the scheduler renews as time
  passes (``SimKeeper``), and acknowledgements wait for the journal's next write instead of
  a flusher thread, so a run stays in one OS thread;
- boundaries: each journal command of a drive is a command boundary
  (``IntentCore.journal_command``), where the scheduler may switch or crash the process.

The drive's own generators are wrapped only to see which commands they yield (coverage);
every command and answer passes through unchanged.
"""

from __future__ import annotations

import os
import types
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from payonce import _owners
from payonce._journal import _engine, _reads
from payonce._lifecycle import _drive
from payonce._runtime import _batch, _core, _deadline, _drafting, _sync
from payonce._runtime._lease_keeper import Keeper, Lease

from ._clocks import Clocks

__all__ = ["Edges", "SimKeeper", "installed"]


class Edges(Protocol):
    """What the replaced edges ask of the running world."""

    clocks: Clocks

    def sleep(self, seconds: float) -> None: ...

    def new_key(self) -> str: ...

    def new_owner(self) -> str: ...

    def journal_boundary(self, command: _drive.Command) -> None: ...

    def saw(self, command: object) -> None: ...


class SimKeeper(Keeper):
    """A process's lease keeper: holds its leases; the scheduler renews them (``renew``)
    while the process lives, as the keeper thread would every ``lease_seconds / 3``."""

    def __init__(self) -> None:
        super().__init__(interval=1.0)

    def hold(self, lease: Lease) -> None:
        self._leases.add(lease)

    def let_go(self, lease: Lease) -> None:
        self._leases.discard(lease)

    def renew(self) -> None:
        self._renew(list(self._leases))

    def close(self) -> None:
        self._leases.clear()


class _NoFlusher:
    """Acknowledgements ride in the journal's next write (or are lost with a crash, the
    safe side): no thread flushes them."""

    def schedule(self, journal: object) -> None:
        pass


def _observed(
    original: Callable[..., Generator[Any, Any, Any]], edges: Edges
) -> Callable[..., Generator[Any, Any, Any]]:
    def drive(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        commands = original(*args, **kwargs)
        answer: Any = None
        try:
            while True:
                try:
                    command = commands.send(answer)
                except StopIteration as done:
                    return done.value
                edges.saw(command)
                answer = yield command
        finally:
            commands.close()

    return drive


@contextmanager
def installed(edges: Edges) -> Iterator[None]:
    """Replace the edges for one run; put everything back after it."""
    clocks = edges.clocks
    journal_command = _core.IntentCore.journal_command

    def boundary_then_journal(
        self: _core.IntentCore, command: _drive.Command, *, after: BaseException | None = None
    ) -> Any:
        edges.journal_boundary(command)
        return journal_command(self, command, after=after)

    replaced: list[tuple[object, str, object]] = [
        (_sync, "time", types.SimpleNamespace(sleep=edges.sleep)),
        (_core, "time", types.SimpleNamespace(monotonic=clocks.monotonic)),
        (_core, "boot_reading", clocks.boot),
        (_deadline, "time", types.SimpleNamespace(monotonic=clocks.monotonic)),
        (_reads, "time", types.SimpleNamespace(time=clocks.wall, monotonic=clocks.monotonic)),
        (_drafting, "new_key", lambda key_format="ulid": edges.new_key()),
        (_sync, "new_owner", edges.new_owner),
        (_batch, "new_owner", edges.new_owner),
        (_owners, "_ended", {}),
        (_engine, "flusher", _NoFlusher()),
        (_core.IntentCore, "journal_command", boundary_then_journal),
        (_drive, "call", _observed(_drive.call, edges)),
        (_drive, "resume", _observed(_drive.resume, edges)),
        (_drive, "reconcile", _observed(_drive.reconcile, edges)),
    ]
    saved = [(target, name, getattr(target, name)) for target, name, _ in replaced]
    try:
        for target, name, value in replaced:
            setattr(target, name, value)
        yield
    finally:
        for target, name, value in saved:
            setattr(target, name, value)


def owner_name(process: str, salt: int) -> str:
    """An owner of a simulated process, named as a call of this OS process: what payonce's
    ``owner_is_dead`` judges by ``owner_ended`` alone."""
    pid = os.getpid()
    return f"{_owners._HOST}:{pid}:{_owners._own_start_time(pid)}:{process}-{salt:08x}"


def process_killed(owners: set[str]) -> None:
    """A simulated process was SIGKILLed: none of its owners renews or writes again."""
    for owner in owners:
        _owners.owner_ended(owner)
