"""The benchmarks that measure payonce against its own floor still run: a change of the
journal's or the executor's insides that breaks one fails here, not first in `make bench`.

Nothing is timed: each script runs a few intents and must print its ratio lines.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SRC = BENCH.parent / "src"


@pytest.mark.slow
@pytest.mark.parametrize("flavour", [[], ["--async"]], ids=["sync", "async"])
def test_overhead_ablation_runs_and_prints_payonce_against_its_floor(flavour: list[str]) -> None:
    environment = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "overhead_ablation.py", "--intents", "20", "--rounds", "1", *flavour],
        cwd=BENCH,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert "payonce ÷ plain httpx:" in done.stdout
    assert "floor ÷ plain httpx:" in done.stdout
    assert "journal, taken away" in done.stdout
