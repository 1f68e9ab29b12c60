"""The library's warnings, as the command's own ``warning: ...`` lines on stderr.

Without it, Python's last-resort handler prints a bare message, wrapped by nobody and
prefixed by nothing, between the command's ``error:`` lines. A program that configured
logging itself (a handler on the root or the ``payonce`` logger) keeps its own.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

import click

__all__ = ["log_lines", "warnings_to_stderr"]


class _ToStderr(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            click.echo(f"{record.levelname.lower()}: {record.getMessage()}", err=True)
        except Exception:  # a log line never fails the command
            self.handleError(record)


@contextlib.contextmanager
def warnings_to_stderr() -> Iterator[None]:
    logger = logging.getLogger("payonce")
    if logger.handlers or logging.getLogger().handlers:
        yield
        return
    handler = _ToStderr(logging.WARNING)
    logger.addHandler(handler)
    # Not also to a root handler a command installs for its server (``payonce sandbox``).
    logger.propagate = False
    try:
        yield
    finally:
        logger.propagate = True
        logger.removeHandler(handler)


class _Lines(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))


@contextlib.contextmanager
def log_lines(level: int) -> Iterator[None]:
    """A long-running command's log: one timestamped line per record on stderr, payonce's
    at ``level`` and up, the worker's own pass lines (``payonce.worker``) from INFO. A
    program that configured logging itself keeps its own, as with ``warnings_to_stderr``."""
    logger = logging.getLogger("payonce")
    worker = logging.getLogger("payonce.worker")
    ours = [h for h in logger.handlers if isinstance(h, _ToStderr)]
    if len(ours) != len(logger.handlers) or (not ours and logging.getLogger().handlers):
        yield
        return
    for handler in ours:  # replaced by the timestamped lines, not doubled by them
        logger.removeHandler(handler)
    lines = logging.StreamHandler()
    lines.setFormatter(_Lines("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    levels, propagate = (logger.level, worker.level), logger.propagate
    logger.addHandler(lines)
    logger.setLevel(level)
    worker.setLevel(min(level, logging.INFO))
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(lines)
        logger.setLevel(levels[0])
        worker.setLevel(levels[1])
        logger.propagate = propagate
        for handler in ours:
            logger.addHandler(handler)
