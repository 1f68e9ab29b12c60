"""What each part of an intent costs in context, by taking it away: the bound of issue 10.

``bench/overhead_profile.py`` times each part inside whole intents; its timers cost clock
reads of their own and its parts add up to more than the whole. Here nothing is timed but
whole intents: each round runs the same intents once as they are and once with one part
replaced by its precomputed result, and the part's cost is what the intent loses without
it. Same setting as ``bench/overhead.py`` (httpx's MockTransport answering 201, the journal
on tmpfs), CPU time of all threads, interleaved rounds, medians.

    canonical      canonical_request (canonical JSON, query and form pairs, checks)
    journal        the store's writes (claim, attempts, settle): the SQL and the journal's Python
                   (replayed from a recording run: the intent is not journaled at all)
    httpx          httpx.Client.build_request and .send (a response built beforehand)
    hops (async)   the loop↔journal-thread round trips (the journal called on the loop)

    The parts' costs overlap: taking one away also makes the others cheaper (less code
    competes for the caches), so they add up to more than the whole. Hence two more rows:

    own, alone     payonce's own Python with the journal and httpx (and the hops) taken
                   away: drafting, key, fingerprint, lease, attempt loop, classifying and
                   storing the answer, the operation, with nothing else in the loop.

    floor          the design with no payonce Python at all: the same two transactions
                   (the same four statements and the synchronous switch) through raw
                   ``sqlite3`` around a plain ``httpx.post`` (async: the transactions on
                   a journal thread, one hop each). What any journal-before-send client
                   costs in this process; ``whole - floor`` is payonce's Python in context.

    PYTHONPATH=src .venv/bin/python bench/overhead_ablation.py [--async]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
from _harness import ACCOUNT, API_KEY, PATH, PAYMENT, header, median, table
from overhead import BASE_URL, BODY, TARGET_RATIO, answer, scratch

import payonce
from payonce._journal._sqlite import SQLiteJournal
from payonce._journal._store import IntentStore, _Planned
from payonce._runtime import _async, _base
from payonce._runtime._journal_threads import off_loop

PARTS = {
    "sync": ("canonical", "journal", "httpx"),
    "async": ("canonical", "journal", "httpx", "hops"),
}
BESIDES = {"sync": ("journal", "httpx"), "async": ("journal", "httpx", "hops")}
"""What is not payonce's own Python."""
Client = payonce.Client | payonce.AsyncClient


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--intents", type=int, default=2000, help="per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--async", dest="flavour", action="store_const", const="async")
    args = parser.parse_args()
    flavour = args.flavour or "sync"

    header(f"what each part of an intent costs in context, taken away ({flavour})")
    rounds: list[dict[str, float]] = []
    with scratch() as name:
        directory = Path(name)
        for number in range(args.rounds):
            rounds.append(one_round(directory, flavour, args.intents, f"r{number}"))
    typical = {label: median([r[label] for r in rounds]) for label in rounds[0]}
    whole = typical["whole"]
    rows = [["whole intent (client.post)", f"{whole:.0f}", "100%"]]
    for part in PARTS[flavour]:
        cost = median([r["whole"] - r[part] for r in rounds])
        rows.append([f"  {part}, taken away", f"{cost:.0f}", f"{cost / whole:.0%}"])
    floor, alone = typical["floor"], typical["alone"]
    rows.append(["floor: raw sqlite3 + plain httpx", f"{floor:.0f}", f"{floor / whole:.0%}"])
    rows.append(["payonce's Python in context (whole - floor)", f"{whole - floor:.0f}", ""])
    rows.append(
        [
            "payonce's own Python alone (" + ", ".join(BESIDES[flavour]) + " taken away)",
            f"{alone:.0f}",
            "",
        ]
    )
    rows.append(["plain httpx.post, same rounds", f"{typical['plain']:.0f}", ""])
    table(
        f"CPU µs per intent, median of {args.rounds} rounds of {args.intents}",
        ["", "µs", "share"],
        rows,
    )
    ratio = median([r["whole"] / r["plain"] for r in rounds])
    plain = typical["plain"]
    target = TARGET_RATIO[flavour]
    print(f"payonce ÷ plain httpx: {ratio:.2f}x (median of the rounds' ratios)")
    floor_ratio = median([r["floor"] / r["plain"] for r in rounds])
    print(
        f"floor ÷ plain httpx: {floor_ratio:.2f}x: at {target:g}x, all of payonce's Python "
        f"(journal's and own) would have {target * plain - floor:.0f} µs per intent; in "
        f"context it takes {whole - floor:.0f}"
    )


def one_round(directory: Path, flavour: str, count: int, tag: str) -> dict[str, float]:
    """Whole intents, then the same with each part taken away, then plain httpx."""
    measure = measure_async if flavour == "async" else measure_sync
    recording = measure(directory, count, f"{tag}-rec", record=True)
    result = {"whole": measure(directory, count, f"{tag}-whole").cpu}
    for part in PARTS[flavour]:
        with without([part], recording) as taken:
            result[part] = measure(directory, count, f"{tag}-{part}", taken=taken).cpu
    with without(BESIDES[flavour], recording) as taken:
        result["alone"] = measure(directory, count, f"{tag}-alone", taken=taken).cpu
    result["plain"] = plain_httpx(flavour, count)
    result["floor"] = raw_floor(directory, flavour, count, tag)
    return result


class Measured:
    def __init__(self) -> None:
        self.cpu = 0.0
        self.writes: dict[str, list[Any]] = {}
        """What each of the store's writes answered in the recording run, in order."""


Taker = Callable[[Client, int], None]
"""Takes a part away from a client that will make that many intents."""


@contextlib.contextmanager
def without(parts: Sequence[str], recording: Measured) -> Iterator[Taker]:
    """``parts`` replaced by their results, computed before the clock starts."""
    takers: list[Taker] = []
    with contextlib.ExitStack() as stack:
        for part in parts:
            if part == "canonical":
                stack.callback(setattr, _base, "canonical_request", _base.canonical_request)
                _base.canonical_request = always(PREPARED)  # type: ignore[assignment]
            elif part == "hops":
                stack.callback(setattr, _async, "off_loop", _async.off_loop)
                _async.off_loop = on_the_loop  # type: ignore[attr-defined]
            elif part == "journal":
                takers.append(lambda client, intents: replay_journal(client, recording))
            else:
                takers.append(take_httpx)

        def take(client: Client, intents: int) -> None:
            for taker in takers:
                taker(client, intents)

        yield take


PREPARED = _base.canonical_request("POST", PATH, json_body=PAYMENT)


def always(result: Any) -> Callable[..., Any]:
    return lambda *args, **kwargs: result


async def on_the_loop(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A journal call made on the event loop's thread: no hop."""
    return function(*args, **kwargs)


def planned_writes(store: IntentStore) -> list[str]:
    """The names of the store's writes: each is called, or planned, per intent."""
    return [name for name, value in vars(IntentStore).items() if isinstance(value, _Planned)]


class _Write:
    """One of the store's writes in place of the real one: ``write(...)`` and
    ``write.plan(...)`` as the store's own (``_store._Planned``)."""

    def __init__(self, plan: Callable[..., Any]) -> None:
        self.plan = plan

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _carried_out(self.plan(*args, **kwargs))


def _carried_out(plan: Any) -> Any:
    try:
        next(plan)
    except StopIteration as done:
        return done.value
    raise AssertionError("a replayed write plans no statement")


def replay_journal(client: Client, recording: Measured) -> None:
    """The journal's answers of the recording run, in order: the intent is not journaled."""
    store = client._core.store
    for name in planned_writes(store):
        answers = iter(recording.writes.get(name, ()))

        def replayed(*args: Any, answers: Iterator[Any] = answers, **kwargs: Any) -> Any:
            return next(answers)
            yield  # a plan of no statement

        setattr(store, name, _Write(replayed))


def take_httpx(client: Client, intents: int) -> None:
    """A request and a read response, built before the clock starts, for every attempt."""
    http = client._http
    request = http.build_request("POST", BASE_URL + PATH, content=BODY)
    responses = iter(
        [
            httpx.Response(
                201, content=BODY, headers={"content-type": "application/json"}, request=request
            )
            for _ in range(intents)
        ]
    )
    http.build_request = lambda *args, **kwargs: request  # type: ignore[method-assign]
    if isinstance(http, httpx.AsyncClient):

        async def send(*args: Any, **kwargs: Any) -> httpx.Response:
            return next(responses)

        http.send = send  # type: ignore[method-assign]
    else:
        http.send = lambda *args, **kwargs: next(responses)  # type: ignore[method-assign]


WARM_UP = 200


def client_options(directory: Path, tag: str) -> dict[str, Any]:
    return {
        "base_url": BASE_URL,
        "provider": "sandbox",
        "account": ACCOUNT,
        "api_key": API_KEY,
        "journal": directory / f"{tag}.db",
        "transport": httpx.MockTransport(answer),
    }


def recorder(client: Client, measured: Measured) -> None:
    """Keeps what each of the store's writes answers, for ``replay_journal``."""
    store = client._core.store
    for name in planned_writes(store):
        real = getattr(store, name)
        answers = measured.writes.setdefault(name, [])

        def recorded(
            *args: Any, real: Any = real, answers: list[Any] = answers, **kwargs: Any
        ) -> Any:
            answers.append(result := (yield from real.plan(*args, **kwargs)))
            return result

        setattr(store, name, _Write(recorded))


def measure_sync(
    directory: Path, count: int, tag: str, *, record: bool = False, taken: Taker | None = None
) -> Measured:
    measured = Measured()
    numbers = itertools.count()
    with payonce.Client(**client_options(directory, tag)) as client:
        if record:
            recorder(client, measured)
        if taken is not None:
            taken(client, WARM_UP + count)
        for _ in range(WARM_UP):
            client.post(PATH, json=PAYMENT, reference=f"{tag}-{next(numbers)}")
        began = time.process_time_ns()
        for _ in range(count):
            client.post(PATH, json=PAYMENT, reference=f"{tag}-{next(numbers)}")
        measured.cpu = (time.process_time_ns() - began) / count / 1e3
    return measured


def measure_async(
    directory: Path, count: int, tag: str, *, record: bool = False, taken: Taker | None = None
) -> Measured:
    measured = Measured()

    async def run() -> None:
        numbers = itertools.count()
        async with payonce.AsyncClient(**client_options(directory, tag)) as client:
            if record:
                recorder(client, measured)
            if taken is not None:
                taken(client, WARM_UP + count)
            for _ in range(WARM_UP):
                await client.post(PATH, json=PAYMENT, reference=f"{tag}-{next(numbers)}")
            began = time.process_time_ns()
            for _ in range(count):
                await client.post(PATH, json=PAYMENT, reference=f"{tag}-{next(numbers)}")
            measured.cpu = (time.process_time_ns() - began) / count / 1e3

    asyncio.run(run())
    return measured


def plain_httpx(flavour: str, count: int) -> float:
    if flavour == "sync":
        with httpx.Client(base_url=BASE_URL, transport=httpx.MockTransport(answer)) as http:
            for _ in range(WARM_UP):
                http.post(PATH, json=PAYMENT)
            began = time.process_time_ns()
            for _ in range(count):
                http.post(PATH, json=PAYMENT)
            return (time.process_time_ns() - began) / count / 1e3

    async def run() -> float:
        async with httpx.AsyncClient(
            base_url=BASE_URL, transport=httpx.MockTransport(answer)
        ) as http:
            for _ in range(WARM_UP):
                await http.post(PATH, json=PAYMENT)
            began = time.process_time_ns()
            for _ in range(count):
                await http.post(PATH, json=PAYMENT)
            return (time.process_time_ns() - began) / count / 1e3

    return asyncio.run(run())


WRITE_AHEAD = (
    "INSERT INTO intents (key, scope, reference, account, provider, method, url, fingerprint,"
    " request_headers, request_body, state, created_at, updated_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?)",
    "INSERT INTO attempts (key, number, started_at) VALUES (?, 1, ?)",
)
SETTLE = (
    "UPDATE intents SET response_status = ?, response_headers = ?, response_body = ?,"
    " state = 'succeeded', updated_at = ?, lease_owner = NULL, lease_expires_at = NULL"
    " WHERE key = ?",
    "UPDATE attempts SET ended_at = ?, status_code = ?, error = NULL, ambiguous = 0"
    " WHERE key = ? AND number = 1",
)


SCOPE = f"{ACCOUNT} POST {PATH}"
FINGERPRINT = "0" * 64
URL = BASE_URL + PATH


def raw_floor(directory: Path, flavour: str, count: int, tag: str) -> float:
    """Journal-before-send with nothing of payonce's: the same writes, raw, around httpx."""
    path = directory / f"{tag}-floor.db"
    SQLiteJournal(path).close()  # payonce's schema and indexes, then raw sqlite3 only
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    connection.execute("PRAGMA journal_mode = WAL")
    headers = '[["content-type", "application/json"]]'

    def write_ahead(key: str) -> None:
        now = time.time()
        connection.execute("PRAGMA synchronous = FULL")
        cursor = connection.cursor()
        cursor.execute("BEGIN IMMEDIATE")
        row = (key, SCOPE, key, ACCOUNT, "sandbox", "POST", URL, FINGERPRINT, headers, BODY)
        cursor.execute(WRITE_AHEAD[0], (*row, now, now))
        cursor.execute(WRITE_AHEAD[1], (key, now))
        cursor.execute("COMMIT")

    def settle(key: str, response: httpx.Response) -> None:
        now = time.time()
        connection.execute("PRAGMA synchronous = NORMAL")
        cursor = connection.cursor()
        cursor.execute("BEGIN IMMEDIATE")
        cursor.execute(SETTLE[0], (response.status_code, headers, response.content, now, key))
        cursor.execute(SETTLE[1], (now, response.status_code, key))
        cursor.execute("COMMIT")

    try:
        if flavour == "sync":
            with httpx.Client(base_url=BASE_URL, transport=httpx.MockTransport(answer)) as http:

                def intent(number: int) -> None:
                    key = f"{tag}-{number}"
                    write_ahead(key)
                    settle(key, http.post(PATH, json=PAYMENT))

                for number in range(WARM_UP):
                    intent(-number - 1)
                began = time.process_time_ns()
                for number in range(count):
                    intent(number)
                return (time.process_time_ns() - began) / count / 1e3

        async def run() -> float:
            async with httpx.AsyncClient(
                base_url=BASE_URL, transport=httpx.MockTransport(answer)
            ) as http:

                async def intent(number: int) -> None:
                    key = f"{tag}-{number}"
                    await off_loop(write_ahead, key)
                    await off_loop(settle, key, await http.post(PATH, json=PAYMENT))

                for number in range(WARM_UP):
                    await intent(-number - 1)
                began = time.process_time_ns()
                for number in range(count):
                    await intent(number)
                return (time.process_time_ns() - began) / count / 1e3

        return asyncio.run(run())
    finally:
        connection.close()


if __name__ == "__main__":
    main()
