"""Owners and their liveness, against the real operating system: processes that exit, are
reaped or linger as zombies, calls of this process that end, a fork."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from payonce import _owners
from payonce._lifecycle import lease_blocks
from payonce._owners import new_owner, owner_ended, owner_is_dead


def test_a_live_lease_of_another_call_of_this_process_blocks() -> None:
    other = new_owner()  # this very process: alive
    assert lease_blocks(other, 110.0, owner=new_owner(), now=100.0, is_stale=owner_is_dead)


def test_an_owner_on_another_host_is_never_judged_dead() -> None:
    assert not owner_is_dead("elsewhere/abcd/123:1:1:deadbeef")
    assert not owner_is_dead(None)
    assert not owner_is_dead("garbage")


def _owner_of(pid: int) -> str:
    host = new_owner().rsplit(":", 3)[0]
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return f"{host}:{pid}:{stat[19]}:0123456789ab"


def test_an_owner_whose_process_exited_and_was_reaped_is_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    owner = _owner_of(child.pid)
    assert not owner_is_dead(owner)
    child.kill()
    child.wait()
    assert owner_is_dead(owner)


def test_a_zombie_process_is_dead() -> None:
    # A child that has exited but that its parent has not waited for yet keeps its pid:
    # it will never renew or release a lease again.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    owner = _owner_of(child.pid)
    try:
        assert not owner_is_dead(owner)
        os.kill(child.pid, 9)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child never became a zombie"
            time.sleep(0.01)
        assert owner_is_dead(owner)
    finally:
        child.kill()
        child.wait()


def test_a_call_of_this_process_holds_its_lease_until_it_has_ended() -> None:
    ended, running = new_owner(), new_owner()
    owner_ended(ended)
    assert owner_is_dead(ended), "it will never renew nor release its lease"
    assert not lease_blocks(ended, 110.0, owner=new_owner(), now=100.0, is_stale=owner_is_dead)
    assert not owner_is_dead(running), "another thread's call, still running"
    assert lease_blocks(running, 110.0, owner=new_owner(), now=100.0, is_stale=owner_is_dead)


def test_only_the_latest_ended_calls_are_remembered_and_a_forgotten_one_waits_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_owners, "_ended", {})
    monkeypatch.setattr(_owners, "_ENDED_KEPT", 2)
    first, second, third = new_owner(), new_owner(), new_owner()
    for owner in (first, second, third):
        owner_ended(owner)
    assert not owner_is_dead(first), "forgotten: alive again, its lease runs to expiry"
    assert owner_is_dead(second)
    assert owner_is_dead(third)


def test_a_forked_child_starts_with_no_ended_calls_and_a_free_lock() -> None:
    """Forked while another thread registers an ended call (the lock held): the child must
    neither inherit the parent's calls nor wait forever for the lock."""
    parent_call = new_owner()
    owner_ended(parent_call)
    with _owners._ended_lock:
        pid = os.fork()
        if pid == 0:  # the child: judge, register, and say how it went
            child_call = new_owner()
            owner_ended(child_call)
            fine = owner_is_dead(child_call) and list(_owners._ended) == [child_call]
            os._exit(0 if fine else 1)
    deadline = time.monotonic() + 20
    while (waited := os.waitpid(pid, os.WNOHANG)) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the child waited for the lock its parent's thread held at the fork")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(waited[1]) == 0


@pytest.mark.parametrize("pid", ["0", "99999999999999999999"])
def test_an_owner_whose_pid_no_process_can_have_is_not_judged_dead_and_raises_nothing(
    pid: str,
) -> None:
    # A damaged or hand-edited lease: nothing proves its owner gone, and asking must not
    # raise (pid 0 would ask about this process's own group; a huge one overflows).
    host = new_owner().rsplit(":", 3)[0]
    assert not owner_is_dead(f"{host}:{pid}:1:deadbeef")
