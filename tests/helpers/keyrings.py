"""Keyring backends that no auto-detection can pick up."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keyring.backend
import keyring.errors

UseKeyring = Callable[[Any], None]
"""The ``use_keyring`` fixture: sets the process's keyring backend for one test."""


class SessionKeyring(keyring.backend.KeyringBackend):
    """Stands in for an OS keyring (Secret Service, Keychain): none runs on this host."""

    priority = 5
    viable = False  # never auto-detected by keyring outside the tests that set it

    def __init__(self) -> None:
        super().__init__()
        self.entries: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.entries.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.entries[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        del self.entries[(service, username)]


class LockedKeyring(SessionKeyring):
    """An OS keyring whose collection is locked and whose unlock prompt was dismissed: every
    call raises ``KeyringLocked``, as keyring's SecretService backend does then."""

    def get_password(self, service: str, username: str) -> str | None:
        raise keyring.errors.KeyringLocked("Failed to unlock the collection!")

    def set_password(self, service: str, username: str, password: str) -> None:
        raise keyring.errors.KeyringLocked("Failed to unlock the collection!")

    def delete_password(self, service: str, username: str) -> None:
        raise keyring.errors.KeyringLocked("Failed to unlock the collection!")
