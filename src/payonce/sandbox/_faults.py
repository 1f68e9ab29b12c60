"""Fault injection: what can go wrong between a client and a payment provider."""

from __future__ import annotations

import random
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal, TypeGuard, get_args

import attrs

FaultName = Literal[
    "rate_limit", "fail_before", "fail_after", "drop_after", "delay", "lock_timeout", "none"
]
FAULT_NAMES: Final[frozenset[str]] = frozenset(get_args(FaultName))


def is_fault_name(value: object) -> TypeGuard[FaultName]:
    return isinstance(value, str) and value in FAULT_NAMES


def _number(value: object) -> bool:
    # bool is an int subclass, but `true` as a rate is almost certainly a caller's bug.
    return isinstance(value, int | float) and not isinstance(value, bool)


def _rate(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not _number(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{attribute.name} must be a number between 0 and 1, got {value!r}")


def _seconds(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not _number(value) or value < 0:
        raise ValueError(f"{attribute.name} must be a non-negative number, got {value!r}")


def _seed(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{attribute.name} must be an integer, got {value!r}")


@attrs.frozen
class Faults:
    """Probabilities of random faults; every rate is drawn from one RNG seeded by ``seed``."""

    seed: int = attrs.field(default=0, validator=_seed)
    delay_rate: float = attrs.field(default=0.0, validator=_rate)
    delay_seconds: float = attrs.field(default=0.0, validator=_seconds)
    fail_before_rate: float = attrs.field(default=0.0, validator=_rate)
    fail_after_rate: float = attrs.field(default=0.0, validator=_rate)
    drop_after_rate: float = attrs.field(default=0.0, validator=_rate)
    rate_limit_rate: float = attrs.field(default=0.0, validator=_rate)
    retry_after_seconds: float = attrs.field(default=1.0, validator=_seconds)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Faults:
        known = {field.name for field in attrs.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown fault settings: {', '.join(sorted(unknown))}")
        return cls(**data)


@attrs.frozen
class FaultPlan:
    """The faults that apply to one payment request, decided before it is processed."""

    rate_limit: bool = False
    fail_before: bool = False
    delay: bool = False
    fail_after: bool = False
    drop_after: bool = False
    lock_timeout: bool = False
    """409 before executing, as when another request holds the object (scripted only: a
    random rate would change every seeded sequence)."""

    @classmethod
    def single(cls, name: FaultName) -> FaultPlan:
        return cls() if name == "none" else cls(**{name: True})


class FaultInjector:
    """Decides each payment request's faults: forced header, then the script, then the RNG."""

    def __init__(self, faults: Faults) -> None:
        self._lock = threading.Lock()
        self._faults = faults
        self._random = random.Random(faults.seed)
        self._script: deque[FaultName] = deque()

    @property
    def faults(self) -> Faults:
        return self._faults

    def set_faults(self, faults: Faults) -> None:
        # Reseeding makes "set faults, then replay a request sequence" reproducible.
        with self._lock:
            self._faults = faults
            self._random = random.Random(faults.seed)

    def script(self, names: Iterable[str], *, replace: bool = False) -> None:
        """Queue these faults for the next requests, after those still queued; ``replace``
        drops those first (``[]`` with it clears the queue)."""
        checked = list(names)
        bad = [name for name in checked if not is_fault_name(name)]
        if bad:
            raise ValueError(f"unknown fault names: {', '.join(map(repr, bad))}")
        with self._lock:
            if replace:
                self._script.clear()
            self._script.extend(name for name in checked if is_fault_name(name))

    def pending_script(self) -> list[FaultName]:
        with self._lock:
            return list(self._script)

    def reset(self, faults: Faults) -> None:
        with self._lock:
            self._script.clear()
        self.set_faults(faults)

    def plan(self, forced: FaultName | None = None) -> FaultPlan:
        if forced is not None:
            return FaultPlan.single(forced)
        with self._lock:
            if self._script:
                return FaultPlan.single(self._script.popleft())
            f = self._faults
            # Always five draws in this order, whatever they decide, so that request N of a run
            # sees the same numbers for a given seed.
            draws = [self._random.random() for _ in range(5)]
        return FaultPlan(
            rate_limit=draws[0] < f.rate_limit_rate,
            fail_before=draws[1] < f.fail_before_rate,
            delay=draws[2] < f.delay_rate,
            fail_after=draws[3] < f.fail_after_rate,
            drop_after=draws[4] < f.drop_after_rate,
        )
