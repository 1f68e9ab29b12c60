"""Leases: who may send an intent (or run a webhook event's handler) right now.

One rule for intents and webhook events alike. A lease is held by an owner until it
expires; the holder renews it while its attempt (or handler) runs. Another worker may take
it when it is free, expired, its own, or held by an owner that is provably dead.

An owner is ``host:pid:process-start-time:random``, where host also names the boot and the
PID namespace (containers sharing a hostname do not share pids). An owner is provably dead
only when it ran on this host, in this boot and PID namespace, and its process is gone, is
a zombie, or its pid now belongs to a process started at another time. Owners elsewhere are
never judged: their leases run to expiry.

An owner of this very process is alive while its call runs; once the call has ended
(``owner_ended``) it never writes again, so its lease no longer keeps this process's next
call of the same intent waiting: a settle the journal could not write (a full disk) is
settled by calling again, as the error says, not after the lease has run out.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

from ._key_age import CLOCK_TOLERANCE

__all__ = ["lease_blocks", "lease_live", "new_owner", "owner_ended", "owner_is_dead"]


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


def owner_is_dead(owner: str | None) -> bool:
    """Whether the owner's process is provably gone (see the module's docstring)."""
    if not owner:
        return False
    parts = owner.rsplit(":", 3)
    if len(parts) != 4 or parts[0] != _HOST or not parts[1].isdigit():
        return False
    pid = int(parts[1])
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


def lease_live(lease_owner: str | None, lease_expires_at: float | None, now: float) -> bool:
    """Whether a lease is held and not yet expired."""
    return lease_owner is not None and lease_expires_at is not None and lease_expires_at > now


def lease_blocks(
    lease_owner: str | None,
    lease_expires_at: float | None,
    *,
    owner: str,
    now: float,
    is_stale: Callable[[str], bool] = owner_is_dead,
    lease_seconds: float | None = None,
) -> bool:
    """Whether the lease keeps ``owner`` from taking the intent or event now: it is live,
    held by someone else, and that holder is not provably dead.

    With ``lease_seconds`` (the asking worker's lease length), a lease that expires further
    ahead than any honest worker would write (twice that length, plus the clock tolerance)
    blocks no one: it was written by a broken clock or by hand, and a dead worker's
    year-long lease would otherwise hold the intent for a year.
    """
    if lease_owner is None or lease_owner == owner:
        return False
    if not lease_live(lease_owner, lease_expires_at, now):
        return False
    assert lease_expires_at is not None
    if lease_seconds is not None and lease_expires_at > now + 2 * lease_seconds + CLOCK_TOLERANCE:
        return False
    return not is_stale(lease_owner)
