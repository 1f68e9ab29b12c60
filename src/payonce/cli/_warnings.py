"""The library's warnings, as the command's own ``warning: ...`` lines on stderr.

Without it, Python's last-resort handler prints a bare message, wrapped by nobody and
prefixed by nothing, between the command's ``error:`` lines. A program that configured
logging itself (a handler on the root or the ``payonce`` logger) keeps its own.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import click

__all__ = ["warnings_to_stderr"]


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
