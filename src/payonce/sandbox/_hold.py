"""The hold switch: while it is on, requests that execute wait at the provider, their key
claimed, until it is let go. A test so decides when the provider answers, instead of
betting that ``processing_seconds`` outlasts what it does meanwhile on a loaded machine."""

from __future__ import annotations

import asyncio
import threading

__all__ = ["Hold"]

_POLL_SECONDS = 0.005
"""How often a held request looks whether it was let go (from another thread)."""


class Hold:
    """Switched from a test's thread, waited on in the server's event loop."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._on = False
        self._held = 0

    def hold(self) -> None:
        with self._changed:
            self._on = True

    def let_go(self) -> None:
        with self._changed:
            self._on = False
            self._changed.notify_all()

    @property
    def held(self) -> int:
        """How many requests are waiting now."""
        with self._changed:
            return self._held

    def wait_held(self, count: int, timeout: float) -> bool:
        """Wait until ``count`` requests are waiting; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self._held >= count, timeout)

    async def passed(self) -> None:
        """Return once the hold is off (at once if it is)."""
        with self._changed:
            if not self._on:
                return
            self._held += 1
            self._changed.notify_all()
        try:
            while self._on:
                await asyncio.sleep(_POLL_SECONDS)
        finally:
            with self._changed:
                self._held -= 1
                self._changed.notify_all()
