"""Where payonce's µs per intent go: each phase of a one-shot intent timed in context.

The same setting as ``bench/overhead.py`` (httpx's MockTransport answering 201, the journal
on tmpfs), with the parts of one intent wrapped by timers as instance attributes (``src/``
untouched). CPU time (``time.process_time_ns``, all threads). Each part is timed inside
whole intents, not alone in a loop: alone, a step runs with warm caches and looks 2-6x
cheaper than it costs in a real call.

    journal        the store's claim (write-ahead) and settle (with the acknowledgement)
    httpx          httpx.Client.build_request, and the exchange (send, deadline, read)
    payonce        the rest: drafting (canonical JSON, fingerprint, key), building the
                   request's URL and headers, classifying and storing the answer, and the
                   drive around them (owner, lease, attempt loop, operation)

Each part is cut per round, so the parts add up to the intent; the table shows each part's
median. The timers add about 20 clock reads per intent (``whole`` includes them; "plain
httpx.post" has none). ``--cprofile`` adds cProfile's own time per module (inflated by the
profiler on Python code: read the proportions). ``--async`` does the same for
``AsyncClient``, whose journal calls run on a journal thread: there "the rest" also holds
the loop↔thread hops.

    PYTHONPATH=src .venv/bin/python bench/overhead_profile.py [--async] [--cprofile]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import functools
import itertools
import pstats
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from _harness import ACCOUNT, API_KEY, PATH, PAYMENT, header, median, table
from overhead import BASE_URL, answer, scratch

import payonce
from payonce._runtime import _base

Spent = collections.Counter[str]

JOURNAL = ("journal: claim (write-ahead)", "journal: settle (+ acknowledgement)")
HTTPX = ("httpx: Client.build_request", "httpx: send + read (mock transport)")
OWN = {
    "told": "journal_command",
    "build_request": "build_request",
    "draft": "draft",
    "canonical": "canonical_request",
}


def timed(spent: Spent, label: str, function: Callable[..., Any]) -> Callable[..., Any]:
    clock = time.process_time_ns

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = clock()
        try:
            return function(*args, **kwargs)
        finally:
            spent[label] += clock() - began

    return wrapper


def atimed(spent: Spent, label: str, function: Callable[..., Any]) -> Callable[..., Any]:
    clock = time.process_time_ns

    @functools.wraps(function)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = clock()
        try:
            return await function(*args, **kwargs)
        finally:
            spent[label] += clock() - began

    return wrapper


def instrument(client: payonce.Client | payonce.AsyncClient, spent: Spent) -> None:
    core = client._core
    wrap = timed
    for obj, name, label in (
        (core.store, "claim", JOURNAL[0]),
        (core.store, "settle", JOURNAL[1]),
        (client._http, "build_request", HTTPX[0]),
        (core, "journal_command", OWN["told"]),
        (core, "build_request", OWN["build_request"]),
        (core.drafter, "draft", OWN["draft"]),
    ):
        setattr(obj, name, wrap(spent, label, getattr(obj, name)))
    exchange = atimed if isinstance(client, payonce.AsyncClient) else timed
    client._exchange = exchange(spent, HTTPX[1], client._exchange)  # type: ignore[method-assign]
    canonical = _base.canonical_request
    _base.canonical_request = timed(spent, OWN["canonical"], canonical)  # type: ignore[assignment]


def sync_round(directory: Path, count: int, tag: str) -> tuple[float, float, Spent]:
    spent: Spent = collections.Counter()
    numbers = itertools.count()
    with payonce.Client(
        base_url=BASE_URL,
        provider="sandbox",
        account=ACCOUNT,
        api_key=API_KEY,
        journal=directory / f"client-{tag}.db",
        transport=httpx.MockTransport(answer),
    ) as client:
        instrument(client, spent)
        for _ in range(200):
            client.post(PATH, json=PAYMENT, reference=f"{tag}-{next(numbers)}")
        spent.clear()
        began = time.process_time_ns()
        for _ in range(count):
            client.post(PATH, json=PAYMENT, reference=f"{tag}-{next(numbers)}")
        whole = time.process_time_ns() - began
    with httpx.Client(base_url=BASE_URL, transport=httpx.MockTransport(answer)) as http:
        for _ in range(200):
            http.post(PATH, json=PAYMENT)
        began = time.process_time_ns()
        for _ in range(count):
            http.post(PATH, json=PAYMENT)
        plain = time.process_time_ns() - began
    return whole / count / 1e3, plain / count / 1e3, spent


def async_round(directory: Path, count: int, tag: str) -> tuple[float, float, Spent]:
    spent: Spent = collections.Counter()

    async def run() -> tuple[float, float]:
        numbers = itertools.count()
        async with payonce.AsyncClient(
            base_url=BASE_URL,
            provider="sandbox",
            account=ACCOUNT,
            api_key=API_KEY,
            journal=directory / f"aclient-{tag}.db",
            transport=httpx.MockTransport(answer),
        ) as client:
            instrument(client, spent)
            for _ in range(200):
                await client.post(PATH, json=PAYMENT, reference=f"{tag}-{next(numbers)}")
            spent.clear()
            began = time.process_time_ns()
            for _ in range(count):
                await client.post(PATH, json=PAYMENT, reference=f"{tag}-{next(numbers)}")
            whole = time.process_time_ns() - began
        async with httpx.AsyncClient(
            base_url=BASE_URL, transport=httpx.MockTransport(answer)
        ) as http:
            for _ in range(200):
                await http.post(PATH, json=PAYMENT)
            began = time.process_time_ns()
            for _ in range(count):
                await http.post(PATH, json=PAYMENT)
            plain = time.process_time_ns() - began
        return whole / count / 1e3, plain / count / 1e3

    whole, plain = asyncio.run(run())
    return whole, plain, spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--intents", type=int, default=2000, help="per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--async", dest="flavour", action="store_const", const="async")
    parser.add_argument("--cprofile", action="store_true", help="cProfile's own time per module")
    args = parser.parse_args()
    flavour = args.flavour or "sync"
    measure = async_round if flavour == "async" else sync_round

    header(f"where payonce's µs per intent go ({flavour})")
    rounds = []
    with scratch() as name:
        for number in range(args.rounds):
            rounds.append(measure(Path(name), args.intents, f"r{number}"))
        if args.cprofile:
            profile = cProfile.Profile()
            profile.enable()
            measure(Path(name), args.intents, "profiled")
            profile.disable()

    rows = [[label, f"{value:.0f}", share] for label, value, share in partition(rounds, args)]
    table(
        f"CPU µs per intent, in context, median of {args.rounds} rounds of {args.intents}",
        ["", "µs", "share"],
        rows,
    )
    ratio = median([whole / plain for whole, plain, _ in rounds])
    print(f"payonce ÷ plain httpx: {ratio:.2f}x (median of the rounds' ratios)")
    if args.cprofile:
        by_module(profile)


Round = tuple[float, float, Spent]


def partition(rounds: list[Round], args: argparse.Namespace) -> list[tuple[str, float, str]]:
    """Each round's intent cut into parts that add up to it; the median of each part."""
    cuts: list[dict[str, float]] = []
    for whole, plain, spent in rounds:
        part = {label: ns / args.intents / 1e3 for label, ns in spent.items()}
        cut = {"whole intent (client.post)": whole}
        cut |= {label: part[label] for label in (*JOURNAL, *HTTPX)}
        cut["payonce: canonical_request"] = part[OWN["canonical"]]
        cut["payonce: draft (key, fingerprint)"] = part[OWN["draft"]]
        cut["payonce: build_request, less httpx's (URL, headers)"] = (
            part[OWN["build_request"]] - part[HTTPX[0]]
        )
        cut["payonce: journal commands, less the journal (store, tag, tell)"] = (
            part[OWN["told"]] - part[JOURNAL[0]] - part[JOURNAL[1]]
        )
        journal = part[JOURNAL[0]] + part[JOURNAL[1]]
        http = part[HTTPX[0]] + part[HTTPX[1]]
        own = whole - journal - http
        named = sum(value for label, value in cut.items() if label.startswith("payonce:"))
        cut["payonce: the rest (the drive and its executor, classify, lease, hops)"] = own - named
        cut["= the journal"] = journal
        cut["= httpx"] = http
        cut["= payonce's own"] = own
        cut["plain httpx.post, same round"] = plain
        cuts.append(cut)
    whole = median([cut["whole intent (client.post)"] for cut in cuts])
    return [
        (label, value := median([cut[label] for cut in cuts]), f"{value / whole:.0%}")
        for label in cuts[0]
    ]


def by_module(profile: cProfile.Profile) -> None:
    """cProfile's own time, summed per package (payonce per module)."""
    own: collections.Counter[str] = collections.Counter()
    stats: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    for (filename, _, name), (_, _, own_time, _, _) in stats.items():
        if "/payonce/" in filename:
            key = "payonce/" + filename.split("/payonce/")[1]
        elif "site-packages/" in filename:
            key = filename.split("site-packages/")[1].split("/")[0]
        elif filename == "~":
            key = name
        else:
            key = "stdlib " + filename.rsplit("/", 1)[-1]
        own[key] += own_time
    total = sum(own.values())
    rows = [[key, f"{seconds / total:.1%}"] for key, seconds in own.most_common(25)]
    table("cProfile own time, top 25", ["", "share"], rows)


if __name__ == "__main__":
    main()
