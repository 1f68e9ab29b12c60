"""A real Secret Service for the keyring tests: GNOME Keyring on a private D-Bus session bus.

``SecretService.start`` runs ``dbus-daemon --session`` and ``gnome-keyring-daemon`` (its
``secrets`` component, its login keyring created and unlocked with a password given on
stdin), both as children of the test process, with a home and runtime directory of their
own under the session's temporary directory: nothing of the developer's desktop session is
used or touched. ``env`` is what a process needs to reach it (``DBUS_SESSION_BUS_ADDRESS``);
``close`` ends both daemons.

The daemons come from Debian's ``dbus`` and ``gnome-keyring`` packages, which ``make test``
installs when they are missing on a Debian host where it runs as root (CI). Anywhere else,
``unavailable`` says why they cannot run and the tests that need them skip; with ``CI=true``
they fail instead, so that CI can never pass without having run them.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jeepney.io.blocking import DBusConnection

KEYRING_PASSWORD = "payonce-tests"  # the login keyring's own password, only ever in /tmp
DAEMONS = ("dbus-daemon", "gnome-keyring-daemon")
INSTALL_HOW_TO = (
    "`make test` installs Debian's dbus and gnome-keyring when it runs as root on Debian; "
    "elsewhere install them (apt-get install dbus gnome-keyring) to run these tests"
)
_STARTUP_SECONDS = 15.0
_NAME = "org.freedesktop.secrets"
_LOGIN = "/org/freedesktop/secrets/collection/login"


def unavailable() -> str | None:
    """Why no Secret Service can be started on this host, or None when one can."""
    if not sys.platform.startswith("linux"):
        return f"the Secret Service (GNOME Keyring) is a Linux keyring; this is {sys.platform}"
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        return f"{' and '.join(missing)} not found: {INSTALL_HOW_TO}"
    try:
        import secretstorage  # noqa: F401  (keyring's own dependency on Linux)
    except ImportError as exc:
        return f"the secretstorage package cannot be imported ({exc})"
    return None


class SecretServiceError(RuntimeError):
    """The daemons did not come up; the message holds what they printed."""


class SecretService:
    """GNOME Keyring serving the Secret Service API on a D-Bus session bus of its own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.runtime = root / "run"
        self._logs = root / "logs"
        self._processes: list[subprocess.Popen[bytes]] = []
        self.address = ""

    @classmethod
    def start(cls, root: Path) -> SecretService:
        service = cls(root)
        try:
            service._start()
        except BaseException:
            service.close()
            raise
        return service

    # -- what a client needs --------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """The environment a process reaches this Secret Service with."""
        return {"DBUS_SESSION_BUS_ADDRESS": self.address}

    @property
    def data_dir(self) -> Path:
        """Where gnome-keyring keeps its keyring files (login.keyring)."""
        return self.home / ".local" / "share" / "keyrings"

    # -- looking at it directly, not through keyring or payonce ---------------------------------

    @contextlib.contextmanager
    def _connection(self) -> Iterator[DBusConnection]:
        """A D-Bus connection to this bus only, whatever this process's environment says."""
        from jeepney.io.blocking import open_dbus_connection

        connection = open_dbus_connection(self.address)
        try:
            yield connection
        finally:
            connection.close()

    def items(self, service: str = "payonce") -> dict[str, bytes]:
        """The secrets stored under ``service`` in the login collection, by username."""
        import secretstorage

        with self._connection() as connection:
            collection = secretstorage.Collection(connection, _LOGIN)
            found = collection.search_items({"service": service})
            return {item.get_attributes()["username"]: item.get_secret() for item in found}

    def is_locked(self) -> bool:
        import secretstorage

        with self._connection() as connection:
            return bool(secretstorage.Collection(connection, _LOGIN).is_locked())

    def clear(self, service: str = "payonce") -> None:
        """Delete every item stored under ``service`` (each test starts with none)."""
        import secretstorage

        with self._connection() as connection:
            collection = secretstorage.Collection(connection, _LOGIN)
            for item in collection.search_items({"service": service}):
                item.delete()

    def lock(self) -> None:
        """Lock the login collection, as the screen locker or a timeout does."""
        import secretstorage

        with self._connection() as connection:
            collection = secretstorage.Collection(connection, _LOGIN)
            collection.lock()
            assert collection.is_locked()

    def unlock(self) -> None:
        """Unlock the login collection with its password, without a prompt.

        The Secret Service API can only unlock through a prompt (there is no window to show
        one here); gnome-keyring's own interface takes the password, as its PAM module does.
        """
        import secretstorage
        from jeepney import DBusAddress, new_method_call
        from secretstorage.util import format_secret, open_session

        with self._connection() as connection:
            session = open_session(connection)
            secret = format_secret(session, KEYRING_PASSWORD.encode(), "text/plain")
            gnome_keyring = DBusAddress(
                "/org/freedesktop/secrets",
                bus_name="org.freedesktop.secrets",
                interface="org.gnome.keyring.InternalUnsupportedGuiltRiddenInterface",
            )
            call = new_method_call(
                gnome_keyring, "UnlockWithMasterPassword", "o(oayays)", (_LOGIN, secret)
            )
            connection.send_and_get_reply(call)
            assert not secretstorage.Collection(connection, _LOGIN).is_locked()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The login collection locked for the block, unlocked again after it."""
        self.lock()
        try:
            yield
        finally:
            self.unlock()

    # -- starting and stopping ------------------------------------------------------------------

    def _start(self) -> None:
        for directory in (self.home, self.runtime, self._logs):
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o700)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "XDG_RUNTIME_DIR": str(self.runtime),
            "XDG_DATA_HOME": str(self.home / ".local" / "share"),
            "XDG_CONFIG_HOME": str(self.home / ".config"),
            "LANG": "C.UTF-8",
        }
        bus = self._spawn(
            ["dbus-daemon", "--session", "--nofork", "--nopidfile", "--print-address=1"],
            env,
            stdout=subprocess.PIPE,
        )
        self.address = self._first_line(bus, "dbus-daemon")
        env["DBUS_SESSION_BUS_ADDRESS"] = self.address
        # --unlock: the password on stdin creates the login keyring (the default collection)
        # and unlocks it, as the PAM module does at a desktop login.
        keyring_daemon = self._spawn(
            ["gnome-keyring-daemon", "--foreground", "--unlock", "--components=secrets"],
            env,
            stdin=subprocess.PIPE,
        )
        assert keyring_daemon.stdin is not None
        keyring_daemon.stdin.write(KEYRING_PASSWORD.encode())
        keyring_daemon.stdin.close()
        self._wait_until_serving(keyring_daemon)

    def _spawn(
        self, command: list[str], env: dict[str, str], **streams: int
    ) -> subprocess.Popen[bytes]:
        log = (self._logs / f"{command[0]}.log").open("wb")
        with log:
            process = subprocess.Popen(
                command,
                env=env,
                stdin=streams.get("stdin", subprocess.DEVNULL),
                stdout=streams.get("stdout", log),
                stderr=log,
                start_new_session=True,  # no signal of the test runner's terminal reaches it
            )
        self._processes.append(process)
        return process

    def _first_line(self, process: subprocess.Popen[bytes], name: str) -> str:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], _STARTUP_SECONDS)
        line = process.stdout.readline().decode().strip() if ready else ""
        if not line:
            raise SecretServiceError(f"{name} printed no address: {self._printed()}")
        return line

    def _wait_until_serving(self, daemon: subprocess.Popen[bytes]) -> None:
        """Until ``daemon`` owns the Secret Service's name and its login collection is
        unlocked, or the startup time is up.

        The name is watched without calling the service: a call would have the bus start a
        gnome-keyring of its own (D-Bus activation) while ``daemon`` is still starting.
        """
        import secretstorage
        import secretstorage.exceptions
        from jeepney.bus_messages import message_bus

        deadline = time.monotonic() + _STARTUP_SECONDS
        problem = "it never took the name org.freedesktop.secrets"
        while time.monotonic() < deadline:
            for process in self._processes:
                if process.poll() is not None:
                    raise SecretServiceError(
                        f"{process.args[0]} exited with {process.returncode}: {self._printed()}"
                    )
            with self._connection() as connection:
                bus = message_bus
                (owned,) = connection.send_and_get_reply(bus.NameHasOwner(_NAME)).body
                if owned:
                    (pid,) = connection.send_and_get_reply(
                        bus.GetConnectionUnixProcessID(_NAME)
                    ).body
                    if pid != daemon.pid:
                        raise SecretServiceError(
                            f"the Secret Service on the bus is process {pid}, not the "
                            f"gnome-keyring-daemon started here ({daemon.pid})"
                        )
                    try:
                        if not secretstorage.Collection(connection, _LOGIN).is_locked():
                            return
                        problem = "the login collection is locked"
                    except secretstorage.exceptions.SecretStorageException as exc:
                        problem = f"{type(exc).__name__}: {exc}"
            time.sleep(0.02)
        raise SecretServiceError(
            f"gnome-keyring-daemon not serving after {_STARTUP_SECONDS:.0f} s ({problem}): "
            f"{self._printed()}"
        )

    def _printed(self) -> str:
        logs = sorted(self._logs.glob("*.log"))
        text = "; ".join(f"{log.name}: {log.read_text(errors='replace').strip()!r}" for log in logs)
        return text or "nothing"

    def close(self) -> None:
        """End the keyring daemon, then the bus; waits for both."""
        for process in reversed(self._processes):
            if process.poll() is None:
                process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
        self._processes.clear()
