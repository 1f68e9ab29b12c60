"""What the demo measured: each client's counts, side by side."""

from __future__ import annotations

from pathlib import Path

import attrs

from payonce.sandbox import Faults


@attrs.frozen
class PayonceStats:
    intents: int
    attempts: int
    """HTTP attempts, as journaled."""
    retries: int
    provider_replays: int
    """Answers the provider replayed for a key it had already executed."""
    journal_replays: int
    """Payments answered from the journal, without the network, when sent a second time."""
    succeeded: int
    failed: int
    unknown: int
    pending: int
    executions: int
    """Executions the provider counted, in total."""
    executions_of_settled: int
    unknown_executed: int
    """Intents left unknown that the provider did execute (at most once each)."""
    duplicates: int
    """Executions beyond one per payment reference: must be zero."""
    charged_twice: int
    """Payments executed more than once: must be zero."""
    problems: tuple[str, ...]
    """Every broken promise found, one line each: must be empty."""
    seconds: float

    @property
    def settled(self) -> int:
        return self.succeeded + self.failed


@attrs.frozen
class NaiveStats:
    attempts: int
    retries: int
    answered: int
    """Payments that got a definitive answer (2xx or 4xx) in the end."""
    gave_up: int
    executions: int
    duplicates: int
    """Executions beyond one per payment reference."""
    charged_twice: int
    """Payments executed more than once."""
    seconds: float


@attrs.frozen
class DemoResult:
    payments: int
    faults: Faults
    """The faults both clients met; their seed is the demo's."""
    journal: Path | None
    """Where the payonce journal was kept; None when it was temporary and is gone."""
    payonce: PayonceStats
    naive: NaiveStats

    @property
    def ok(self) -> bool:
        """True when payonce executed no payment twice and every count adds up."""
        return self.payonce.duplicates == 0 and not self.payonce.problems
