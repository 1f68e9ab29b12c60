"""Fork safety: what a process inherits from its parent is never used, nor closed, by it.

A client created before ``os.fork()`` (gunicorn ``--preload``, a master process that
resumed at start-up) hands its children the parent's pooled HTTP connections, SQLite
connection, PostgreSQL pool, locks and lease-keeper thread. Used from two processes, a
keep-alive socket delivers one process's answer to the other, which would then journal
another payment's answer as its own. So every payonce object that holds such things
remembers the pid that opened them and, on its first use in another process, opens its
own. The inherited ones are kept referenced and never closed in the child: closing them
there would end the parent's connections too (a TLS close_notify, a PostgreSQL Terminate,
an SQLite checkpoint on close).
"""

from __future__ import annotations

import os

__all__ = ["ForkGuard"]

_INHERITED: list[object] = []
"""What children inherited and must neither use nor close; kept alive so that no finaliser
closes it either."""


class ForkGuard:
    """Tells an object whether it runs in the process that opened its resources."""

    __slots__ = ("_pid",)

    def __init__(self) -> None:
        self._pid = os.getpid()

    def forked(self, *inherited: object) -> bool:
        """True, once, in a child process: the caller must open its own resources now.
        ``inherited`` is kept referenced for the life of the child, never closed."""
        pid = os.getpid()
        if pid == self._pid:
            return False
        self._pid = pid
        _INHERITED.extend(inherited)
        return True
