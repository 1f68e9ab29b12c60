"""A throwaway PostgreSQL server for the tests, started and stopped by pytest itself.

``initdb`` into a private temporary directory, ``pg_ctl start`` listening on a free
loopback port (and a unix socket in that directory), ``fsync=on`` like production, and
``pg_ctl stop -m fast`` at the end. As root, the server binaries run as the ``postgres``
OS user (initdb refuses root). Tests connect as ``payonce``, an ordinary role with a
password, through TCP: what a service on another host does.

``PAYONCE_TEST_POSTGRES_URL=postgresql://admin:pw@host/db`` uses an existing server
instead (its role needs CREATEDB); ``PAYONCE_PG_BINDIR`` names the binaries' directory.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

__all__ = ["PostgresServer", "find_bindir", "postgres_server", "postgres_url"]

_NEEDED = ("initdb", "pg_ctl")
_START_ATTEMPTS = 3


def _version(bindir: str) -> tuple[int, ...]:
    match = re.search(r"/postgresql/([\d.]+)/bin", bindir)
    return tuple(int(p) for p in match.group(1).split(".")) if match else (0,)


def find_bindir() -> Path:
    """Where initdb and pg_ctl live; a clear error when PostgreSQL is not installed."""
    candidates: list[str] = []
    if configured := os.environ.get("PAYONCE_PG_BINDIR"):
        candidates.append(configured)
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version, reverse=True)
    candidates += [d for d in debian if _version(d)[:1] == (15,)] + debian
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        output = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, check=True, timeout=10
        )
        candidates.append(output.stdout.strip())
    if initdb := shutil.which("initdb"):
        candidates.append(str(Path(initdb).parent))
    for candidate in candidates:
        if all((Path(candidate) / tool).is_file() for tool in _NEEDED):
            return Path(candidate)
    raise RuntimeError(
        "the PostgreSQL journal tests need PostgreSQL's server binaries (initdb, pg_ctl), "
        f"found in none of {candidates or ['/usr/lib/postgresql/*/bin', 'pg_config --bindir']}. "
        "Install them (Debian/Ubuntu: apt-get install postgresql), set PAYONCE_PG_BINDIR to "
        "their directory, or set PAYONCE_TEST_POSTGRES_URL to a server to use instead"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    """One PostgreSQL cluster for the test session; a fresh database for each test."""

    user = "payonce"
    host = "127.0.0.1"

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.password = "pw-" + secrets.token_hex(12)
        self.port = 0
        self.started_in = 0.0
        as_root = os.geteuid() == 0
        self._run_as = ["runuser", "-u", "postgres", "--"] if as_root else []
        # Under /tmp, not pytest's tmp_path: the unix socket path must stay short, and the
        # postgres user must be able to reach it.
        self.directory = Path(tempfile.mkdtemp(prefix="payonce-pg-", dir="/tmp"))
        self.directory.chmod(0o700)
        if as_root:
            server_user = pwd.getpwnam("postgres")
            os.chown(self.directory, server_user.pw_uid, server_user.pw_gid)
        self.data = self.directory / "data"
        self.log = self.directory / "server.log"
        self._databases = 0

    def _tool(self, name: str, *args: str, timeout: float = 120) -> None:
        command = [*self._run_as, str(self.bindir / name), *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(
                f"{name} failed ({result.returncode}): {result.stderr.strip()}\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            text = self.log.read_text(errors="replace").splitlines()[-lines:]
            return "server log:\n" + "\n".join(text)
        return "(no server log)"

    def start(self) -> PostgresServer:
        began = time.monotonic()
        password_file = self.directory / "superuser-password"
        password_file.write_text(self.password + "\n")
        if self._run_as:
            shutil.chown(password_file, "postgres")
        self._tool(
            "initdb",
            "--pgdata",
            str(self.data),
            "--username=postgres",
            f"--pwfile={password_file}",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            "--locale=C",
            # initdb's own fsync of the template files only; the server runs fsync=on.
            "--no-sync",
        )
        password_file.unlink()
        for attempt in range(1, _START_ATTEMPTS + 1):
            self.port = _free_port()
            options = (
                f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.directory} "
                "-c fsync=on -c synchronous_commit=on -c max_connections=200"
            )
            try:
                self._tool(
                    "pg_ctl",
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.log),
                    "-o",
                    options,
                    "-w",
                    "-t",
                    "60",
                    "start",
                )
                break
            except RuntimeError:
                # Another process may have taken the free port in between: try another.
                if attempt == _START_ATTEMPTS:
                    raise
        self._wait_until_ready()
        with self.admin() as conn:
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN CREATEDB PASSWORD {}").format(
                    sql.Identifier(self.user), sql.Literal(self.password)
                )
            )
        self.started_in = time.monotonic() - began
        return self

    def restart(self) -> None:
        """Stop the server and start it again, same data, same port (its start time changes)."""
        self._tool(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-m",
            "fast",
            "-w",
            "-t",
            "60",
            "restart",
        )
        self._wait_until_ready()

    def _wait_until_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.admin():
                    return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"PostgreSQL never accepted connections ({exc})\n{self.log_tail()}"
                    ) from None
                time.sleep(0.05)

    def admin(self, dbname: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        """A superuser connection over the unix socket."""
        return psycopg.connect(
            host=str(self.directory),
            port=self.port,
            user="postgres",
            dbname=dbname,
            autocommit=True,
        )

    def url(
        self, dbname: str, *, user: str | None = None, password: str | None = None, **query: str
    ) -> str:
        """A URL as a service would be given: a role with a password, over TCP."""
        secret = urllib.parse.quote(password if password is not None else self.password, safe="")
        tail = f"?{urllib.parse.urlencode(query)}" if query else ""
        return f"postgresql://{user or self.user}:{secret}@{self.host}:{self.port}/{dbname}{tail}"

    def create_database(self) -> str:
        self._databases += 1
        name = f"journal_{os.getpid()}_{self._databases}"
        with self.admin() as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(name), sql.Identifier(self.user)
                )
            )
        return name

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._tool("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


class ExternalServer(PostgresServer):
    """A server someone else runs (PAYONCE_TEST_POSTGRES_URL): databases come and go on it,
    and the tests connect as the role of that URL."""

    def __init__(self, admin_url: str) -> None:  # no temporary directory, no initdb
        self._admin_url = admin_url
        parts = psycopg.conninfo.conninfo_to_dict(admin_url)
        self.user = str(parts.get("user") or os.environ.get("USER", "postgres"))
        self.password = str(parts.get("password") or "")
        self.host = str(parts.get("host") or "127.0.0.1")
        self.port = int(str(parts.get("port") or 5432))
        self._databases = 0
        self.started_in = 0.0
        self.directory = None  # no unix socket of ours

    def admin(self, dbname: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self._admin_url, dbname=dbname, autocommit=True)

    def stop(self) -> None:
        pass


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """The session's PostgreSQL server, started on first use and stopped at the end."""
    if external := os.environ.get("PAYONCE_TEST_POSTGRES_URL"):
        yield ExternalServer(external)
        return
    problem = None
    try:
        server = PostgresServer(find_bindir())
    except RuntimeError as exc:
        problem = str(exc)
    else:
        try:
            server.start()
        except (RuntimeError, OSError, subprocess.SubprocessError, psycopg.Error) as exc:
            server.stop()
            problem = f"could not start the test PostgreSQL server: {exc}"
    if problem is not None:
        pytest.fail(problem, pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A URL (with password) to a fresh, empty database of the test's own."""
    name = postgres_server.create_database()
    yield postgres_server.url(name)
    postgres_server.drop_database(name)
