"""The client's credentials kept out of what payonce writes about an exception.

An exception's words are not payonce's: an HTTP stack quotes a header value it refuses to
write (h11: ``Illegal header value b'Bearer sk_live_…'``), a transport may quote a request.
Where such words go into a log, a result's detail or the CLI, the client's auth header
values (and the API key in them) are replaced first, in every form they could be quoted in.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable

import attrs

__all__ = ["REDACTED", "Redactor"]

REDACTED = "[redacted]"

_SHORTEST = 8
"""Shorter strings are not redacted: they would cut ordinary words out of messages, and no
provider's API key is that short (a test's ``api_key="x"`` still has ``Bearer x`` redacted)."""


def _quoted_forms(secret: str) -> set[str]:
    """``secret`` as it is, and as ``repr`` of the str or of its bytes would show it."""
    encoded = secret.encode("utf-8", "backslashreplace")
    return {secret, repr(secret)[1:-1], repr(encoded)[2:-1]}


@attrs.frozen
class Redactor:
    secrets: tuple[str, ...] = attrs.field(repr=False)
    """Longest first, so that a header value goes whole before the key inside it."""

    @classmethod
    def of(cls, secrets: Iterable[str]) -> Redactor:
        forms = {form for secret in secrets for form in _quoted_forms(secret)}
        kept = sorted((form for form in forms if len(form) >= _SHORTEST), key=len, reverse=True)
        return cls(tuple(kept))

    def shows_secret(self, text: str) -> bool:
        return any(secret in text for secret in self.secrets)

    def text(self, text: str) -> str:
        """``text`` with every secret replaced by ``[redacted]``."""
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

    def describe(self, error: BaseException) -> str:
        """``TypeName: message``, redacted: an error's words for a detail or a log line."""
        return self.text(f"{type(error).__name__}: {error}")

    def traceback(self, error: BaseException) -> str | None:
        """The error's traceback (with its causes), redacted, when it shows a secret; None
        when it shows none and can be logged as it is (``exc_info``)."""
        text = "".join(traceback.format_exception(error))
        return self.text(text).rstrip() if self.shows_secret(text) else None
