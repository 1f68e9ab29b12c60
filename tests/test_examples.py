"""The examples run as a user would run them: a real interpreter, a real sandbox, exit 0."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import psycopg
import pytest

from helpers.processes import deployed_env, run_example


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
    assert "the sandbox executed 1 payment(s) for 1 committed order" in out
    assert "Traceback" not in result.stderr
    # What the service's database holds: the order with its payment's key, paid once; no
    # trace of the order whose handler failed.
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT id, amount, payment_key FROM orders").fetchall() == [
            ("order-1001", 4200, key)
        ]
        states = conn.execute("SELECT reference, state FROM payonce.intents").fetchall()
    assert states == [("order-1001", "succeeded")]


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
