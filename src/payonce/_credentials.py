"""Where the API key comes from: the argument, ``PAYONCE_API_KEY``, or the OS keyring.

A headless host rarely has a real keyring. keyring then picks its ``fail`` backend, or,
with keyrings.alt installed, silently a plaintext file. payonce refuses backends that store
nothing, store in plaintext (unless the user opts in), or would prompt for a password.
"""

from __future__ import annotations

import os

import keyring
import keyring.backend
import keyring.errors

from .errors import ConfigurationError

__all__ = ["KEYRING_SERVICE", "keyring_problem", "resolve_api_key"]

KEYRING_SERVICE = "payonce"
API_KEY_ENV = "PAYONCE_API_KEY"
ALLOW_PLAINTEXT_ENV = "PAYONCE_ALLOW_PLAINTEXT_KEYRING"

_HOW_TO = (
    "pass api_key=, set PAYONCE_API_KEY, or store one with `payonce keys set {account}` "
    "on a host with a working keyring (on a headless host: pip install keyrings.alt and "
    "opt in to its plaintext file with PAYONCE_ALLOW_PLAINTEXT_KEYRING=1)"
)


def _names(backend: keyring.backend.KeyringBackend) -> str:
    cls = type(backend)
    return f"{cls.__module__}.{cls.__qualname__}"


def keyring_problem(
    backend: keyring.backend.KeyringBackend, *, allow_plaintext: bool
) -> str | None:
    """Why this backend must not be used, or None when it is fine."""
    children = getattr(backend, "backends", None)
    if children is not None:  # a chainer: usable if one link is
        problems = [keyring_problem(child, allow_plaintext=allow_plaintext) for child in children]
        if any(p is None for p in problems):
            return None
        return problems[0] if problems else "the chained keyring has no backends"
    name = _names(backend)
    if name.startswith("keyring.backends.fail."):
        return "no usable keyring backend is installed"
    if name.startswith("keyring.backends.null."):
        return "the keyring backend is 'null', which stores nothing"
    if "Encrypted" in name or "cryptfile" in name:
        return f"the keyring backend {name} would prompt for a password"
    if "Plaintext" in name and not allow_plaintext:
        return (
            f"the keyring backend {name} stores secrets in a plaintext file; opt in with "
            f"PAYONCE_ALLOW_PLAINTEXT_KEYRING=1 or allow_plaintext_keyring=True"
        )
    return None


def usable_backends(
    backend: keyring.backend.KeyringBackend, *, allow_plaintext: bool
) -> list[keyring.backend.KeyringBackend]:
    """The links of a (possibly chained) backend that may be read, in the chain's order."""
    children = getattr(backend, "backends", None)
    if children is None:
        return [] if keyring_problem(backend, allow_plaintext=allow_plaintext) else [backend]
    return [
        usable
        for child in children
        for usable in usable_backends(child, allow_plaintext=allow_plaintext)
    ]


def plaintext_allowed(explicit: bool | None) -> bool:
    if explicit is not None:
        return explicit
    return os.environ.get(ALLOW_PLAINTEXT_ENV, "").strip().lower() in {"1", "true", "yes"}


def resolve_api_key(
    api_key: str | None, *, account: str, allow_plaintext_keyring: bool | None = None
) -> str:
    if api_key:
        return api_key
    from_env = os.environ.get(API_KEY_ENV)
    if from_env:
        return from_env
    how = _HOW_TO.format(account=account)
    backend = keyring.get_keyring()
    allow_plaintext = plaintext_allowed(allow_plaintext_keyring)
    problem = keyring_problem(backend, allow_plaintext=allow_plaintext)
    if problem is not None:
        raise ConfigurationError(f"no API key for account {account!r}: {problem}. To fix: {how}")
    secret = None
    try:
        # Never get_password on a whole chain: it would also read the refused links (a
        # plaintext file without opt-in, an encrypted file that prompts).
        for usable in usable_backends(backend, allow_plaintext=allow_plaintext):
            secret = usable.get_password(KEYRING_SERVICE, account)
            if secret:
                break
    except (keyring.errors.KeyringError, RuntimeError, EOFError, OSError) as exc:
        raise ConfigurationError(
            f"no API key for account {account!r}: the keyring failed "
            f"({type(exc).__name__}). To fix: {how}"
        ) from None
    if not secret:
        raise ConfigurationError(
            f"no API key for account {account!r} in the keyring. To fix: {how}"
        )
    return secret
