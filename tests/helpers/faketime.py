"""libfaketime (Debian's ``faketime``): a child process whose wall clock is off.

The child gets libfaketime through ``LD_PRELOAD`` directly rather than through the
``faketime`` wrapper, so that a SIGKILL reaches the test as the child's own death (the
wrapper reports it as exit status 1). The library's path is the one the wrapper itself
sets. Its monotonic clock is left alone, as a real host's is when its wall clock is set.

Without ``faketime`` a test that needs it skips, saying so; under CI (``CI=true``) it
fails instead: ``make test`` installs the package there.
"""

from __future__ import annotations

import functools
import shutil
import subprocess

from helpers.ci import skip_or_fail

__all__ = ["libfaketime_env"]


@functools.cache
def _preload() -> str | None:
    wrapper = shutil.which("faketime")
    if wrapper is None:
        return None
    shown = subprocess.run(
        [wrapper, "-m", "-f", "+0", "sh", "-c", 'printf %s "$LD_PRELOAD"'],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return shown.stdout.strip() or None


def libfaketime_env(offset: str) -> dict[str, str]:
    """The environment settings that run a child with its wall clock ``offset`` from this
    host's (libfaketime's syntax: ``-25h``, ``+1y``), ticking from there."""
    preload = _preload()
    if preload is None:
        skip_or_fail(
            "libfaketime's faketime is not installed (Debian package faketime); `make test` "
            "installs it where it runs as root with apt"
        )
    return {"LD_PRELOAD": preload, "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
