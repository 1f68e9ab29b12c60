"""The shortest list of choices that still breaks the same invariant the same way: delta
debugging over a failing run's recorded choices, each candidate replayed instead of the
RNG.

A choice list replayed past its end picks the uneventful option (``_choices``), so
deleting a chunk or lowering a choice to 0 always gives a run: it is kept when it still
shows a violation of the same kind. The shortest found is replayed once more for its story.
"""

from __future__ import annotations

from ._world import Features, RunResult, run_world

__all__ = ["shrink"]


def shrink(failed: RunResult, *, budget: int = 200, steps: int = 10_000) -> RunResult:
    """``failed`` shrunk within ``budget`` replays."""
    first = failed.violations[0]
    kind = (first.invariant, first.kind)
    seed, features = failed.seed, failed.features
    best = failed.choices
    tries = 0

    def still_fails(candidate: list[int]) -> list[int] | None:
        nonlocal tries
        tries += 1
        result = _replay(seed, features, candidate, steps)
        if any((v.invariant, v.kind) == kind for v in result.violations):
            return result.choices  # what the run used: never longer than the candidate
        return None

    chunk = max(1, len(best) // 2)
    while chunk >= 1 and tries < budget:
        start, shrunk = 0, False
        while start < len(best) and tries < budget:
            kept = still_fails(best[:start] + best[start + chunk :])
            if kept is not None and len(kept) < len(best):
                best, shrunk = kept, True
            else:
                start += chunk
        if not shrunk:
            chunk //= 2
    for at in range(len(best)):
        if tries >= budget:
            break
        if best[at] != 0:
            kept = still_fails([*best[:at], 0, *best[at + 1 :]])
            if kept is not None and len(kept) <= len(best):
                best = kept
    return _replay(seed, features, best, steps)


def _replay(seed: int, features: Features, script: list[int], steps: int) -> RunResult:
    return run_world(seed, features, steps=steps, script=script)
