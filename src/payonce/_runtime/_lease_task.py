"""The lease keeper of async code: it renews from an asyncio task (see ``_lease_keeper``).
Apart, so that a service that only uses ``Client`` never imports asyncio."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from ._journal_threads import off_loop
from ._lease_keeper import Keeper, Lease

__all__ = ["TaskLeaseKeeper"]


class TaskLeaseKeeper(Keeper):
    """Renews from an asyncio task, each round's journal writes in a journal thread."""

    def __init__(self, interval: float) -> None:
        super().__init__(interval)
        self._task: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def holding(self, lease: Lease) -> AsyncIterator[Lease]:
        self.hold(lease)
        try:
            yield lease
        finally:
            self.let_go(lease)

    def hold(self, lease: Lease) -> None:
        """Keep ``lease`` alive until ``let_go`` (on the event loop's thread)."""
        self._leases.add(lease)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._tick())

    def let_go(self, lease: Lease) -> None:
        self._leases.discard(lease)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            if not self._leases:
                return
            await off_loop(self._renew, list(self._leases))

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            # wait() rather than awaiting the task: its CancelledError is not ours to raise,
            # while a cancellation of the caller still is.
            await asyncio.wait([task])
