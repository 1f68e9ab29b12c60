"""localstripe (PyPI), a stateful fake Stripe server nobody on this team wrote, started for
the test session on a free loopback port."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from helpers.payments import free_port


@contextmanager
def running_localstripe() -> Iterator[str]:
    """localstripe's base URL while it runs."""
    port = free_port()
    command = shutil.which("localstripe", path=str(Path(sys.executable).parent))
    if command is None:
        raise RuntimeError(
            "localstripe is not installed: it is a dev dependency (pip install -e '.[dev]')"
        )
    # Its access log goes to a file: a pipe nobody drains would fill and stall the server.
    # --from-scratch: otherwise it loads what earlier runs left in /tmp/localstripe.pickle.
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            [command, "--port", str(port), "--from-scratch"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        try:
            _wait_until_listening(process, port, log)
            yield f"http://127.0.0.1:{port}"
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_until_listening(process: subprocess.Popen[bytes], port: int, log: IO[bytes]) -> None:
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"localstripe exited: {log.read()[-2000:].decode(errors='replace')}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline:
            raise RuntimeError("localstripe never started listening")
        time.sleep(0.05)
