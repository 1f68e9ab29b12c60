"""Which (provider, account) groups of a journal ``resume`` and ``reconcile`` drive.

Given ``--provider`` and ``--account``, exactly that group. Without them, every group that
holds intents to drive, so that a command run with no options never reports "nothing to
do" while the journal holds work: all accounts of one provider, since a provider has one
``--base-url``; a journal holding work for several providers is a usage error that names
them, one run per provider.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import attrs

import payonce

from ._common import CliError

__all__ = ["Target", "choose", "elsewhere", "holdings"]


@attrs.frozen(order=True)
class Target:
    provider: str
    account: str

    @property
    def label(self) -> str:
        return f"account {self.account!r} (provider {self.provider!r})"


def holdings(records: Iterable[payonce.IntentRecord]) -> Counter[Target]:
    """How many of these intents each group holds."""
    return Counter(Target(record.provider, record.account) for record in records)


def choose(
    held: Counter[Target], provider: str | None, account: str | None, *, what: str
) -> list[Target]:
    """The groups to drive; ``what`` names the intents ("pending intents") for errors."""
    if provider is not None and account is not None:
        return [Target(provider, account)]
    wanted = sorted(
        target
        for target in held
        if (provider is None or target.provider == provider)
        and (account is None or target.account == account)
    )
    providers = sorted({target.provider for target in wanted})
    if len(providers) > 1:
        counts = ", ".join(
            f"{name} ({sum(n for t, n in held.items() if t.provider == name)})"
            for name in providers
        )
        raise CliError(
            f"the journal holds {what} of several providers: {counts}. Each has its own "
            "base URL: run once per provider, with --provider and its --base-url"
        )
    if not wanted and provider is not None:
        return []
    return wanted


def elsewhere(held: Counter[Target], driven: Iterable[Target]) -> str:
    """The groups left out that hold work, for the "nothing to do" line; "" if none."""
    left = sorted(set(held) - set(driven))
    if not left:
        return ""
    return "; the journal holds some of " + ", ".join(
        f"--provider {t.provider} --account {t.account} ({held[t]})" for t in left
    )
