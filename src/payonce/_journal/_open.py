"""Opening a journal (from an instance, a path, a ``postgresql://`` URL, or the default
place), and the private writers a client or an inbox builds on its engine."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigurationError
from ._inbox import Inbox
from ._reads import Journal
from ._sql import is_postgres_url
from ._sqlite import SQLiteJournal
from ._store import IntentStore

if TYPE_CHECKING:
    from ._postgres import PostgresJournal

__all__ = [
    "JOURNAL_ENV",
    "default_journal_path",
    "inbox_of",
    "journal_clock",
    "open_journal",
    "open_to_write",
    "postgres_journal_class",
    "refuse_conninfo",
    "store_of",
]

JOURNAL_ENV = "PAYONCE_JOURNAL"

_POSTGRES_EXTRA = (
    "a postgresql:// journal needs the postgres extra: pip install 'payonce[postgres]'"
)


# libpq's connection keywords (PostgreSQL 16's list): a journal argument that starts with
# one of them and "=" is a key=value connection string, never meant as a file name.
_LIBPQ_KEYWORDS = [
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "require_auth",
    "channel_binding",
    "connect_timeout",
    "client_encoding",
    "options",
    "application_name",
    "fallback_application_name",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "replication",
    "gssencmode",
    "sslmode",
    "sslnegotiation",
    "requiressl",
    "sslcompression",
    "sslcert",
    "sslkey",
    "sslcertmode",
    "sslpassword",
    "sslrootcert",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "requirepeer",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "service",
    "target_session_attrs",
    "load_balance_hosts",
]
_CONNINFO_PAIR = re.compile(r"(?:^|\s)(" + "|".join(_LIBPQ_KEYWORDS) + r")\s*=", re.IGNORECASE)


def refuse_conninfo(
    journal: object, where: str = "the journal given (journal=, --journal or $PAYONCE_JOURNAL)"
) -> None:
    """Refuse a libpq ``key=value`` connection string given as a journal.

    It would otherwise be taken for a file name and a SQLite journal created under it (its
    name holding the password). Only the keywords are named in the error, never a value.
    A file whose name really starts so is written ``./NAME``.
    """
    if not isinstance(journal, str | os.PathLike):
        return
    text = os.fspath(journal)
    if not isinstance(text, str) or not _CONNINFO_PAIR.match(text.lstrip()):
        return
    keywords = list(dict.fromkeys(m.group(1).lower() for m in _CONNINFO_PAIR.finditer(text)))
    raise ConfigurationError(
        f"{where} holds a libpq key=value connection string ({', '.join(keywords)}), which "
        "payonce would take for a file name: write it as a postgresql:// URL, e.g. "
        "postgresql://USER:PASSWORD@HOST:PORT/DBNAME (a password percent-encoded, or left "
        "to PGPASSWORD or ~/.pgpass). Nothing was opened or created. A file whose name "
        "really starts so: write it as ./NAME"
    )


def postgres_journal_class() -> type[PostgresJournal]:
    try:
        from ._postgres import PostgresJournal
    except ImportError as exc:
        raise ConfigurationError(f"{_POSTGRES_EXTRA} ({exc})") from None
    return PostgresJournal


def default_journal_path() -> Path:
    """``$PAYONCE_JOURNAL`` if set, else ``payonce/journal.db`` in the user data directory."""
    configured = os.environ.get(JOURNAL_ENV)
    if configured:
        refuse_conninfo(configured, f"${JOURNAL_ENV}")
        return Path(configured).expanduser()
    import platformdirs  # only when no journal was named: not on every import

    return Path(platformdirs.user_data_dir("payonce", appauthor=False)) / "journal.db"


def open_journal(
    journal: Journal | str | os.PathLike[str] | None = None,
    *,
    busy_timeout: float = 5.0,
    check_integrity: bool = True,
    read_only: bool = False,
) -> Journal:
    """A journal from an instance, a path, a ``postgresql://`` URL, or the default location.

    ``$PAYONCE_JOURNAL`` may hold a path or a URL. Only the default location's directory
    is created on demand: an explicit path whose directory is missing is far more likely a
    typo than a wish. ``check_integrity=False`` skips the check on open (SQLite's
    ``PRAGMA quick_check`` reads the whole file: 1.5 s at a million intents): for readers.

    ``read_only=True`` is for those who only look (monitoring, ``payonce intents list``):
    the journal must exist, and is never created, migrated or locked for writing; an older
    schema is read as it is. Its writes raise ``JournalError``.
    """
    if journal is not None and not isinstance(journal, str | os.PathLike):
        if not isinstance(journal, Journal):
            raise ConfigurationError(
                f"journal= takes a path, a postgresql:// URL or a payonce Journal, not "
                f"{type(journal).__name__}"
            )
        return journal
    refuse_conninfo(journal)
    refuse_conninfo(os.environ.get(JOURNAL_ENV) if journal is None else None, f"${JOURNAL_ENV}")
    if isinstance(journal, str) and "://" in journal and not is_postgres_url(journal):
        scheme = journal.split("://", 1)[0]
        raise ConfigurationError(
            f"unsupported journal URL scheme {scheme!r}: use a file path or postgresql://…"
        )
    if journal is None and is_postgres_url(os.environ.get(JOURNAL_ENV, "")):
        journal = os.environ[JOURNAL_ENV]
    if isinstance(journal, str) and is_postgres_url(journal):
        return postgres_journal_class()(
            journal,
            busy_timeout=busy_timeout,
            check_integrity=check_integrity,
            read_only=read_only,
        )
    if journal is None:
        from_env = bool(os.environ.get(JOURNAL_ENV))
        return SQLiteJournal(
            default_journal_path(),
            busy_timeout=busy_timeout,
            create_directories=not from_env,
            check_integrity=check_integrity,
            read_only=read_only,
        )
    return SQLiteJournal(
        journal, busy_timeout=busy_timeout, check_integrity=check_integrity, read_only=read_only
    )


def open_to_write(
    journal: Journal | str | os.PathLike[str] | None,
    *,
    busy_timeout: float = 5.0,
    check_integrity: bool = True,
) -> Journal:
    """``open_journal`` for those who write intents or events: a client, the webhook inbox.

    They build their writers (``IntentStore``, ``Inbox``) on the journal's engine. A
    journal opened with ``read_only=True`` is refused with ``ConfigurationError`` before
    anything is sent; an object that is not a payonce ``Journal`` is refused by
    ``open_journal``.
    """
    opened = open_journal(journal, busy_timeout=busy_timeout, check_integrity=check_integrity)
    if opened.read_only:
        # Only an object the caller gave can be read-only (a path never opens one so
        # here), so it is the caller's to close.
        raise ConfigurationError(
            "journal= was opened with read_only=True: a client writes intents to its journal, "
            "so give it a path, a URL or a journal opened for writing"
        )
    return opened


def journal_clock(journal: Journal, wall: Callable[[], float]) -> Callable[[], float]:
    """``wall`` (a client's clock, which tests move) read as the journal's clock: corrected
    by the offset of a PostgreSQL server's clock (``Engine.clock_offset``), so that every
    host sharing the journal dates leases and attempts, and judges them, by one clock."""
    engine = journal._engine

    def now() -> float:
        return wall() + engine.clock_offset

    return now


def store_of(journal: Journal) -> IntentStore:
    """The clients' writes to ``journal``, in the transactions of its engine."""
    return IntentStore(journal._engine)


def inbox_of(journal: Journal) -> Inbox:
    """The webhook inbox's writes to ``journal``, in the transactions of its engine."""
    return Inbox(journal._engine)
