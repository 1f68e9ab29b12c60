"""What an SDK's exception says of the payonce error it stands for."""

from __future__ import annotations

from ..errors import IntentError, PayonceError

__all__ = ["about", "carry"]


def about(exc: PayonceError) -> str:
    """What an SDK's error adds to payonce's message: the key and the reference, for the
    caller to resume or reconcile with (and the step, for a step 2 or later of a block)."""
    if not isinstance(exc, IntentError):
        return ""
    named = [f"idempotency key {exc.key!r}"]
    if exc.reference is not None:
        named.append(f"reference {exc.reference!r}")
    if exc.step is not None and exc.step > 1:
        named.append(f"step {exc.step}")
    return f" ({', '.join(named)})"


def carry(error: BaseException, exc: BaseException) -> None:
    """Give an SDK's exception what payonce knows of the intent it is about, as attributes:
    ``payonce_error`` (the payonce error itself, or None), ``payonce_key``,
    ``payonce_reference`` and ``payonce_step`` (1 for the intent itself)."""
    payonce_error = exc if isinstance(exc, PayonceError) else None
    about_intent = payonce_error if isinstance(payonce_error, IntentError) else None
    setattr(error, "payonce_error", payonce_error)  # noqa: B010
    setattr(error, "payonce_key", None if about_intent is None else about_intent.key)  # noqa: B010
    reference = None if about_intent is None else about_intent.reference
    setattr(error, "payonce_reference", reference)  # noqa: B010
    setattr(error, "payonce_step", None if about_intent is None else about_intent.step)  # noqa: B010
