"""The examples run as a user would run them: a real interpreter, a real sandbox, exit 0."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import psycopg
import pytest

from helpers.cli import run_cli_process
from helpers.crash import KILLED
from helpers.processes import deployed_env, run_example
from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY, SandboxServer


def _run_example(name: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    journal = tmp_path / "example-journal.db"
    env = deployed_env(tmp_path / "example-home", PAYONCE_JOURNAL=str(journal))
    return run_example(name, cwd=tmp_path, env=env, timeout=60)


def test_the_checkout_example_charges_once_replays_and_handles_errors(tmp_path: Path) -> None:
    result = _run_example("checkout.py", tmp_path)

    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    out = result.stdout
    charged = re.search(r"order-1001: charged 42\.00 EUR as (pay_\w+) .*replayed=False", out)
    assert charged, out
    payment_id = charged.group(1)
    assert re.search(r"order-1002: .*attempts=2, .*provider_replayed=True", out), out
    assert (
        "order-1001 again: replayed=True, from the journal with no network call; "
        f"same payment {payment_id}"
    ) in out
    assert "order-1003: declined (ProviderError, HTTP 402, card_declined" in out
    assert "order-1003 again: the same refusal, replayed=True" in out
    assert "order-1004: OutcomeUnknown after 3 attempts" in out
    assert "order-1004 again: still OutcomeUnknown, and nothing was sent" in out
    assert f"after a restart, order-1001: replayed=True ({payment_id})" in out
    assert "the sandbox executed 3 payments for 4 orders, at most once per key: True" in out
    assert "Traceback" not in result.stderr
    # The example keeps its own journal: the one PAYONCE_JOURNAL points at stays unused.
    assert not (tmp_path / "example-journal.db").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["order_service_psycopg.py", "order_service_sqlalchemy.py"])
def test_the_order_service_examples_commit_orders_and_payments_together(
    name: str, tmp_path: Path, postgres_url: str
) -> None:
    env = deployed_env(tmp_path / "example-home", DATABASE_URL=postgres_url)
    result = run_example(name, cwd=tmp_path, env=env, timeout=60)

    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    out = result.stdout
    committed = re.search(r"order-1001: committed with payment (\w+) \(pending\)", out)
    assert committed, out
    key = committed.group(1)
    assert "order-1001 retried: same payment True" in out
    assert "order-1002: the handler failed after enqueuing: rolled back" in out
    assert "order-1002: payments journaled 0" in out
    assert "resumed order-1001: succeeded (HTTP 201)" in out
    assert "resumed again: 0 to send" in out
    assert "recorded order-1001: paid\n1 outcome(s) recorded" in out
    assert "the sandbox executed 1 payment(s) for 1 committed order" in out
    assert "Traceback" not in result.stderr
    # What the service's database holds: the order with its payment's key and its status,
    # paid once; no trace of the order whose handler failed; the outcome acknowledged.
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute(
            "SELECT id, amount, payment_key, status FROM public.orders"
        ).fetchall() == [("order-1001", 4200, key, "paid")]
        states = conn.execute("SELECT reference, state FROM payonce.intents").fetchall()
    assert states == [("order-1001", "succeeded")]
    assert _not_acknowledged(postgres_url) == []


@pytest.mark.slow
def test_the_second_order_service_on_the_same_database_says_the_order_was_paid_before(
    tmp_path: Path, postgres_url: str
) -> None:
    """Both order-service examples use order-1001: run one after the other on one database,
    the second finds it paid by the first and says so, rather than that its sandbox
    executed 0 payments for 1 committed order."""
    env = deployed_env(tmp_path / "example-home", DATABASE_URL=postgres_url)
    first = run_example("order_service_psycopg.py", cwd=tmp_path, env=env, timeout=60)
    assert first.returncode == 0, f"stdout:\n{first.stdout}\nstderr:\n{first.stderr}"
    key = re.search(r"order-1001: committed with payment (\w+) \(pending\)", first.stdout)
    assert key, first.stdout

    second = run_example("order_service_sqlalchemy.py", cwd=tmp_path, env=env, timeout=60)

    assert second.returncode == 0, f"stdout:\n{second.stdout}\nstderr:\n{second.stderr}"
    out = second.stdout
    assert f"order-1001: committed with payment {key.group(1)} (succeeded)" in out
    assert (
        f"order-1001 was paid by an earlier run on this database (payment {key.group(1)}, "
        "succeeded), so this run's sandbox executed 0 payment(s)"
    ) in out
    assert "for 1 committed order" not in out
    assert "0 outcome(s) recorded" in out  # the first run recorded and acknowledged it
    # Both wrote the one orders table, though the database role is named like the journal's
    # schema (payonce), which its search path ("$user", public) would find first.
    assert _statuses(postgres_url) == {"order-1001": "paid"}
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT to_regclass('payonce.orders')").fetchone() == (None,)


# -- deployed: the service enqueues, `payonce worker` sends, the service records outcomes ----

ORDERS = {"order-2001": 4200, "order-2002": 40200, "order-2003": 1500}
"""What the shop sells in these tests: the sandbox declines 402.00, pays the rest."""

STATUSES = {"order-2001": "paid", "order-2002": "declined", "order-2003": "paid"}


def _journal_url(postgres_url: str) -> str:
    return f"{postgres_url}{'&' if '?' in postgres_url else '?'}schema=payonce"


def _not_acknowledged(postgres_url: str) -> list[dict[str, object]]:
    """What `payonce ack --list` lists: settled outcomes nobody recorded."""
    listed = run_cli_process(
        ["ack", "--list", "--json"], env={"PAYONCE_JOURNAL": _journal_url(postgres_url)}
    )
    assert listed.exit_code == 0, listed.output
    found: list[dict[str, object]] = json.loads(listed.stdout)
    return found


def _service(
    name: str, tmp_path: Path, postgres_url: str, sandbox: SandboxServer, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """One command of the deployed service: no API key, the worker's account named."""
    service = {
        "DATABASE_URL": postgres_url,
        "PAYONCE_BASE_URL": sandbox.url,
        "PAYONCE_ACCOUNT": DEFAULT_ACCOUNT,
    }
    settings = deployed_env(tmp_path / "service-home", **{**service, **env})
    return run_example(name, *args, cwd=tmp_path, env=settings, timeout=60)


def _place_orders_and_run_the_worker(
    name: str, tmp_path: Path, postgres_url: str, sandbox: SandboxServer
) -> None:
    for order_id, amount in ORDERS.items():
        placed = _service(name, tmp_path, postgres_url, sandbox, "place", order_id, str(amount))
        assert placed.returncode == 0, f"stdout:\n{placed.stdout}\nstderr:\n{placed.stderr}"
        assert f"{order_id}: committed with payment" in placed.stdout
    worker = run_cli_process(
        ["worker", "--once"],
        env={
            "PAYONCE_JOURNAL": _journal_url(postgres_url),
            "PAYONCE_BASE_URL": sandbox.url,
            "PAYONCE_ACCOUNT": DEFAULT_ACCOUNT,
            "PAYONCE_API_KEY": DEFAULT_API_KEY,
        },
    )
    assert worker.exit_code == 0, worker.output
    # Sent and settled, and nobody has recorded them yet: the alert's count.
    assert len(_not_acknowledged(postgres_url)) == len(ORDERS)


def _statuses(postgres_url: str) -> dict[str, str | None]:
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute("SELECT id, status FROM public.orders").fetchall()
    return {order_id: status for order_id, status in rows}


def _each_executed_once(sandbox: SandboxServer) -> None:
    assert sandbox.wait_idle()
    assert sorted(sandbox.store.executions().values()) == [1] * len(ORDERS)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["order_service_psycopg.py", "order_service_sqlalchemy.py"])
def test_the_order_service_records_each_outcome_the_worker_settled_and_acknowledges_it(
    name: str, tmp_path: Path, postgres_url: str, sandbox: SandboxServer
) -> None:
    _place_orders_and_run_the_worker(name, tmp_path, postgres_url, sandbox)
    assert set(_statuses(postgres_url).values()) == {None}  # the service has not heard yet

    first = _service(name, tmp_path, postgres_url, sandbox, "record-outcomes")

    assert first.returncode == 0, f"stdout:\n{first.stdout}\nstderr:\n{first.stderr}"
    for order_id, status in STATUSES.items():
        assert f"recorded {order_id}: {status}\n" in first.stdout
    assert "3 outcome(s) recorded" in first.stdout
    assert _statuses(postgres_url) == STATUSES
    _each_executed_once(sandbox)
    assert _not_acknowledged(postgres_url) == []  # deploying's alert stays quiet
    again = _service(name, tmp_path, postgres_url, sandbox, "record-outcomes")
    assert again.returncode == 0, again.stderr
    assert again.stdout == "0 outcome(s) recorded\n"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["order_service_psycopg.py", "order_service_sqlalchemy.py"])
def test_the_order_service_refuses_an_order_without_a_whole_amount_and_keeps_the_others(
    name: str, tmp_path: Path, postgres_url: str, sandbox: SandboxServer
) -> None:
    placed = _service(name, tmp_path, postgres_url, sandbox, "place", "order-2001", "4200")
    assert placed.returncode == 0, placed.stderr

    refused = _service(name, tmp_path, postgres_url, sandbox, "place", "order-2002", "42.00")

    assert refused.returncode == 2, refused.stderr
    assert refused.stdout.startswith(f"usage: {name}")
    assert "Traceback" not in refused.stderr
    no_account = _service(
        name, tmp_path, postgres_url, sandbox, "place", "order-2003", "1500", PAYONCE_ACCOUNT=""
    )
    assert no_account.returncode == 2, no_account.stderr
    assert "set PAYONCE_BASE_URL to the provider and PAYONCE_ACCOUNT" in no_account.stdout
    assert "Traceback" not in no_account.stderr
    assert _statuses(postgres_url) == {"order-2001": None}
    with psycopg.connect(postgres_url) as conn:
        intents = conn.execute("SELECT reference, state FROM payonce.intents").fetchall()
    assert intents == [("order-2001", "pending")]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["order_service_psycopg.py", "order_service_sqlalchemy.py"])
def test_the_order_service_killed_between_recording_and_acknowledging_records_once(
    name: str, tmp_path: Path, postgres_url: str, sandbox: SandboxServer
) -> None:
    """SIGKILLed as it acknowledges the second outcome, whose status it has committed: the
    restarted pass lists that outcome again, finds it recorded, changes nothing, and goes
    on with the rest."""
    _place_orders_and_run_the_worker(name, tmp_path, postgres_url, sandbox)

    killed = _service(
        name,
        tmp_path,
        postgres_url,
        sandbox,
        "record-outcomes",
        PAYONCE_CRASH_AT="before_acknowledge:2",
    )

    assert killed.returncode == KILLED, f"stdout:\n{killed.stdout}\nstderr:\n{killed.stderr}"
    done = re.findall(r"^recorded (order-\d+): (\w+)$", killed.stdout, re.MULTILINE)
    assert len(done) == 2, killed.stdout  # the second recorded, then killed
    (acknowledged, _), (cut_off, cut_off_status) = done
    assert {o: s for o, s in _statuses(postgres_url).items() if s} == dict(done)
    left = {entry["reference"] for entry in _not_acknowledged(postgres_url)}
    assert left == set(ORDERS) - {acknowledged}

    restarted = _service(name, tmp_path, postgres_url, sandbox, "record-outcomes")

    assert restarted.returncode == 0, restarted.stderr
    (rest,) = set(ORDERS) - {acknowledged, cut_off}
    assert f"recorded {cut_off}: {cut_off_status} (recorded before)\n" in restarted.stdout
    assert f"recorded {rest}: {STATUSES[rest]}\n" in restarted.stdout
    assert acknowledged not in restarted.stdout  # acknowledged before the kill: not again
    assert "2 outcome(s) recorded" in restarted.stdout
    assert _statuses(postgres_url) == STATUSES
    _each_executed_once(sandbox)
    assert _not_acknowledged(postgres_url) == []


ROOT = Path(__file__).resolve().parents[1]


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _installed_by(extras: list[str], also: list[str]) -> set[str]:
    """The distributions ``pip install -e '.[EXTRAS]' ALSO...`` brings, from pyproject.toml
    (an extra may name others, as ``payonce[sandbox]``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    names = {_requirement_name(r) for r in project["dependencies"]} | {
        _requirement_name(a) for a in also
    }
    todo = list(extras)
    while todo:
        for requirement in optional[todo.pop()]:
            if inner := re.fullmatch(r"payonce\[([\w,-]+)\]", requirement):
                todo.extend(inner.group(1).split(","))
            else:
                names.add(_requirement_name(requirement))
    # And what those require in turn (fastapi brings pydantic), as installed here.
    todo_names = list(names)
    while todo_names:
        try:
            requires = importlib.metadata.requires(todo_names.pop()) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for requirement in requires:
            name = _requirement_name(requirement)
            if "extra ==" not in requirement and name not in names:
                names.add(name)
                todo_names.append(name)
    return names


def test_the_install_line_of_the_examples_page_brings_what_every_example_imports() -> None:
    page = (ROOT / "docs" / "examples.md").read_text()
    line = re.search(r"`pip install -e '\.\[([\w,]+)\]'((?: [\w-]+)*)`", page)
    assert line, "the examples page has no `pip install -e '.[...]'` line"
    installed = _installed_by(line.group(1).split(","), line.group(2).split())
    distributions = importlib.metadata.packages_distributions()
    missing = {}
    for example in sorted((ROOT / "examples").glob("*.py")):
        tree = ast.parse(example.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top == "payonce":
                    continue
                needed = {d.lower() for d in distributions.get(top, [top])}
                if not needed & installed:
                    missing[f"{example.name}: {top}"] = sorted(needed)
    assert missing == {}, f"not installed by {line.group(0)}"
