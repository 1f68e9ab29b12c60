"""Which (provider, account) groups of a journal ``resume`` and ``reconcile`` drive.

Given ``--provider`` and ``--account``, exactly that group. Without them, every group that
holds intents to drive, so that a command run with no options never reports "nothing to
do" while the journal holds work: every account of every provider. Each provider is sent
to its own ``--base-url PROVIDER=URL``; one plain ``--base-url URL`` serves one provider,
and a journal holding work for several is then a usage error that names them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from urllib.parse import urlsplit

import attrs

import payonce

from ._common import CliError

__all__ = ["BaseUrls", "Target", "choose", "elsewhere", "holdings", "sent_origins"]


@attrs.frozen(order=True)
class Target:
    provider: str
    account: str

    @property
    def label(self) -> str:
        return f"account {self.account!r} (provider {self.provider!r})"


def holdings(records: Iterable[payonce.IntentRecord]) -> Counter[Target]:
    """How many of these intents each group holds, the rows of theirs that no longer decode
    counted in (``payonce.journal.Intents.damaged``): a group whose only pending intent is
    damaged is still driven, so that the pass names it."""
    found = [(record.provider, record.account) for record in records]
    damaged: Iterable[payonce.journal.DamagedRow] = getattr(records, "damaged", ())
    found += [(row.provider, row.account) for row in damaged if row.provider and row.account]
    return Counter(Target(provider, account) for provider, account in found)


def sent_origins(records: Iterable[payonce.IntentRecord]) -> dict[str, set[str]]:
    """Each provider's origins (``scheme://host[:port]``) its intents were sent to, as
    journaled: what to suggest to an operator who gave no base URL."""
    origins: dict[str, set[str]] = {}
    for record in records:
        parts = urlsplit(record.url)
        host = parts.hostname or ""
        host = f"[{host}]" if ":" in host else host  # an IPv6 address, as a URL writes it
        port = f":{parts.port}" if parts.port is not None else ""
        origins.setdefault(record.provider, set()).add(f"{parts.scheme}://{host}{port}")
    return dict(sorted(origins.items()))


@attrs.frozen
class BaseUrls:
    """``--base-url`` as given: one plain URL, or ``PROVIDER=URL`` for each provider."""

    plain: str | None
    by_provider: dict[str, str]

    @classmethod
    def parse(cls, values: Iterable[str]) -> BaseUrls:
        plain: list[str] = []
        by_provider: dict[str, str] = {}
        for value in values:
            name, sep, url = value.partition("=")
            if sep and "://" not in name and name:
                by_provider[name] = _http(url)
            else:
                plain.append(_http(value))
        if len(plain) > 1:
            raise CliError("--base-url: give one plain URL, or PROVIDER=URL for each provider")
        if not plain and not by_provider:
            raise CliError("--base-url is required (or PAYONCE_BASE_URL)")
        return cls(plain[0] if plain else None, by_provider)

    def of(self, provider: str) -> str | None:
        return self.by_provider.get(provider, self.plain)


def _http(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        # Not quoted back: whatever was pasted there by mistake may be a secret.
        raise CliError("--base-url must be an http(s) URL (or PROVIDER=URL)")
    return value


def choose(
    held: Counter[Target],
    provider: str | None,
    account: str | None,
    *,
    what: str,
    urls: BaseUrls,
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
    # A plain URL serving several providers would send one provider's intents to another.
    shared = sorted({t.provider for t in wanted if t.provider not in urls.by_provider})
    if urls.plain is not None and len({t.provider for t in wanted}) > 1 and shared:
        counts = ", ".join(
            f"{name} ({sum(n for t, n in held.items() if t.provider == name)})"
            for name in sorted({t.provider for t in wanted})
        )
        raise CliError(
            f"the journal holds {what} of several providers: {counts}. Each has its own "
            "base URL: give --base-url PROVIDER=URL for each (or --provider and its URL)"
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
