"""The one lease keeper, thread and task flavours: it renews while work runs, stops when
it holds nothing, and treats a lost lease the one documented way."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

import payonce
from payonce._lifecycle import _drive as drive
from payonce._lifecycle import canonical_request
from payonce._runtime._lease_keeper import Lease, ThreadLeaseKeeper
from payonce._runtime._lease_task import TaskLeaseKeeper

INTERVAL = 0.01


def _eventually(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(INTERVAL)


class Renewals:
    """A renew function that answers from a script, then 'still held'."""

    def __init__(self, *answers: bool | Exception) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        if self.answers:
            answer = self.answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer
        return True


def test_the_thread_keeper_renews_while_held_and_stops_when_idle() -> None:
    keeper = ThreadLeaseKeeper(INTERVAL)
    renew = Renewals()
    with keeper.holding(Lease("intent k1", renew)):
        _eventually(lambda: renew.calls >= 3, "three renewals")
    _eventually(
        lambda: not any(t.name == "payonce-lease-keeper" for t in threading.enumerate()),
        "the keeper's thread ends once it holds nothing",
    )
    calls = renew.calls
    time.sleep(5 * INTERVAL)
    assert renew.calls == calls, "a released lease is not renewed"
    keeper.close()


def test_a_lost_lease_is_logged_once_and_no_longer_renewed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    keeper = ThreadLeaseKeeper(INTERVAL)
    renew = Renewals(True, False)
    other = Renewals()
    with (
        keeper.holding(Lease("intent lost", renew)) as lease,
        keeper.holding(Lease("intent kept", other)),
    ):
        _eventually(lambda: lease.lost, "the lease is marked lost")
        _eventually(lambda: other.calls >= renew.calls + 3, "the other lease goes on")
    keeper.close()
    assert renew.calls == 2, "not renewed once it was lost"
    lost = [r for r in caplog.records if "lease lost" in r.getMessage()]
    assert [r.getMessage().split(":")[0] for r in lost] == ["intent lost"]


def test_a_renewal_the_journal_refused_is_tried_again(caplog: pytest.LogCaptureFixture) -> None:
    keeper = ThreadLeaseKeeper(INTERVAL)
    busy = payonce.JournalBusy("the journal stayed locked", location="j.db")
    renew = Renewals(busy, True)
    with keeper.holding(Lease("intent busy", renew)) as lease:
        _eventually(lambda: renew.calls >= 3, "renewed again after the failure")
        assert not lease.lost
    keeper.close()
    assert any("renewal failed, trying again" in r.getMessage() for r in caplog.records)


@pytest.mark.anyio
async def test_the_task_keeper_renews_off_the_loop_and_stops_when_idle() -> None:
    keeper = TaskLeaseKeeper(INTERVAL)
    loop_thread = threading.get_ident()
    threads: set[int] = set()

    def renew() -> bool:
        threads.add(threading.get_ident())
        return len(threads) < 100

    lease = Lease("intent async", renew)
    async with keeper.holding(lease):
        while len(threads) == 0 or keeper._task is None:
            await asyncio.sleep(INTERVAL)
        await asyncio.sleep(3 * INTERVAL)
    assert loop_thread not in threads, "a renewal writes the journal: never on the loop"
    task = keeper._task
    assert task is not None
    await asyncio.wait_for(task, timeout=10)  # it ends by itself once it holds nothing
    await keeper.aclose()


@pytest.mark.anyio
async def test_the_task_keeper_marks_a_lost_lease_and_stops_renewing_it() -> None:
    keeper = TaskLeaseKeeper(INTERVAL)
    renew = Renewals(False)
    async with keeper.holding(Lease("intent gone", renew)) as lease:
        while not lease.lost:
            await asyncio.sleep(INTERVAL)
        await asyncio.sleep(5 * INTERVAL)
    await keeper.aclose()
    assert renew.calls == 1


def test_a_lease_the_run_released_itself_is_not_reported_lost(
    make_client: Callable[..., payonce.Client], caplog: pytest.LogCaptureFixture
) -> None:
    # The keeper renews a snapshot of its leases: a settle may release one in between.
    client = make_client()
    core = client._core
    draft = core.drafter.draft(
        canonical_request("POST", "/v1/payments", json_body={"amount": 1, "currency": "eur"}),
        reference="order-released",
        key=None,
        key_supplied=False,
        headers=None,
    )
    commands = drive.call(core.settings, draft, "worker-1", acknowledge_on_success=False)
    claim = core.journal_command(next(commands))  # the write-ahead
    holding = commands.send(claim)
    assert isinstance(holding, drive.Holding)
    run = holding.run
    lease = core.lease(run)
    store = core.store
    store.release(run.key, owner="worker-1")  # what the run's settle does

    assert lease.renew(), "released by its own run: not lost"
    taken = store.claim_key(run.key, owner="worker-2", now=time.time(), lease_seconds=60)
    assert taken is not None
    assert taken.record.lease_owner == "worker-2"
    assert not lease.renew(), "another worker holds it now: lost"
    store.start_attempt(run.key, owner="worker-2", now=time.time(), lease_seconds=60)
    store.release(run.key, owner="worker-2")
    assert not lease.renew(), "another worker took it over and let it go since: lost"
