"""What ``import payonce`` costs next to ``import httpx``, each in a fresh interpreter.

Rounds alternate the two imports (which goes first rotates), each measured with
``python -X importtime`` (the cumulative microseconds of the top-level module). Printed:
the median of each, the median of the per-round ratios, and the heavy modules that
``import payonce`` leaves out. ``import httpx`` here includes httpx's own command line
(click, rich, pygments), which payonce's import defers (``payonce._lean_import``); the
third row shows httpx without it for reference.

    PYTHONPATH=src .venv/bin/python bench/import_time.py            # 15 rounds
    PYTHONPATH=src .venv/bin/python bench/import_time.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from _harness import header, median, ratio, table

IMPORTS = {
    "import httpx": "import httpx",
    "import payonce": "import payonce",
    # httpx without its CLI, as payonce imports it: the floor payonce's import stands on.
    "import httpx (CLI deferred)": (
        "import sys, types; sys.modules['httpx._main'] = types.ModuleType('httpx._main')"
        "; sys.modules['httpx._main'].main = lambda: None; import httpx"
    ),
}
LEFT_OUT = ("click", "rich", "pygments", "ulid", "platformdirs", "psycopg", "starlette")


# As installed: with bytecode caches, which PYTHONDONTWRITEBYTECODE would leave out for
# payonce's sources only (site-packages were compiled by pip), timing the compiler instead.
_ENV = {
    **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
    "PYTHONPATH": os.pathsep.join(sys.path),
}


def _microseconds(statement: str) -> int:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement],
        capture_output=True,
        text=True,
        check=True,
        env=_ENV,
    )
    last = done.stderr.strip().splitlines()[-1]
    return int(last.split("|")[1])


def _left_out() -> list[str]:
    probe = f"import sys, payonce; print(*[m for m in {LEFT_OUT!r} if m in sys.modules])"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=_ENV
    )
    loaded = set(done.stdout.split())
    return [module for module in LEFT_OUT if module not in loaded]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    header("import time")

    names = list(IMPORTS)
    times: dict[str, list[float]] = {name: [] for name in names}
    ratios: list[float] = []
    for statement in IMPORTS.values():
        _microseconds(statement)  # untimed: writes the bytecode caches
    for round_ in range(args.rounds):
        order = names[round_ % len(names) :] + names[: round_ % len(names)]
        measured = {name: _microseconds(IMPORTS[name]) / 1000 for name in order}
        for name, value in measured.items():
            times[name].append(value)
        ratios.append(measured["import payonce"] / measured["import httpx"])

    rows = [[name, f"{median(times[name]):.1f}"] for name in names]
    table(f"median of {args.rounds} rounds", ["import", "ms"], rows)
    print(f"import payonce / import httpx: {ratio(median(ratios))} (median of per-round ratios)")
    print(f"left out of import payonce: {', '.join(_left_out())}")


if __name__ == "__main__":
    main()
