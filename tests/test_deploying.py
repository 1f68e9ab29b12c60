"""docs/deploying.md, run: its WSGI module for gunicorn ``--preload``, its alert counts,
and its recovery worker as a systemd unit and as a Kubernetes sidecar.

The code is read from the page itself, so the page shows what these tests run.
"""

from __future__ import annotations

import ast
import configparser
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

import payonce
from helpers.ci import skip_or_fail
from helpers.cli import run_cli_process
from helpers.payments import PAYMENT, MakeClient, leave_pending, make_unknown
from helpers.pending import enqueue_pending
from helpers.processes import deployed_env
from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY, SandboxServer

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "deploying.md"


def _block(language: str, containing: str) -> str:
    (code,) = [
        block
        for block in re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), re.DOTALL)
        if containing in block
    ]
    return code


def _python_block(containing: str) -> str:
    return _block("python", containing)


def _run_block(containing: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "deploying_page"}
    exec(compile(_python_block(containing), str(PAGE), "exec"), namespace)
    return namespace


@pytest.fixture
def provider_environment(
    monkeypatch: pytest.MonkeyPatch, sandbox: SandboxServer, journal_path: Path
) -> None:
    """The service's settings, from the environment as the page has them."""
    for name, value in {
        "PAYONCE_BASE_URL": sandbox.url,
        "PAYONCE_PROVIDER": "sandbox",
        "PAYONCE_ACCOUNT": "acct_demo",
        "PAYONCE_API_KEY": DEFAULT_API_KEY,
        "PAYONCE_JOURNAL": str(journal_path),
    }.items():
        monkeypatch.setenv(name, value)


def _serve(application: Callable[..., list[bytes]], order_id: str) -> dict[str, Any]:
    status: list[str] = []
    body = application(
        {"PATH_INFO": f"/orders/{order_id}"}, lambda code, headers: status.append(code)
    )
    assert status == ["200 OK"]
    answer: dict[str, Any] = json.loads(b"".join(body))
    return answer


def test_the_preloaded_wsgi_module_resumes_once_then_forked_workers_each_pay_on_their_own(
    provider_environment: None,
    make_client: MakeClient,
    sandbox: SandboxServer,
    journal_path: Path,
) -> None:
    left = leave_pending(make_client, "order-7")  # a killed run left it

    # What gunicorn --preload does: import the module in the master, then fork the workers.
    module = _run_block("def application(")
    (resumed,) = module["client"].journal.find("order-7")
    assert resumed.state is payonce.IntentState.SUCCEEDED

    workers = []
    for order_id in ("1", "2", "7"):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the worker
            code = 1
            try:
                os.write(write_end, json.dumps(_serve(module["application"], order_id)).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        workers.append((pid, read_end))
    answers = []
    for pid, read_end in workers:
        with os.fdopen(read_end, "rb") as pipe:
            answers.append(json.loads(pipe.read()))
        assert os.waitpid(pid, 0)[1] == 0

    assert len({answer["pid"] for answer in answers}) == 3
    assert os.getpid() not in {answer["pid"] for answer in answers}
    executions = sandbox.store.executions()
    assert executions[left.key] == 1  # order-7: resumed in the master, replayed in a worker
    assert sorted(executions.values()) == [1, 1, 1]
    module["client"].close()


def test_the_alert_counts_are_zero_when_healthy_and_count_what_needs_a_look(
    provider_environment: None,
    make_client: MakeClient,
    sandbox: SandboxServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    long_ago = time.time() - 20 * 60
    make_client().close()  # the service started: its journal exists, and holds nothing yet
    _run_block("def payment_alerts(")  # the check opens it read-only: all is well
    assert (
        capsys.readouterr().out
        == "{'unknown': 0, 'pending_too_long': 0, 'unacknowledged_too_long': 0}\n"
    )

    # Needs a look: unknown, pending for 20 minutes, settled 20 minutes ago and not recorded.
    make_unknown(make_client, sandbox, "order-unknown", "fail_before", "fail_before")
    leave_pending(make_client, "order-stuck", clock=lambda: long_ago)
    old = make_client(clock=lambda: long_ago)
    with old.intent("order-not-recorded", acknowledge=False) as op:
        op.post("/v1/payments", json=PAYMENT)
    # Normal: a payment in flight right now, outcomes just settled or recorded.
    leave_pending(make_client, "order-in-flight")
    with make_client().intent("order-just-paid", acknowledge=False) as op:
        op.post("/v1/payments", json=PAYMENT)
    old.post("/v1/payments", json=PAYMENT, reference="order-recorded")

    _run_block("def payment_alerts(")
    assert (
        capsys.readouterr().out
        == "{'unknown': 1, 'pending_too_long': 1, 'unacknowledged_too_long': 1}\n"
    )


# -- the recovery worker -----------------------------------------------------------------------


def _settings_of(names: Sequence[str], ours: Mapping[str, str]) -> dict[str, str]:
    """The page's settings, each given this test's value: the page must set exactly the
    ones the worker needs (a misspelt name would leave one unset, and the worker stuck)."""
    assert sorted(names) == sorted(ours), "the page sets other settings than the worker's"
    return dict(ours)


def _works_then_drains(
    command: Sequence[str],
    settings: Mapping[str, str],
    journal: str | Path,
    keys: Sequence[str],
    sandbox: SandboxServer,
    home: Path,
) -> None:
    """The deployed command sends the pending payments, once each, and a SIGTERM (what
    systemd and Kubernetes send) drains it: exit 0, no lease left held."""
    log = home.with_suffix(".log")
    with log.open("w") as stderr:
        worker = subprocess.Popen(
            command, env=deployed_env(home, **settings), stdout=subprocess.DEVNULL, stderr=stderr
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            with payonce.open_journal(journal) as opened:
                states = {r.key: r.state for r in opened.list_intents()}
            if set(states.values()) == {payonce.IntentState.SUCCEEDED}:
                break
            assert worker.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"never settled: {states}\n{log.read_text()}"
            time.sleep(0.05)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert sandbox.wait_idle()
    assert sandbox.store.executions() == dict.fromkeys(keys, 1)
    with payonce.open_journal(journal) as opened:
        assert [r.key for r in opened.list_intents() if r.lease_owner is not None] == []
    assert "SIGTERM: draining" in log.read_text()


def test_the_systemd_unit_verifies_and_its_worker_sends_then_drains_on_stop(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path, tmp_path: Path
) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        skip_or_fail("systemd-analyze is not installed (Debian: apt-get install systemd)")
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case
    unit.read_string(_block("ini", "[Service]"))
    service = unit["Service"]
    executable, *arguments = shlex.split(service["ExecStart"])
    assert service["KillSignal"] == "SIGTERM"  # the signal that drains it
    assert int(service["TimeoutStopSec"]) >= 90  # a drive's retries (60 s) and an exchange
    # systemd's own check of the unit, with the payonce this test runs in its place.
    here = tmp_path / "payonce-worker.service"
    local = Path(sys.executable).with_name("payonce")
    here.write_text(_block("ini", "[Service]").replace(executable, str(local)))
    verified = subprocess.run(
        [analyze, "verify", str(here)], capture_output=True, text=True, timeout=60, check=False
    )
    assert verified.returncode == 0, verified.stderr
    assert "Unknown" not in verified.stderr, verified.stderr
    assert "ignoring" not in verified.stderr, verified.stderr
    environment_file = _block("sh", "/etc/shop/payonce.env (mode")
    names = [line.split("=")[0] for line in environment_file.splitlines() if "=" in line]
    settings = _settings_of(
        names,
        {
            "PAYONCE_JOURNAL": str(journal_path),
            "PAYONCE_BASE_URL": sandbox.url,
            "PAYONCE_ACCOUNT": DEFAULT_ACCOUNT,
            "PAYONCE_API_KEY": DEFAULT_API_KEY,
        },
    )
    keys = enqueue_pending(make_client(), 10)

    _works_then_drains(
        [str(local), *arguments], settings, journal_path, keys, sandbox, tmp_path / "home"
    )


def test_the_cron_line_runs_as_the_services_user_with_crons_bare_path(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path, tmp_path: Path
) -> None:
    (line,) = [
        text
        for text in _block("sh", "crontab of the service's user").splitlines()
        if text.startswith("*/")
    ]
    command = line.split(maxsplit=5)[5]
    sourced = re.search(r"\. (\S+)", command)
    assert sourced is not None, command
    # Not the systemd unit's file: that one is root's (systemd reads it as root), cron
    # runs as the service's user and could not read it.
    assert sourced.group(1) != "/etc/shop/payonce.env"
    executable = command.split("&&")[-1].split()[0]
    assert executable.startswith("/"), "cron's PATH is bare: the full path to payonce"
    keys = enqueue_pending(make_client(), 3)
    environment = tmp_path / "payonce.env"
    environment.write_text(
        f"PAYONCE_JOURNAL={journal_path}\nPAYONCE_BASE_URL={sandbox.url}\n"
        f"PAYONCE_ACCOUNT={DEFAULT_ACCOUNT}\nPAYONCE_API_KEY={DEFAULT_API_KEY}\n"
    )
    environment.chmod(0o600)
    here = command.replace(sourced.group(1), str(environment)).replace(executable, sys.executable)
    env = deployed_env(tmp_path / "home")
    env["PATH"] = "/usr/bin:/bin"  # cron's

    ran = subprocess.run(
        ["/bin/sh", "-c", here], env=env, capture_output=True, text=True, timeout=60
    )

    assert ran.returncode == 0, ran.stderr
    assert sandbox.wait_idle()
    assert sandbox.store.executions() == dict.fromkeys(keys, 1)


@pytest.mark.slow
def test_the_kubernetes_sidecar_shares_the_services_journal_and_drains_on_stop(
    make_client: MakeClient, sandbox: SandboxServer, postgres_url: str, tmp_path: Path
) -> None:
    (deployment,) = list(yaml.safe_load_all(_block("yaml", "kind: Deployment")))
    assert (deployment["apiVersion"], deployment["kind"]) == ("apps/v1", "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    (sidecar,) = [c for c in pod["initContainers"] if c["name"] == "payonce-worker"]
    (service,) = pod["containers"]
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar: stops after the service
    assert pod["terminationGracePeriodSeconds"] >= 90  # time to drain
    assert sidecar["image"] == service["image"]  # the same payonce and provider profiles

    def sources(container: dict[str, Any]) -> dict[str, Any]:
        return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}

    # The worker reads the journal and key the service writes with.
    for name in ("PAYONCE_JOURNAL", "PAYONCE_API_KEY"):
        assert sources(sidecar)[name] == sources(service)[name]
    settings = _settings_of(
        list(sources(sidecar)),
        {
            "PAYONCE_JOURNAL": postgres_url,  # journal-url: a PostgreSQL journal
            "PAYONCE_BASE_URL": sandbox.url,
            "PAYONCE_ACCOUNT": DEFAULT_ACCOUNT,
            "PAYONCE_API_KEY": DEFAULT_API_KEY,
        },
    )
    program, *arguments = sidecar["command"]
    assert program == "payonce"
    keys = enqueue_pending(make_client(journal=postgres_url), 10)

    command = [sys.executable, "-m", "payonce", *arguments]
    _works_then_drains(command, settings, postgres_url, keys, sandbox, tmp_path / "home")


# -- what recovers what ------------------------------------------------------------------------


def _paragraph(starting: str) -> str:
    (found,) = [p for p in PAGE.read_text().split("\n\n") if p.startswith(starting)]
    return " ".join(found.split())


def test_a_transport_only_client_cannot_resume_at_start_up_as_the_page_says(
    make_client: MakeClient,
) -> None:
    """The page's start-up advice holds for a client with a key; one built for an SDK
    integration or for enqueuing only refuses, and the page says what recovers instead."""
    integration = make_client(api_key=None, transport_only=True)

    with pytest.raises(payonce.ConfigurationError, match="needs this client's own API key"):
        integration.resume()
    advice = _paragraph("**Recovering at start-up.**")
    assert "`transport_only=True`" in advice
    assert "refuses it (`ConfigurationError`)" in advice
    assert "leave recovery to [the recovery worker]" in advice


def test_the_worker_finishes_a_blocks_cut_off_step_but_never_one_it_never_reached(
    make_client: MakeClient, sandbox: SandboxServer, journal_path: Path
) -> None:
    """A block of two requests, stopped after its first settled: the worker has nothing of
    the second to send; the block run again sends it. As the page says."""
    client = make_client()
    create, confirm = PAYMENT, {**PAYMENT, "amount": PAYMENT["amount"] + 1}  # two requests

    class Crashed(Exception):
        pass

    def stopped_after_the_create() -> None:
        with client.intent("order-7") as op:
            op.post("/v1/payments", json=create)
            raise Crashed  # as a process killed between the two would

    with pytest.raises(Crashed):
        stopped_after_the_create()
    worker = run_cli_process(
        ["worker", "--once", "--base-url", sandbox.url, "--journal", str(journal_path)],
        env={"PAYONCE_API_KEY": DEFAULT_API_KEY, "PAYONCE_ACCOUNT": DEFAULT_ACCOUNT},
    )
    assert worker.exit_code == 0, worker.output
    assert sandbox.store.total_executions() == 1  # the create; the confirm is in the code

    with client.intent("order-7") as op:  # the block run again
        op.post("/v1/payments", json=create)  # replayed from the journal
        op.post("/v1/payments", json=confirm)  # sent now
    assert sandbox.store.total_executions() == 2
    advice = _paragraph("**What the recovery worker cannot finish: a block's later steps.**")
    assert "until the **block runs again**" in advice
    assert "let the recovery worker finish the rest" not in PAGE.read_text()


# -- the checkout service's settings -----------------------------------------------------------


def _environment_read_by(example: Path) -> dict[str, bool]:
    """Each environment variable the example reads, and whether it has a default there."""
    read: dict[str, bool] = {}
    for node in ast.walk(ast.parse(example.read_text())):
        if (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) == "os.environ.get"
            and isinstance(node.args[0], ast.Constant)
        ):
            read[node.args[0].value] = len(node.args) > 1
        elif (
            isinstance(node, ast.Subscript)
            and ast.unparse(node.value) == "os.environ"
            and isinstance(node.slice, ast.Constant)
        ):
            read[node.slice.value] = False
    return read


def _payonce_reads_the_journal_setting(example: Path) -> bool:
    """The example's clients name no journal: payonce opens the one PAYONCE_JOURNAL names."""
    clients = [
        node
        for node in ast.walk(ast.parse(example.read_text()))
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "payonce.Client"
    ]
    return bool(clients) and all(
        "journal" not in {keyword.arg for keyword in client.keywords} for client in clients
    )


def test_the_checkout_service_is_started_with_the_settings_it_reads() -> None:
    """The page starts the example under uvicorn with exactly the settings the example (and
    payonce under it) reads: every one it needs set, none it would ignore, the optional one
    named after."""
    example = ROOT / "examples" / "checkout_service.py"
    start = _block("sh", "checkout_service:app --workers 4")
    exported = set(re.findall(r"^export (\w+)=", start, re.MULTILINE))
    after = _paragraph("(`STRIPE_API_BASE`")
    read = _environment_read_by(example)
    assert _payonce_reads_the_journal_setting(example)
    read["PAYONCE_JOURNAL"] = False  # required in production: the journal must persist

    assert exported <= set(read), "the page sets what the example never reads"
    assert {name for name, defaulted in read.items() if not defaulted} <= exported
    for name in set(read) - exported:
        assert f"`{name}`" in after, f"{name}, read by the example, is not on the page"
    assert read["STRIPE_API_BASE"] is True  # optional: https://api.stripe.com by default
    # What the start-up does, as the page says it: blocks run again, never a resume.
    lifespan = (example.read_text()).split("async def lifespan", 1)[1].split("\n\n\n", 1)[0]
    assert "finish_what_a_killed_run_left" in lifespan
    assert "resume" not in lifespan
    advice = _paragraph("**Recovering at start-up.**")
    assert "its lifespan does not resume" in advice
    assert "as the checkout example's lifespan does" not in PAGE.read_text()
