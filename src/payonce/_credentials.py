"""Where the API key comes from: the argument, ``PAYONCE_API_KEY``, or the OS keyring.

A headless host rarely has a real keyring. keyring then picks its ``fail`` backend, or,
with keyrings.alt installed, silently a plaintext file. payonce refuses backends that store
nothing, store in plaintext (unless the user opts in), or would prompt for a password.

Keys are stored under service ``payonce``, one entry per account. keyring cannot list the
entries of a service, so payonce keeps an index beside them: the entry ``__accounts__`` of
the same service holds a JSON array of the account names (never a secret). That name is
reserved. Writes go to the first usable link of a chained keyring, never to a refused one.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from ._lifecycle._credential import Candidate, credential_fingerprint
from ._lifecycle._identity import header_value_problem
from .errors import ConfigurationError

if TYPE_CHECKING:
    import keyring.backend

# keyring is imported where it is used: loading it (and its backends' dependencies) costs
# about 50 ms, which a client given its API key, or a process reading it from the
# environment, never needs to pay.

__all__ = [
    "ACCOUNT_INDEX",
    "KEYRING_SERVICE",
    "credential_fingerprint",
    "delete_api_key",
    "keyring_candidates",
    "keyring_problem",
    "recovery_api_key",
    "resolve_api_key",
    "store_api_key",
    "stored_accounts",
]

KEYRING_SERVICE = "payonce"
ACCOUNT_INDEX = "__accounts__"
"""The reserved keyring username under which payonce keeps the list of its accounts."""
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


def _sendable(secret: object, *, account: str, source: str) -> str:
    """``secret`` when an HTTP header can carry it as given; otherwise a ConfigurationError
    that says what is wrong with it and where it came from.

    Refused here, before any journal is opened, because it would otherwise fail inside every
    attempt, with the HTTP stack's own error quoting the whole header: the key with it.
    """
    if isinstance(secret, str):
        problem = header_value_problem(secret)
        if problem is None:
            return secret
    else:
        problem = f"is a {type(secret).__name__}, not a str"
    # Never quoted, not even in part.
    raise ConfigurationError(
        f"the API key of account {account!r} (from {source}) {problem}, which an HTTP header "
        "cannot carry as given: check how it was copied. The key is not shown"
    )


def recovery_api_key(
    account: str,
    *,
    named: str | None = None,
    allow_plaintext_keyring: bool | None = None,
    wanted: Iterable[str | None] = (),
) -> str:
    """The API key to recover ``account``'s journaled intents with (``payonce resume``,
    ``reconcile``, ``worker``, ``payonce.Worker``): ``PAYONCE_API_KEY`` only for the account
    the operator named (``named``: ``--account``, ``PAYONCE_ACCOUNT``, or ``account=``),
    else the account's entry in the keyring.

    Whose key the variable holds is never guessed, not even for a journal holding one
    account's intents: a fresh or pruned journal's only account may be another than the
    key's, and a provider takes one account's key sent for another's intents and pays on
    the wrong account.

    Raises ConfigurationError, naming the account and how to give it its key, when it has
    none: nothing is sent for it. The fix it gives works as written: it names the account
    along with the variable, since the variable alone never serves an account not named.
    ``wanted``: the credential fingerprints its intents journaled, named in that error (only
    a key of one of them sends them again)."""
    try:
        return _recovery_api_key(account, named, allow_plaintext_keyring)
    except ConfigurationError as missing:
        fingerprints = sorted({f for f in wanted if f is not None})
        if not fingerprints:
            raise
        raise ConfigurationError(
            f"{missing}. Its intents were sent with credential(s) {', '.join(fingerprints)}"
        ) from None


def _recovery_api_key(account: str, named: str | None, allow_plaintext_keyring: bool | None) -> str:
    from_env = os.environ.get(API_KEY_ENV)
    if from_env and named == account:
        return _sendable(from_env, account=account, source=API_KEY_ENV)
    try:
        return _from_keyring(account, allow_plaintext_keyring)
    except _NoKeyInKeyring as exc:
        keyring_says = exc.problem
    keyring_has = (
        f"the keyring has none ({keyring_says})" if keyring_says else "the keyring has none"
    )
    fix = (
        f"To fix: set PAYONCE_ACCOUNT={account} (or --account {account}) alongside "
        f"{API_KEY_ENV} holding its key, or store its key with `payonce keys set {account}`"
    )
    if not from_env:
        raise ConfigurationError(
            f"no API key for account {account!r}: {API_KEY_ENV} is not set and {keyring_has}. "
            f"To fix: set PAYONCE_ACCOUNT={account} alongside {API_KEY_ENV} holding its key, "
            f"or run `payonce keys set {account}`"
        ) from None
    whose = (
        f"it is the key of account {named!r} (--account)"
        if named is not None
        else "no account was named (PAYONCE_ACCOUNT or --account), so it is not known "
        "to be this one's"
    )
    raise ConfigurationError(
        f"no API key for account {account!r}: {API_KEY_ENV} is set, but is never sent "
        f"for it: {whose}, and {keyring_has}. {fix}"
    ) from None


def resolve_api_key(
    api_key: str | None, *, account: str, allow_plaintext_keyring: bool | None = None
) -> str:
    """The API key of ``account``: the argument, else ``PAYONCE_API_KEY``, else the keyring;
    from wherever it comes, one an HTTP header can carry as given."""
    if api_key:
        return _sendable(api_key, account=account, source="api_key=")
    from_env = os.environ.get(API_KEY_ENV)
    if from_env:
        return _sendable(from_env, account=account, source=API_KEY_ENV)
    return _from_keyring(account, allow_plaintext_keyring)


class _NoKeyInKeyring(ConfigurationError):
    """The keyring holds no usable key for the account; ``problem`` says why, when it is
    more than the entry missing (no usable backend, locked, failed), else None."""

    def __init__(self, message: str, problem: str | None) -> None:
        super().__init__(message)
        self.problem = problem


def _from_keyring(account: str, allow_plaintext_keyring: bool | None) -> str:
    """The API key of ``account`` in the keyring, or _NoKeyInKeyring saying why not."""
    how = _HOW_TO.format(account=account)
    if account == ACCOUNT_INDEX:
        reserved = "that keyring entry is payonce's index of accounts, not a key"
        raise _NoKeyInKeyring(
            f"no API key for account {account!r}: {reserved}. To fix: {how}", reserved
        )
    import keyring

    backend = keyring.get_keyring()
    allow_plaintext = plaintext_allowed(allow_plaintext_keyring)
    problem = keyring_problem(backend, allow_plaintext=allow_plaintext)
    if problem is not None:
        if "plaintext file" in problem:  # keyrings.alt is installed already: no need to say so
            how = "pass api_key=, set PAYONCE_API_KEY, or opt in to that file as above"
        raise _NoKeyInKeyring(
            f"no API key for account {account!r}: {problem}. To fix: {how}", problem
        )
    secret = None
    # Never get_password on a whole chain: it would also read the refused links (a
    # plaintext file without opt-in, an encrypted file that prompts).
    for usable in usable_backends(backend, allow_plaintext=allow_plaintext):
        try:
            secret = usable.get_password(KEYRING_SERVICE, account)
        # Backends raise anything (secretstorage without D-Bus raises its own exceptions):
        # whatever it is, it is a keyring that does not work here.
        except Exception as exc:
            if _is_locked(exc):
                problem = _locked(usable)
                raise _NoKeyInKeyring(
                    f"no API key for account {account!r}: {problem}. To fix: "
                    f"{_UNLOCK_HOW_TO}, or pass api_key= or set PAYONCE_API_KEY",
                    f"{problem}: {_UNLOCK_HOW_TO}",
                ) from None
            problem = f"the keyring failed ({type(exc).__name__})"
            raise _NoKeyInKeyring(
                f"no API key for account {account!r}: {problem}. To fix: {how}", problem
            ) from None
        if secret:
            break
    if not secret:
        raise _NoKeyInKeyring(
            f"no API key for account {account!r} in the keyring. To fix: {how}", None
        )
    # Stored by other means than `payonce keys set` (which refuses such a key), or edited.
    where = f"the keyring, service {KEYRING_SERVICE!r}, entry {account!r}"
    return _sendable(secret, account=account, source=where)


# -- managing stored keys ----------------------------------------------------------------------


def _keyring_errors() -> tuple[type[Exception], ...]:
    import keyring.errors

    return (keyring.errors.KeyringError, RuntimeError, EOFError, OSError)


def _is_locked(exc: Exception) -> bool:
    import keyring.errors

    return isinstance(exc, keyring.errors.KeyringLocked)


def _locked(backend: keyring.backend.KeyringBackend) -> str:
    """A locked keyring: a Secret Service collection after the screen locked, or one never
    unlocked on a host without a desktop session, where no unlock prompt can be shown."""
    return (
        f"the keyring {_describe(backend)} is locked and was not unlocked (no unlock prompt "
        "was answered; without a desktop session none can be shown)"
    )


_UNLOCK_HOW_TO = (
    "unlock it (log in to the desktop session, or unlock the collection in the keyring "
    "manager: Seahorse, KWalletManager) and run this again"
)


_INSTALL_HOW_TO = (
    "use the OS keyring (Secret Service or KWallet on Linux, Keychain on macOS); on a "
    "headless host, pip install keyrings.alt and opt in to its "
    "plaintext file with PAYONCE_ALLOW_PLAINTEXT_KEYRING=1; or store no key at all and set "
    "PAYONCE_API_KEY in the environment of the process that pays"
)


def _check_account(account: str) -> None:
    if not account or account != account.strip() or not account.isprintable():
        raise ConfigurationError(
            f"invalid account name {account!r}: it must be non-empty, printable, and have no "
            "leading or trailing spaces"
        )
    if account == ACCOUNT_INDEX:
        raise ConfigurationError(
            f"the account name {ACCOUNT_INDEX!r} is reserved: payonce keeps its index of "
            "accounts in that keyring entry"
        )


def _check_secret(secret: str) -> None:
    if not secret:
        raise ConfigurationError("the API key is empty")
    if not secret.isascii() or any(char.isspace() or not char.isprintable() for char in secret):
        # Never quote the secret, not even in part. Non-ASCII too: no header can carry it.
        raise ConfigurationError(
            "the API key must be one line of printable ASCII characters without spaces"
        )


def _describe(backend: keyring.backend.KeyringBackend) -> str:
    """The backend's name, and its file when it keeps one (keyrings.alt)."""
    path = getattr(backend, "file_path", None)
    return f"{_names(backend)} ({path})" if isinstance(path, str) else _names(backend)


def _usable(
    doing: str, allow_plaintext_keyring: bool | None
) -> list[keyring.backend.KeyringBackend]:
    """The usable links of the configured keyring, or a ConfigurationError saying how to get one."""
    import keyring

    backend = keyring.get_keyring()
    allow_plaintext = plaintext_allowed(allow_plaintext_keyring)
    usable = usable_backends(backend, allow_plaintext=allow_plaintext)
    if not usable:
        problem = keyring_problem(backend, allow_plaintext=allow_plaintext)
        raise ConfigurationError(
            f"cannot {doing}: {problem or 'no usable keyring backend'}. To fix: {_INSTALL_HOW_TO}"
        )
    return usable


@contextlib.contextmanager
def _keyring_failures(doing: str, backend: keyring.backend.KeyringBackend) -> Iterator[None]:
    try:
        yield
    except _keyring_errors() as exc:
        if _is_locked(exc):
            raise ConfigurationError(
                f"cannot {doing}: {_locked(backend)}. To fix: {_UNLOCK_HOW_TO}"
            ) from None
        # The exception's own text is left out: a backend could quote what it was given.
        raise ConfigurationError(
            f"cannot {doing}: the keyring {_describe(backend)} failed ({type(exc).__name__})"
        ) from None


def _read_index(backend: keyring.backend.KeyringBackend) -> set[str]:
    raw = backend.get_password(KEYRING_SERVICE, ACCOUNT_INDEX)
    if raw is None:
        return set()
    try:
        names = json.loads(raw)
    except ValueError:
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ConfigurationError(
            f"payonce's index of accounts in the keyring {_describe(backend)} (service "
            f"{KEYRING_SERVICE!r}, entry {ACCOUNT_INDEX!r}) is not a JSON list of names: "
            f"delete that entry (keyring del {KEYRING_SERVICE} {ACCOUNT_INDEX}); the next "
            "`payonce keys set` starts a new one"
        )
    return set(names)


def _write_index(backend: keyring.backend.KeyringBackend, accounts: set[str]) -> None:
    if accounts:
        backend.set_password(KEYRING_SERVICE, ACCOUNT_INDEX, json.dumps(sorted(accounts)))
    elif backend.get_password(KEYRING_SERVICE, ACCOUNT_INDEX) is not None:
        backend.delete_password(KEYRING_SERVICE, ACCOUNT_INDEX)


def store_api_key(account: str, secret: str, *, allow_plaintext_keyring: bool | None = None) -> str:
    """Store (or replace) the API key of ``account`` in the OS keyring; returns where it went.

    It goes to the first usable link of the configured keyring: never to a backend that
    stores nothing, would prompt for a password, or keeps a plaintext file without opt-in
    (``allow_plaintext_keyring=True`` or ``PAYONCE_ALLOW_PLAINTEXT_KEYRING=1``). The account
    is added to payonce's index of accounts in the same backend.
    """
    _check_account(account)
    _check_secret(secret)
    doing = f"store the API key of account {account!r}"
    target = _usable(doing, allow_plaintext_keyring)[0]
    with _keyring_failures(doing, target):
        accounts = _read_index(target)
        target.set_password(KEYRING_SERVICE, account, secret)
        if account not in accounts:
            _write_index(target, accounts | {account})
    return _describe(target)


def delete_api_key(account: str, *, allow_plaintext_keyring: bool | None = None) -> bool:
    """Delete the API key of ``account`` from every usable keyring link that holds one.

    Returns False when none held it. Refused links (see ``store_api_key``) are never touched.
    """
    _check_account(account)
    doing = f"delete the API key of account {account!r}"
    deleted = False
    for link in _usable(doing, allow_plaintext_keyring):
        with _keyring_failures(doing, link):
            if link.get_password(KEYRING_SERVICE, account) is not None:
                link.delete_password(KEYRING_SERVICE, account)
                deleted = True
            accounts = _read_index(link)
            if account in accounts:
                _write_index(link, accounts - {account})
    return deleted


def stored_accounts(*, allow_plaintext_keyring: bool | None = None) -> list[str]:
    """The accounts whose API key payonce stored in the keyring, sorted. Never a secret.

    Read from payonce's index in every usable keyring link; a key stored by other means
    (``keyring set payonce ACCOUNT``) is used by clients but not listed.
    """
    doing = "list the accounts with a stored API key"
    accounts: set[str] = set()
    for link in _usable(doing, allow_plaintext_keyring):
        with _keyring_failures(doing, link):
            accounts |= _read_index(link)
    return sorted(accounts)


def keyring_candidates(
    account: str, *, allow_plaintext_keyring: bool | None = None
) -> Iterator[Candidate]:
    """The key of ``account``'s keyring entry, as a candidate to send one of its intents
    with (used only where its fingerprint is the intent's). A keyring that cannot be read
    (none on this host, locked, refused) yields none: the intent is then skipped, named, as
    for any key missing."""
    try:
        secret = _from_keyring(account, allow_plaintext_keyring)
    except ConfigurationError:
        return
    yield Candidate(secret, f"the keyring entry {account!r}")
