"""Owners: who holds a lease, named so that another process can tell whether it died.

An owner is ``host:pid:process-start-time:random``, where host also names the boot and the
PID namespace (containers sharing a hostname do not share pids). An owner is provably dead
only when it ran on this host, in this boot and PID namespace, and its process is gone, is
a zombie, or its pid now belongs to a process started at another time. Owners elsewhere are
never judged: their leases run to expiry.

An owner of this very process is alive while its call runs; once the call has ended
(``owner_ended``) it never writes again, so its lease no longer keeps this process's next
call of the same intent waiting: a settle the journal could not write (a full disk) is
settled by calling again, as the error says, not after the lease has run out.

This is the operating system's side of leases (/proc, ``kill``, the host name, the fork
hook); what a lease allows is ``_lifecycle._leases``, which takes ``owner_is_dead`` as an
input. It sits beside ``_fork`` rather than in ``_runtime`` because the journal probes
liveness too, without a runtime above it: ``Journal.abandon`` of a journal an operator
opened refuses only a lease whose owner is alive.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import threading
from pathlib import Path

__all__ = ["new_owner", "owner_ended", "owner_is_dead"]


def _host_identity() -> str:
    parts = [socket.gethostname()]
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8])
    with contextlib.suppress(OSError):
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    return "/".join(parts).replace(":", "_")


_HOST = _host_identity()


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """The process's state letter and start time (clock ticks since boot), from Linux's
    /proc; None when there is no such process or no /proc to ask."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if len(fields) < 20:
        return None
    return fields[0], fields[19]


@functools.lru_cache(maxsize=1)
def _own_start_time(pid: int) -> str:
    found = _proc_stat(pid)
    return found[1] if found else ""


def new_owner() -> str:
    """A fresh owner name for one worker (one call of one process)."""
    pid = os.getpid()
    return f"{_HOST}:{pid}:{_own_start_time(pid)}:{os.urandom(6).hex()}"


_ENDED_KEPT = 4096
"""How many ended owners this process remembers. One forgotten is judged alive again, and
its lease runs to expiry, as before this was known: the safe side."""
_ended: dict[str, None] = {}
"""The owners of this process whose call has ended while (perhaps) still holding a lease,
oldest first."""
_ended_lock = threading.Lock()


def _forget_ended_in_child() -> None:
    # The parent's calls are not the child's, and a lock held by another thread at the
    # fork would never be released in the child.
    global _ended, _ended_lock
    _ended, _ended_lock = {}, threading.Lock()


os.register_at_fork(after_in_child=_forget_ended_in_child)


def owner_ended(owner: str) -> None:
    """The call ``owner`` names has ended (returned or raised): it will not renew, write or
    release its lease any more, so this process's next call may take it at once."""
    with _ended_lock:
        _ended[owner] = None
        if len(_ended) > _ENDED_KEPT:
            del _ended[next(iter(_ended))]


_PID_LIMIT = 2**31
"""Above any pid a POSIX kernel hands out (Linux's ceiling is 2**22)."""


def owner_is_dead(owner: str | None) -> bool:
    """Whether the owner's process is provably gone (see the module's docstring)."""
    if not owner:
        return False
    parts = owner.rsplit(":", 3)
    if len(parts) != 4 or parts[0] != _HOST or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if not 0 < pid < _PID_LIMIT:
        # Not a process id (a damaged or hand-edited row): nothing proves it gone. And
        # os.kill(0, …) would ask about this process's own group, a huge pid overflows.
        return False
    if pid == os.getpid():
        # A call of this very process: alive while it runs (another thread, another task).
        return owner in _ended
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it exists, under another user
    found = _proc_stat(pid)
    if found is None:
        return False  # no /proc to ask: only a missing pid proves anything
    state, started = found
    # A zombie has exited: it will never renew or release a lease again; it only waits
    # for its parent to collect its exit status.
    if state in ("Z", "X", "x"):
        return True
    return bool(parts[2]) and started != parts[2]
