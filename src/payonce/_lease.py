"""Who holds a lease, and whether that worker is provably dead.

An owner is ``host:pid:process-start-time:random``. A lease normally ends when it expires;
but a process restarted on the same host after a crash should not wait out the lease of
its own dead predecessor. When the owner ran on this host and its process is gone (or its
pid now belongs to a process started at another time), the lease may be broken at once.
Owners on other hosts are never judged: their leases run to expiry.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import uuid
from pathlib import Path

__all__ = ["new_owner", "owner_is_dead"]


def _host_identity() -> str:
    """The hostname, plus what makes two pids comparable: the same boot and the same PID
    namespace. Containers sharing the host's network share its hostname, not its pids."""
    parts = [socket.gethostname()]
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8])
    with contextlib.suppress(OSError):
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    return "/".join(parts).replace(":", "_")


_HOST = _host_identity()


@functools.lru_cache(maxsize=64)
def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), or "" when unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def new_owner() -> str:
    pid = os.getpid()
    return f"{_HOST}:{pid}:{_start_time(pid)}:{uuid.uuid4().hex[:12]}"


def owner_is_dead(owner: str | None) -> bool:
    if not owner:
        return False
    parts = owner.rsplit(":", 3)
    if len(parts) != 4 or parts[0] != _HOST or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if pid == os.getpid():
        return False  # another thread of this very process: alive
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it exists, under another user
    _start_time.cache_clear()
    started = parts[2]
    return bool(started) and _start_time(pid) not in ("", started)
