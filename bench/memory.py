"""Peak RSS while one payonce.Client drives 100,000 intents: it must stay flat.

One client, one journal file, one intent per payment, every one acknowledged on leaving
its block, as a service would run for days. RSS (VmRSS) and peak RSS (VmHWM) are read
from /proc at 10k, 50k and 100k intents (and at every checkpoint of ``--every``).

The HTTP edge is httpx's in-memory MockTransport answering 201 by default: 100k requests
through the sandbox would take the better part of an hour here, and the memory under test
is payonce's, not the server's. ``--sandbox`` sends them to the sandbox (in a process of
its own) instead. The journal goes to ``--dir`` (default: a temporary directory on disk,
so every write-ahead record is really fsynced).

    PYTHONPATH=src .venv/bin/python bench/memory.py
    PYTHONPATH=src .venv/bin/python bench/memory.py --intents 20000 --sandbox
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from _harness import ACCOUNT, API_KEY, PATH, PAYMENT, header, sandbox_process, table, workdir

import payonce

BODY = b'{"id":"pay_1","amount":4200,"currency":"eur","status":"succeeded"}'
CHECKPOINTS = (10_000, 50_000, 100_000)


def answer(request: httpx.Request) -> httpx.Response:
    return httpx.Response(201, content=BODY, headers={"content-type": "application/json"})


def memory() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process, in bytes."""
    values = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                values[name] = int(rest.split()[0]) * 1024
    return values["VmRSS"], values["VmHWM"]


@contextlib.contextmanager
def base_url(
    directory: Path, use_sandbox: bool
) -> Iterator[tuple[str, httpx.BaseTransport | None]]:
    if use_sandbox:
        with sandbox_process(directory) as url:
            yield url, None
    else:
        yield "https://provider.test", httpx.MockTransport(answer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--intents", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=10_000, help="read RSS this often")
    parser.add_argument("--sandbox", action="store_true", help="send to the sandbox process")
    parser.add_argument("--dir", help="where the journal goes (default: a temp dir)")
    args = parser.parse_args()

    header(f"memory: peak RSS while one client drives {args.intents:,} intents")
    marks = sorted({*range(args.every, args.intents + 1, args.every), *CHECKPOINTS})
    marks = [m for m in marks if m <= args.intents]
    rows = []
    with contextlib.ExitStack() as stack:
        directory = stack.enter_context(workdir(args.dir))
        url, transport = stack.enter_context(base_url(directory, args.sandbox))
        client = stack.enter_context(
            payonce.Client(
                base_url=url,
                provider="sandbox",
                account=ACCOUNT,
                api_key=API_KEY,
                journal=directory / "journal.db",
                transport=transport,
            )
        )
        for number in range(200):  # warm up: imports, caches, the connection
            client.post(PATH, json=PAYMENT, reference=f"warm-{number}")
        gc.collect()
        start_rss, _ = memory()
        began = time.perf_counter()
        done = 0
        for mark in marks:
            while done < mark:
                with client.intent(f"order-{done:07d}") as op:
                    op.post(PATH, json=PAYMENT)
                done += 1
            rss, peak = memory()
            rows.append((mark, rss, peak, time.perf_counter() - began))
    mib = 1024 * 1024
    table(
        f"RSS after warm-up: {start_rss / mib:.1f} MiB "
        f"({'sandbox' if args.sandbox else 'in-memory transport'}, journal in "
        f"{args.dir or 'a temporary directory'})",
        ["intents", "RSS MiB", "peak RSS MiB", "growth since warm-up MiB", "intents/s"],
        [
            [
                f"{mark:,}",
                f"{rss / mib:.1f}",
                f"{peak / mib:.1f}",
                f"{(rss - start_rss) / mib:+.1f}",
                f"{mark / seconds:,.0f}",
            ]
            for mark, rss, peak, seconds in rows
        ],
    )
    first = next((r for r in rows if r[0] >= 10_000), rows[0])
    last = rows[-1]
    growth = (last[2] - first[2]) / mib
    per_intent = (last[2] - first[2]) / max(1, last[0] - first[0])
    verdict = "flat" if growth < 5 else "GROWS"
    print(
        f"peak RSS from {first[0]:,} to {last[0]:,} intents: {growth:+.1f} MiB "
        f"({per_intent:.1f} bytes per intent): {verdict}"
    )


if __name__ == "__main__":
    main()
