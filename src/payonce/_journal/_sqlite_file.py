"""The SQLite journal's file on disk: made and checked before it is opened, and watched
while it is (removed or replaced under the process, on a read-only filesystem, changed
under a read-only reader). Everything here is about the path and the files beside it;
the connection is ``_sqlite``'s."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from ..errors import JournalError

__all__ = ["frozen", "identity", "prepare", "unwritable", "version", "wal"]

logger = logging.getLogger("payonce")

_SQLITE_MAGIC = b"SQLite format 3\x00"
_SIDES = ("-wal", "-shm")

Refuse = Callable[[str], JournalError]
"""The journal's error about its file, worded for it."""


def wal(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def _wal_holds_changes(path: Path) -> bool:
    with contextlib.suppress(OSError):
        return wal(path).stat().st_size > 0
    return False


def prepare(path: Path, refuse: Refuse, *, create: bool, directories: bool) -> None:
    """The journal file, checked (a regular file, this user's, an SQLite database) or, when
    ``create``, made with mode 0600 (its directory too, when ``directories``)."""
    directory = path.parent
    if not create and not path.exists():
        raise refuse("no journal at this path, and a read-only open never creates one")
    if not directory.is_dir():
        if not directories:
            raise refuse(
                f"the journal's directory {directory} does not exist; create it or "
                "point PAYONCE_JOURNAL / journal= at an existing directory"
            )
        directory.mkdir(parents=True, mode=0o700, exist_ok=True)
    if path.exists():
        if not path.is_file():
            raise refuse("the journal path exists but is not a regular file")
        _check_ownership(path, refuse, read_only=not create)
        try:
            with path.open("rb") as handle:
                head = handle.read(len(_SQLITE_MAGIC))
        except PermissionError:
            raise refuse(
                "the journal file cannot be read by this user (permission denied): run "
                "payonce as the user that owns it, or give the journal to this user"
            ) from None
        if head and head != _SQLITE_MAGIC:
            raise refuse(
                "this file is not a payonce journal (not an SQLite database); payonce "
                "will not overwrite it: move it away or choose another journal path"
            )
        return
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return  # another process created it first; it is validated on open
    except OSError as exc:
        raise refuse(f"cannot create the journal file: {exc}") from exc
    os.close(fd)


def _check_ownership(path: Path, refuse: Refuse, *, read_only: bool) -> None:
    """A journal is one user's: refuse another user's file, and close one that others
    may read (it holds request bodies and answers), e.g. after a restore with ``cp``."""
    info = path.stat()
    euid = os.geteuid()
    if info.st_uid != euid and euid != 0:
        raise refuse(
            f"the journal file belongs to another user (uid {info.st_uid}); payonce will "
            "not share it: run payonce as that user, or give it a journal of its own"
        )
    if info.st_uid != euid:
        return  # root operating another user's journal: its mode is that user's to keep
    for each in (path, *(path.with_name(path.name + side) for side in _SIDES)):
        with contextlib.suppress(FileNotFoundError):
            mode = each.stat().st_mode & 0o777
            if mode & 0o077 and read_only:
                logger.warning(
                    "the journal file %s is readable or writable by other users (mode "
                    "%o): it holds payment requests and answers. chmod 600 it (payonce "
                    "does when it opens the journal to write)",
                    each,
                    mode,
                )
            elif mode & 0o077:
                each.chmod(0o600)
                logger.warning(
                    "the journal file %s was readable or writable by other users (mode "
                    "%o); payonce set it to 0600: it holds payment requests and answers",
                    each,
                    mode,
                )


def identity(path: Path) -> tuple[int, int] | None:
    """The device and inode the path names now; None when nothing is there."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def version(path: Path) -> tuple[int, ...] | None:
    """Which file, changed when, how large; None when a WAL beside it holds changes (a
    restore with ``cp -p`` keeps the size and modification time, not the inode or the
    change time)."""
    if _wal_holds_changes(path):
        return None
    try:
        info = path.stat()
    except OSError:
        return None  # gone: not the file read as fixed
    return info.st_dev, info.st_ino, info.st_ctime_ns, info.st_mtime_ns, info.st_size


def frozen(path: Path) -> bool:
    """On a read-only filesystem, with no WAL left beside it: a file nothing changes."""
    with contextlib.suppress(OSError):
        read_only = bool(os.statvfs(path.parent).f_flag & os.ST_RDONLY)
        return read_only and not _wal_holds_changes(path)
    return False


def unwritable(path: Path) -> str | None:
    """Why this process cannot write the journal's file or directory, if it cannot."""
    directory = path.parent
    with contextlib.suppress(OSError):
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return f"{directory} is on a read-only filesystem"
    for each in (path, directory):
        if each.exists() and not os.access(each, os.W_OK):
            return f"{each} is not writable by this process (its owner and mode)"
    return None
