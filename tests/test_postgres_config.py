"""A PostgreSQL journal set up the way a new user might get it wrong: a libpq key=value
string instead of a URL, a password that is a common letter, a URL naming a standby."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest

import payonce
from helpers.cli import run_cli
from payonce._journal._postgres import PostgresJournal
from pgserver import PostgresServer

CONNINFO = "dbname=payments host=127.0.0.1 port=55431 user=payonce password=secret-pw"


def _files(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory, where a journal named by a relative path would go."""
    directory = tmp_path / "service"
    directory.mkdir()
    monkeypatch.chdir(directory)
    return directory


def test_a_libpq_key_value_string_is_refused_as_a_journal_and_nothing_is_created(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts: list[dict[str, Any]] = [
        {"journal": CONNINFO},
        {"journal": Path(CONNINFO)},
        {"journal": "  host=db.internal dbname=payments"},
    ]
    for options in attempts:
        with pytest.raises(payonce.ConfigurationError) as caught:
            payonce.Client(base_url="http://127.0.0.1:9", api_key="k", **options)
        message = str(caught.value)
        assert "libpq key=value connection string" in message, message
        assert "postgresql://" in message
        assert "secret-pw" not in message
    with pytest.raises(payonce.ConfigurationError, match="dbname, host, port, user, password"):
        payonce.open_journal(CONNINFO)

    monkeypatch.setenv("PAYONCE_JOURNAL", CONNINFO)
    with pytest.raises(payonce.ConfigurationError, match=r"\$PAYONCE_JOURNAL holds a libpq") as env:
        payonce.Client(base_url="http://127.0.0.1:9", api_key="k")
    assert "secret-pw" not in str(env.value)
    with pytest.raises(payonce.ConfigurationError, match=r"\$PAYONCE_JOURNAL holds a libpq"):
        payonce.journal.default_journal_path()

    done = run_cli(["intents", "list"], env={"PAYONCE_JOURNAL": CONNINFO})
    assert done.exit_code == 2, done.output
    assert "libpq key=value connection string" in done.output
    assert "secret-pw" not in done.output
    done = run_cli(
        ["resume", "--journal", CONNINFO, "--base-url", "http://127.0.0.1:9"],
        env={"PAYONCE_JOURNAL": ""},
    )
    assert done.exit_code == 2, done.output
    assert "write it as a postgresql:// URL" in " ".join(done.output.split())
    assert "secret-pw" not in done.output

    assert _files(here) == [], "no SQLite file was made of it"


def test_a_file_whose_name_starts_like_a_libpq_setting_opens_when_written_as_a_path(
    here: Path,
) -> None:
    with payonce.open_journal("./dbname=a.db") as journal:
        assert journal.list_intents() == []
    assert "dbname=a.db" in _files(here)


def test_a_one_letter_password_is_redacted_where_it_stands_not_wherever_the_letter_is(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    dbname = postgres_url.rsplit("/", 1)[1]
    with postgres_server.admin(dbname) as conn:
        conn.execute("CREATE ROLE other LOGIN PASSWORD 'o'")
        conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    url = postgres_server.url(dbname, user="other", password="o")

    with pytest.raises(payonce.JournalError) as caught:
        payonce.open_journal(url)

    message = str(caught.value)
    assert "permission denied for schema public" in message, message
    assert "***" not in message, message
    assert ":o@" not in message


def test_the_password_is_redacted_in_a_url_a_setting_and_a_quoted_value() -> None:
    from payonce._journal._postgres_url import Target

    target = Target("postgresql://u:p%40ss%2F@db/pay?sslmode=require")
    said = (
        "connecting to postgresql://u:p%40ss%2F@db/pay failed: password=p@ss/ sslpassword = "
        "'p@ss/' invalid value \"p%40ss%2F\", user u, ssl on"
    )
    assert target.redact(said) == (
        "connecting to postgresql://u:***@db/pay failed: password=*** sslpassword = "
        '*** invalid value "***", user u, ssl on'
    )


def _role(postgres_server: PostgresServer, dbname: str, *statements: str) -> None:
    with postgres_server.admin(dbname) as conn:
        for statement in statements:
            conn.execute(statement)


def test_a_read_only_server_is_said_to_be_a_standby_or_read_only_and_where_to_point_instead(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    """A standby in recovery answers every write as a read-only transaction would: so does a
    role whose transactions are read-only by default, which stands in for one here."""
    dbname = postgres_url.rsplit("/", 1)[1]
    _role(
        postgres_server,
        dbname,
        "CREATE ROLE reader LOGIN PASSWORD 'reader-pw'",
        "ALTER ROLE reader SET default_transaction_read_only = on",
    )

    with pytest.raises(payonce.JournalError) as caught:
        payonce.open_journal(postgres_server.url(dbname, user="reader", password="reader-pw"))

    message = str(caught.value)
    assert "the journal database is read-only" in message, message
    assert "a standby in recovery" in message
    assert "target_session_attrs=read-write" in message
    assert "nothing was sent" in message


def test_a_role_that_may_not_create_the_journal_s_schema_is_told_what_to_grant_or_create(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    dbname = postgres_url.rsplit("/", 1)[1]
    _role(postgres_server, dbname, "CREATE ROLE limited LOGIN PASSWORD 'limited-pw'")
    url = postgres_server.url(dbname, user="limited", password="limited-pw") + "?schema=payonce"

    with pytest.raises(payonce.JournalError) as caught:
        payonce.open_journal(url)

    message = str(caught.value)
    assert "permission denied for database" in message, message
    assert "grant the role CREATE ON DATABASE (to create the schema payonce)" in message
    assert "CREATE SCHEMA payonce AUTHORIZATION <role>" in message
    assert "(?schema=payonce)" not in message, "no advice to do what was done"

    _role(postgres_server, dbname, "CREATE SCHEMA payonce AUTHORIZATION limited")
    with payonce.open_journal(url) as journal:
        assert journal.list_intents() == []


def test_journal_check_of_a_database_server_does_not_speak_of_a_damaged_file(
    postgres_url: str, journal_path: Path
) -> None:
    from payonce.cli._report import report_lines
    from payonce.journal import JournalReport

    def intents_line(location: str) -> str:
        report = JournalReport(
            location=location,
            ok=False,
            problems=("the database server runs with fsync=off: committed intents can be lost",),
            schema_version=7,
            intents_by_state={"succeeded": 3},
            unacknowledged=0,
            size_bytes=0,
        )
        [line] = [line for line in report_lines(report) if line.startswith("intents\t")]
        return line

    assert (
        intents_line(postgres_url) == "intents\t3 (3 succeeded), as read despite the problems below"
    )
    assert (
        intents_line(str(journal_path)) == "intents\t3 (3 succeeded), as read from a damaged file"
    )


def _tcp_settings(journal: payonce.Journal) -> dict[str, int]:
    """What the kernel was told of a pooled journal connection's socket."""
    with (
        journal._engine._pool.connection() as conn,  # type: ignore[attr-defined]
        socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock,
    ):
        return {
            "keepalive": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            "idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            "interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            "count": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            "user_timeout_ms": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
        }


@pytest.mark.parametrize(
    ("query", "failover_timeout", "expected"),
    [
        ({}, 30.0, {"idle": 10, "interval": 3, "count": 3, "user_timeout_ms": 30000}),
        ({}, 90.0, {"idle": 30, "interval": 10, "count": 3, "user_timeout_ms": 90000}),
        ({}, 0.0, {"idle": 3, "interval": 1, "count": 3, "user_timeout_ms": 10000}),
        (
            {"keepalives_idle": "60", "tcp_user_timeout": "5000"},
            30.0,
            {"idle": 60, "interval": 3, "count": 3, "user_timeout_ms": 5000},
        ),
    ],
    ids=["default", "longer-failover", "no-reconnection", "the-url-wins"],
)
def test_a_connection_a_partition_freezes_ends_within_about_the_failover_timeout(
    postgres_server: PostgresServer,
    postgres_url: str,
    query: dict[str, str],
    failover_timeout: float,
    expected: dict[str, int],
) -> None:
    url = postgres_server.url(postgres_url.rsplit("/", 1)[1], **query)
    with PostgresJournal(url, failover_timeout=failover_timeout) as journal:
        assert _tcp_settings(journal) == {"keepalive": 1, **expected}


def test_keepalives_turned_off_in_the_url_stay_off(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    url = postgres_server.url(postgres_url.rsplit("/", 1)[1], keepalives="0")
    with PostgresJournal(url) as journal:
        assert _tcp_settings(journal)["keepalive"] == 0
