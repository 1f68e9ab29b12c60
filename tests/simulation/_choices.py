"""Every decision of a run, drawn from a seeded RNG or replayed from a recorded list.

A run asks ``pick(weights)`` for each decision (which process steps, which fault fires)
and gets an index. Index 0 is always the uneventful option (step the first runnable
process, deliver the request), so a list replayed past its end, or with an index out of
range, runs on quietly: what lets a shrinker delete and lower choices freely.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

__all__ = ["Chooser"]


class Chooser:
    """Draws (``seed``) or replays (``script``) a run's decisions, recording each one."""

    def __init__(self, seed: int, script: Sequence[int] | None = None) -> None:
        self._rng = random.Random(seed)
        self._script = None if script is None else list(script)
        self.made: list[int] = []
        self.quiet = False
        """Set for the end of a run: every decision is the uneventful one."""

    @property
    def replaying(self) -> bool:
        return self._script is not None

    def pick(self, weights: Sequence[float]) -> int:
        if self.quiet:
            return 0
        if self._script is not None:
            at = len(self.made)
            index = self._script[at] if at < len(self._script) else 0
            if not 0 <= index < len(weights) or weights[index] <= 0:
                index = 0
        else:
            index = self._rng.choices(range(len(weights)), weights)[0]
        self.made.append(index)
        return index

    @property
    def exhausted(self) -> bool:
        """A replayed list is used up: the run should end."""
        return self._script is not None and len(self.made) >= len(self._script)
