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
    missing: int
    """Payments the provider never executed (left unknown or pending here)."""
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
    missing: int
    """Payments the provider never executed."""
    seconds: float


@attrs.frozen
class KillStats:
    """One client's batch, paid by worker processes that were killed and restarted."""

    orders: int
    workers: int
    kills: int
    """SIGKILLs delivered, each followed by a restart."""
    executions: int
    """Executions the provider counted, in total."""
    duplicates: int
    """Executions beyond one per order."""
    charged_twice: int
    """Orders executed more than once."""
    missing: int
    """Orders the provider never executed."""
    cut_off: int | None
    """Attempts a kill cut off between request and answer, as payonce's journal shows
    them (None for the stripe-python pattern, which keeps no record of its attempts)."""
    seconds: float


@attrs.frozen
class KillResult:
    """payonce's workers and the stripe-python pattern's, through the same kills."""

    faults: Faults
    processing: float
    """Seconds the provider took per payment."""
    payonce: KillStats
    stripe: KillStats

    @property
    def ok(self) -> bool:
        """True when payonce charged every order exactly once."""
        return self.payonce.duplicates == 0 and self.payonce.missing == 0


@attrs.frozen
class DemoResult:
    payments: int
    faults: Faults
    """The faults both clients met; their seed is the demo's."""
    journal: Path | None
    """Where the payonce journal was kept; None when it was temporary and is gone."""
    payonce: PayonceStats
    naive: NaiveStats
    kills: KillResult | None = None
    """The kill scenario; None when it was not run."""

    @property
    def ok(self) -> bool:
        """True when payonce executed no payment twice, every count adds up, and through
        the kills it charged every order exactly once."""
        killed_ok = self.kills is None or self.kills.ok
        return self.payonce.duplicates == 0 and not self.payonce.problems and killed_ok
