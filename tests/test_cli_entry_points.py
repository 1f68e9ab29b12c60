"""How the ``payonce`` command is started and asked for help, and how it is built.

``payonce``, ``python -m payonce`` and ``python -m payonce.cli`` are one command; ``payonce
sandbox`` and ``python -m payonce.sandbox`` are one command too, with one set of options.
"""

from __future__ import annotations

import ast
import contextlib
import http.server
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import click
import httpx
import pytest

import payonce
import payonce.cli
from helpers.cli import CliResult, run_cli, run_cli_process
from payonce.cli import cli
from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY
from payonce.webhooks import parse_event, verify

SRC = Path(__file__).resolve().parents[1] / "src"
PAYONCE_SCRIPT = str(Path(sys.executable).with_name("payonce"))  # the installed console script

COMMANDS = [
    (),
    ("abandon",),
    ("ack",),
    ("demo",),
    ("intents",),
    ("intents", "list"),
    ("intents", "show"),
    ("journal",),
    ("journal", "backup"),
    ("journal", "check"),
    ("journal", "init"),
    ("journal", "migrate"),
    ("keys",),
    ("keys", "delete"),
    ("keys", "list"),
    ("keys", "set"),
    ("prune",),
    ("reconcile",),
    ("resume",),
    ("sandbox",),
    ("worker",),
]

# Every option `python -m payonce.sandbox` took when it had a parser of its own: scripts, the
# docs and the benchmarks pass them, so neither entry point may ever lose one.
SANDBOX_OPTIONS_BEFORE = {
    "-h",
    "--help",
    "--host",
    "--port",
    "--store",
    "--key-lifetime",
    "--processing",
    "--seed",
    "--fail-before",
    "--fail-after",
    "--drop-after",
    "--rate-limit",
    "--delay-rate",
    "--delay",
    "--ready-file",
    "--webhook-url",
    "--webhook-secret",
    "--webhook-redeliver-rate",
}


def _command_paths(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _command_paths(command, (*path, name))
        else:
            yield (*path, name)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    env["COLUMNS"] = "120"
    return env


def _python_m(module: str, *args: str) -> CliResult:
    """``python -m module *args`` at 120 columns, as an operator's console might be."""
    return run_cli_process(args, command=[sys.executable, "-m", module], columns=120)


def _options_in_help(text: str) -> set[str]:
    # Option rows are indented by two spaces exactly; their wrapped help lines by more.
    rows = re.findall(r"^ {2}(-[^\s,]+(?:, -[^\s,]+)*)", text, flags=re.MULTILINE)
    return {name for row in rows for name in row.split(", ")}


# -- help --------------------------------------------------------------------------------------


def test_the_command_tree_is_the_documented_one() -> None:
    assert sorted(_command_paths(cli)) == COMMANDS


@pytest.mark.parametrize("path", COMMANDS, ids=lambda path: " ".join(path) or "payonce")
def test_dash_h_is_help_on_every_command_and_group(path: tuple[str, ...]) -> None:
    short = run_cli([*path, "-h"], prog_name="payonce")
    long = run_cli([*path, "--help"], prog_name="payonce")
    assert short.exit_code == 0, short.output
    assert short.stdout.startswith(f"Usage: {' '.join(['payonce', *path])} ")
    assert "  -h, --help " in short.stdout
    assert short.stdout == long.stdout


# -- python -m ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_python_m_payonce_is_the_payonce_command() -> None:
    version = _python_m("payonce", "--version")
    assert version.exit_code == 0, version.stderr
    assert version.stdout == f"payonce, version {payonce.__version__}\n"

    helped = _python_m("payonce", "-h")
    assert helped.exit_code == 0, helped.stderr
    assert helped.stdout.startswith("Usage: payonce [OPTIONS] COMMAND [ARGS]...\n")
    in_process = run_cli(["-h"], prog_name="payonce").stdout
    assert helped.stdout.split() == in_process.split()  # wrapped to other widths


def test_python_m_payonce_reports_errors_like_the_console_script(tmp_path: Path) -> None:
    done = _python_m("payonce", "intents", "list", "--journal", str(tmp_path / "none.db"))
    assert done.exit_code == 2
    assert done.stdout == ""
    assert done.stderr == f"error: no journal at {tmp_path / 'none.db'}\n"


def test_the_librarys_warnings_are_the_commands_own_warning_lines(tmp_path: Path) -> None:
    journal = tmp_path / "journal.db"
    payonce.open_journal(journal).close()
    journal.chmod(0o644)  # what a careless copy leaves: payonce warns of it on open

    done = _python_m("payonce", "intents", "list", "--journal", str(journal))

    assert done.exit_code == 0
    lines = done.stderr.splitlines()
    warnings = [line for line in lines if "readable or writable by other users" in line]
    assert len(warnings) == 1, done.stderr
    assert warnings[0].startswith("warning: the journal file ")


# -- one sandbox command -----------------------------------------------------------------------


@pytest.mark.slow
def test_the_sandbox_module_and_command_take_the_same_options() -> None:
    module = _python_m("payonce.sandbox", "-h")
    command = _python_m("payonce", "sandbox", "-h")
    assert module.exit_code == command.exit_code == 0, module.stderr + command.stderr
    assert module.stdout.startswith("Usage: python -m payonce.sandbox [OPTIONS]\n")
    assert _options_in_help(module.stdout) == _options_in_help(command.stdout)
    assert _options_in_help(command.stdout) >= SANDBOX_OPTIONS_BEFORE
    # The help texts are the same too, but for the name the command was started by.
    assert module.stdout.replace("python -m payonce.sandbox", "payonce sandbox") == command.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--webhook-url", "http://127.0.0.1:9/hooks"], "--webhook-url needs at least one"),
        (["--webhook-secret", "whsec_1"], "need --webhook-url"),
        (["--webhook-redeliver-rate", "0.5"], "need --webhook-url"),
        (["--fail-after", "1.5"], "'--fail-after': 1.5 is not in the range"),
        (["--processing", "-1"], "'--processing': -1.0 is not in the range"),
    ],
)
def test_sandbox_refuses_bad_options_before_serving(args: list[str], message: str) -> None:
    result = run_cli(["sandbox", "--port", "0", *args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert "listening" not in result.stdout


class _Receiver(http.server.BaseHTTPRequestHandler):
    """A webhook endpoint that keeps what it is sent."""

    deliveries: list[tuple[bytes, str | None]]
    arrived: threading.Event

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.deliveries.append((body, self.headers.get("Stripe-Signature")))
        self.arrived.set()
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, type[_Receiver]]]:
    handler = type("Receiver", (_Receiver,), {"deliveries": [], "arrived": threading.Event()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/hooks", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@attrs.define
class Served:
    """A sandbox run in a process of its own: its URL, then how it ended."""

    url: str = ""
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None


@contextlib.contextmanager
def _serving(*command: str, ready_file: Path) -> Iterator[Served]:
    """Run ``python -m COMMAND... --port 0 --ready-file F`` until the block is done, then
    SIGTERM it."""
    options = ["--port", "0", "--ready-file", str(ready_file)]
    process = subprocess.Popen(
        [sys.executable, "-W", "error", "-m", *command, *options],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    served = Served()
    try:
        deadline = time.monotonic() + 30
        while not ready_file.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the sandbox never became ready"
            time.sleep(0.02)
        served.url = ready_file.read_text()
        yield served
    finally:
        process.terminate()
        served.stdout, served.stderr = process.communicate(timeout=30)
        served.returncode = process.returncode


def _pay(url: str, key: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/payments",
        json={"amount": 4200, "currency": "eur"},
        headers={"Authorization": f"Bearer {DEFAULT_API_KEY}", "Idempotency-Key": key},
        timeout=10,
    )


def test_python_m_payonce_sandbox_serves_until_terminated(tmp_path: Path) -> None:
    store = tmp_path / "provider.db"
    with _serving("payonce.sandbox", "--store", str(store), ready_file=tmp_path / "ready") as run:
        assert _pay(run.url, "k-module-1").status_code == 201
        executions = httpx.get(f"{run.url}/_sandbox/executions", timeout=10).json()
    assert executions == {"executions": {"k-module-1": 1}, "total": 1}

    assert run.returncode == 0, run.stderr
    # The same command as `payonce sandbox`: the line scripts wait for, then its banner.
    assert run.stdout.splitlines() == [
        f"payonce sandbox listening on {run.url}",
        f"test API key: {DEFAULT_API_KEY} (account {DEFAULT_ACCOUNT})",
        "faults: none",
        "press Ctrl-C to stop",
        "sandbox provider stopped",
    ]
    assert "Traceback" not in run.stderr
    assert store.exists()


def test_payonce_sandbox_like_stripe_serves_stripe_python(tmp_path: Path) -> None:
    import requests
    import stripe

    with (
        _serving("payonce", "sandbox", "--like", "stripe", ready_file=tmp_path / "ready") as run,
        requests.Session() as session,
    ):
        client = stripe.StripeClient(
            DEFAULT_API_KEY,
            base_addresses={"api": run.url},
            http_client=stripe.RequestsClient(session=session),
        )
        created = client.v1.payment_intents.create(
            params={"amount": 4200, "currency": "eur", "payment_method": "pm_card_visa"},
            options={"idempotency_key": "order-like-1"},
        )
        confirmed = client.v1.payment_intents.confirm(created.id)
        executions = httpx.get(f"{run.url}/_sandbox/executions", timeout=10).json()

    assert (created.status, confirmed.status) == ("requires_confirmation", "succeeded")
    assert executions["executions"]["order-like-1"] == 1
    assert run.returncode == 0, run.stderr
    assert "answers like: stripe" in run.stdout.splitlines()


def test_each_fault_option_sets_its_own_fault(tmp_path: Path) -> None:
    faults = ["--seed", "7", "--fail-before", "0.1", "--fail-after", "0.2", "--drop-after", "0.3"]
    faults += ["--rate-limit", "0.4", "--delay-rate", "0.5", "--delay", "1.5"]
    with _serving("payonce", "sandbox", *faults, ready_file=tmp_path / "ready") as run:
        pass

    assert run.returncode == 0, run.stderr
    # The banner describes the faults the provider was configured with, field by field.
    assert (
        "faults: fail before 10%, fail after 20%, drop after 30%, rate limit 40%, "
        "delay 1.5s 50% (seed 7)"
    ) in run.stdout.splitlines()


@pytest.mark.slow
def test_payonce_sandbox_delivers_signed_webhooks_with_every_secret(
    tmp_path: Path, receiver: tuple[str, type[_Receiver]]
) -> None:
    hook_url, endpoint = receiver
    # Options `python -m payonce.sandbox` always had, now on `payonce sandbox` as well.
    webhooks = ["--webhook-url", hook_url, "--webhook-secret", "whsec_old"]
    webhooks += ["--webhook-secret", "whsec_new", "--processing", "0.01"]
    with _serving("payonce", "sandbox", *webhooks, ready_file=tmp_path / "ready") as run:
        assert _pay(run.url, "k-hook-1").status_code == 201
        assert endpoint.arrived.wait(30), "no webhook was delivered"

    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == f"payonce sandbox listening on {run.url}"
    assert f"webhooks: to {hook_url}" in run.stdout
    assert "whsec_" not in run.stdout + run.stderr
    body, signature = endpoint.deliveries[0]
    for secret in ("whsec_old", "whsec_new"):  # signed with both during the rotation
        verify(body, signature, [secret])
    assert parse_event(body).id


# -- how the command is built ------------------------------------------------------------------


def _cli_modules() -> list[Path]:
    return sorted(Path(payonce.cli.__file__).parent.glob("*.py"))


def _private_payonce_names(tree: ast.AST) -> Iterator[str]:
    def private(dotted: str) -> bool:
        parts = dotted.split(".")
        return parts[0] == "payonce" and any(p.startswith("_") and p != "__main__" for p in parts)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if private(alias.name))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            yield from (name for name in names if private(name))
        elif isinstance(node, ast.ImportFrom) and node.level > 1:
            yield f"{'.' * node.level}{node.module or ''}"  # out of the cli package
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "payonce"
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            yield f"payonce.{node.attr}"


def test_every_command_uses_the_public_api_only() -> None:
    modules = _cli_modules()
    assert len(modules) > 5
    for module in modules:
        found = list(_private_payonce_names(ast.parse(module.read_text(), str(module))))
        assert found == [], f"{module.name} reaches into {found}"


# -- shell completion -----------------------------------------------------------------------


def _complete(*words: str, shell: str = "bash") -> str:
    """What the installed ``payonce`` script answers a shell asking to complete ``words``
    (the last one is being typed), as docs/cli.md sets it up."""
    environment = {
        "COMP_WORDS": " ".join(("payonce", *words)),
        "COMP_CWORD": str(len(words)),
        "_PAYONCE_COMPLETE": f"{shell}_complete",
    }
    done = run_cli_process([], env=environment, columns=None, command=[PAYONCE_SCRIPT])
    assert done.exit_code == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_documented_completion_scripts_are_generated(shell: str) -> None:
    environment = {"_PAYONCE_COMPLETE": f"{shell}_source"}
    done = run_cli_process([], env=environment, columns=None, command=[PAYONCE_SCRIPT])
    assert done.exit_code == 0, done.stderr
    assert "_PAYONCE_COMPLETE" in done.stdout
    assert f"_PAYONCE_COMPLETE={shell}_source" in (SRC.parent / "docs" / "cli.md").read_text()


@pytest.mark.slow
def test_commands_options_and_choices_complete() -> None:
    assert _complete("int").split() == ["plain,intents"]
    assert "plain,--state" in _complete("intents", "list", "--st").split()
    states = {line.split(",")[1] for line in _complete("intents", "list", "--state", "").split()}
    assert states == {state.value for state in payonce.IntentState}
