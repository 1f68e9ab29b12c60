"""Child Python processes: payonce imported from this checkout, nothing of the developer's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
EXAMPLES = ROOT / "examples"


def python_env(**settings: str) -> dict[str, str]:
    """This process's environment (isolated by conftest) with src first on PYTHONPATH."""
    env = dict(os.environ)
    # Works before installation too: src first, then whatever the caller had.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    env.update(settings)
    return env


def deployed_env(home: Path, **settings: str) -> dict[str, str]:
    """The environment of a program as a user deploys it: a home of its own, only the
    PAYONCE_* settings given here, and warnings as errors."""
    home.mkdir(exist_ok=True)
    env = {key: value for key, value in python_env().items() if not key.startswith("PAYONCE_")}
    env.update(
        # Nothing may reach the developer's home, journal or keyring.
        HOME=str(home),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        XDG_CONFIG_HOME=str(home / ".config"),
        PYTHONWARNINGS="error",
        **settings,
    )
    return env


def run_example(
    name: str, *args: str, cwd: Path, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``examples/<name>`` to its end, its output captured."""
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def mypy_strict(script: Path) -> subprocess.CompletedProcess[str]:
    """``mypy --strict`` on a user's script, as their type checker would see payonce."""
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(script)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )


def python_output(script: str) -> str:
    """What a short Python script run in a fresh interpreter prints (it must not fail)."""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout
