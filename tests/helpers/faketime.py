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
import glob
import shutil
import subprocess

from helpers.ci import skip_or_fail

__all__ = ["libfaketime_env"]


# Where Debian's package (and a make install) puts the multi-threaded library that
# ``faketime -m`` preloads.
_LIBRARY_GLOBS = (
    "/usr/lib/*/faketime/libfaketimeMT.so.1",
    "/usr/lib/faketime/libfaketimeMT.so.1",
    "/usr/local/lib/faketime/libfaketimeMT.so.1",
)


@functools.cache
def _preload() -> str | None:
    if shutil.which("faketime") is None:
        return None
    for pattern in _LIBRARY_GLOBS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    # Elsewhere, the path the wrapper itself sets. The wrapper sets up shared memory first,
    # and that has been seen to fail once under a busy parallel run: try it again then.
    for attempt in range(3):
        shown = subprocess.run(
            ["faketime", "-m", "-f", "+0", "sh", "-c", 'printf %s "$LD_PRELOAD"'],
            capture_output=True,
            text=True,
            timeout=30,
            check=attempt == 2,
        )
        if shown.returncode == 0:
            return shown.stdout.strip() or None
    return None


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
