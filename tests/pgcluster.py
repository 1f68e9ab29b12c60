"""A PostgreSQL primary and its synchronous standby, for the failover tests: two servers on
loopback ports (and unix sockets in one private directory), the standby made by
``pg_basebackup -R`` and streaming, the primary waiting for it on every synchronous commit
(``synchronous_standby_names = '*'``).

``fail_over()`` is what an operator's (or Patroni's) failover does, at its harshest: the
primary's postmaster is SIGKILLed, the standby promoted with ``pg_ctl promote``, and a new
standby made from the new primary where the old one was (same port), so that the pair can
fail over again. The URL a service is given names both ports with
``target_session_attrs=read-write``: whichever is the primary is the one it writes to.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
from pathlib import Path

import psycopg
from psycopg import sql

from pgserver import _free_port

__all__ = ["Node", "ReplicatedPair"]


class Node:
    """One of the two servers: a data directory and a port that stay its own."""

    def __init__(self, pair: ReplicatedPair, name: str) -> None:
        self.pair = pair
        self.name = name
        self.data = pair.directory / name
        self.log = pair.directory / f"{name}.log"
        self.port = _free_port()

    def start(self) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.pair.directory} "
            "-c fsync=on -c synchronous_commit=on -c max_connections=100 "
            "-c wal_level=replica -c max_wal_senders=5 -c hot_standby=on "
            "-c shared_buffers=16MB"
        )
        self.pair.tool("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options,
                       "-w", "-t", "60", "start")  # fmt: skip

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().splitlines()[0])

    def connect(self, dbname: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(
            host=str(self.pair.directory),
            port=self.port,
            user="postgres",
            dbname=dbname,
            autocommit=True,
            connect_timeout=5,
        )

    def kill(self) -> None:
        """SIGKILL the postmaster, then its children (left alone, they end by themselves
        once they notice; killed, they free the port and shared memory at once)."""
        pid = self.postmaster_pid()
        os.kill(pid, signal.SIGKILL)
        children = subprocess.run(
            ["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False
        ).stdout.split()
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(child), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{c}").exists() for c in [str(pid), *children]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: processes survived SIGKILL")
            time.sleep(0.02)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError):
                self.pair.tool("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")


class ReplicatedPair:
    """A primary and a synchronous standby; ``primary`` and ``standby`` swap on failover."""

    user = "payonce"
    dbname = "payments"

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.password = "pw-" + secrets.token_hex(12)
        self._run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.directory = Path(tempfile.mkdtemp(prefix="payonce-ha-", dir="/tmp"))
        self.directory.chmod(0o700)
        if self._run_as:
            server_user = pwd.getpwnam("postgres")
            os.chown(self.directory, server_user.pw_uid, server_user.pw_gid)
        self.primary = Node(self, "a")
        self.standby = Node(self, "b")
        self.failovers = 0

    def tool(self, name: str, *args: str, timeout: float = 120) -> None:
        command = [*self._run_as, str(self.bindir / name), *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"{name} failed ({result.returncode}): {result.stderr.strip()}")

    @property
    def url(self) -> str:
        """What a service is given: both servers, and only a primary will do."""
        secret = urllib.parse.quote(self.password, safe="")
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in (self.primary, self.standby))
        return (
            f"postgresql://{self.user}:{secret}@{hosts}/{self.dbname}"
            "?target_session_attrs=read-write&connect_timeout=2"
        )

    def start(self) -> ReplicatedPair:
        password_file = self.directory / "superuser-password"
        password_file.write_text(self.password + "\n")
        if self._run_as:
            shutil.chown(password_file, "postgres")
        self.tool("initdb", "--pgdata", str(self.primary.data), "--username=postgres",
                  f"--pwfile={password_file}", "--auth-local=trust",
                  "--auth-host=scram-sha-256", "--encoding=UTF8", "--locale=C",
                  "--no-sync")  # fmt: skip
        password_file.unlink()
        self.primary.start()
        with self.primary.connect() as conn:
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(self.user), sql.Literal(self.password)
                )
            )
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(self.dbname), sql.Identifier(self.user)
                )
            )
        self._attach_standby()
        return self

    def _attach_standby(self) -> None:
        """A new standby of the primary where ``standby`` lives, then made synchronous."""
        shutil.rmtree(self.standby.data, ignore_errors=True)
        self.tool("pg_basebackup", "-D", str(self.standby.data), "-R", "-X", "stream",
                  "-c", "fast", "-h", str(self.directory), "-p", str(self.primary.port),
                  "-U", "postgres")  # fmt: skip
        # The copy carries the old primary's postgresql.auto.conf: a standby waits for none.
        self.standby.start()
        with self.primary.connect() as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            conn.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + 60
            while True:
                row = conn.execute(
                    "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'"
                ).fetchone()
                if row is not None and row[0] == "sync":
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError("the standby never became synchronous")
                time.sleep(0.05)

    def kill_primary_and_promote(self) -> None:
        """The primary's postmaster SIGKILLed, the standby promoted: it is the primary."""
        self.primary.kill()
        self.tool("pg_ctl", "-D", str(self.standby.data), "-w", "-t", "60", "promote")
        self.primary, self.standby = self.standby, self.primary
        self.failovers += 1
        with self.primary.connect() as conn:
            # Alone until a new standby is attached: commits must not wait for one.
            conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
            conn.execute("SELECT pg_reload_conf()")

    def rebuild_standby(self) -> None:
        """A new synchronous standby where the killed primary was."""
        self._attach_standby()

    def stop(self) -> None:
        for node in (self.primary, self.standby):
            node.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
