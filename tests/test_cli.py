"""The ``payonce`` command, run for real against a journal filled by a real client."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

import payonce
from helpers.cli import CliResult, run_cli, run_cli_process
from helpers.processes import python_env
from payonce.sandbox import DEFAULT_API_KEY, SandboxServer

DECLINED_AMOUNT = 40200  # the sandbox declines exactly this amount with a 402
BODY_MARKER = "cart-marker-7781"  # only ever in stored request/response bodies
NO_RETRY_AFTER = payonce.RetryPolicy(
    initial_wait=0.001, max_wait=0.01, max_attempts=5, max_retry_after=0.0
)


@attrs.frozen
class Populated:
    path: Path
    keys: dict[str, str]
    """Reference -> key, for every intent driven into the journal."""


def _payment(reference: str, amount: int = 4200) -> dict[str, Any]:
    return {
        "amount": amount,
        "currency": "eur",
        "reference": reference,
        "metadata": {"cart": BODY_MARKER},
    }


def _keys(journal_path: Path, references: Sequence[str]) -> dict[str, str]:
    journal = payonce.open_journal(journal_path)
    try:
        return {ref: journal.find(ref)[0].key for ref in references}
    finally:
        journal.close()


class GatedTransport(httpx.HTTPTransport):
    """Holds every request until the test opens the gate: an intent stays in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.gate = threading.Event()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.entered.set()
        assert self.gate.wait(30)
        return super().handle_request(request)


@pytest.fixture
def populated(
    sandbox: SandboxServer, make_client: Callable[..., payonce.Client], journal_path: Path
) -> Populated:
    """One intent in each reachable state, created in this order (oldest first)."""
    client = make_client()
    client.post("/v1/payments", json=_payment("order-1"), reference="order-1")
    client.post("/v1/payments", json=_payment("order-2", 1300), reference="order-2")
    with pytest.raises(payonce.ProviderError):
        client.post(
            "/v1/payments",
            json=_payment("order-declined", DECLINED_AMOUNT),
            reference="order-declined",
        )
    # 503 on every attempt: the provider may have executed it, payonce cannot tell.
    sandbox.script(["fail_before"] * 5)
    with pytest.raises(payonce.OutcomeUnknown):
        client.post("/v1/payments", json=_payment("order-unknown"), reference="order-unknown")
    # 429 on every attempt: provably never executed, so it stays pending.
    sandbox.script(["rate_limit"] * 5)
    with pytest.raises(payonce.ProviderUnavailable):
        make_client(retry=NO_RETRY_AFTER).post(
            "/v1/payments", json=_payment("order-pending"), reference="order-pending"
        )
    references = ["order-1", "order-2", "order-declined", "order-unknown", "order-pending"]
    return Populated(journal_path, _keys(journal_path, references))


def _unstyled(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _section(out: str, header: str) -> list[str]:
    """The lines under ``header`` in piped output, up to the blank line that ends them."""
    (section,) = [part for part in out.split("\n\n") if part.startswith(header)]
    return section.splitlines()[1:]


def _json(result: CliResult) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _all_output(result: CliResult) -> str:
    return result.stdout + result.stderr


# -- intents list -----------------------------------------------------------------------------


def test_list_shows_every_intent_newest_first(populated: Populated) -> None:
    result = run_cli(["intents", "list", "--journal", str(populated.path)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    positions = [out.index(ref) for ref in reversed(list(populated.keys))]
    assert positions == sorted(positions)  # newest first
    for key in populated.keys.values():
        assert key in out
    for state in ("succeeded", "failed", "unknown", "pending"):
        assert state in out
    assert "POST /v1/payments" in out
    assert "retries exhausted" in out  # the unknown intent's reason gets its own column


@pytest.mark.parametrize("columns", [200, 80], ids=["wide", "narrow"])
def test_list_on_a_terminal_names_each_intent_s_account(populated: Populated, columns: int) -> None:
    # Recovering an intent takes its account's key and name (`--account`): an account
    # nobody chose (a client built without account=) must not be a surprise found later.
    where = ["--journal", str(populated.path)]
    accounts = {item["account"] for item in _json(run_cli(["intents", "list", "--json", *where]))}
    assert len(accounts) == 1
    (account,) = accounts

    result = run_cli(["intents", "list", *where], columns=columns, terminal=True)

    assert result.exit_code == 0, result.output
    screen = _unstyled(result.stdout)
    header = screen.partition("───")[0]
    assert "account" in header.partition("newest first")[2], screen  # named in the header
    lines = screen.splitlines()
    for key in populated.keys.values():
        (at,) = [n for n, line in enumerate(lines) if key in line]
        # On its line, or below its state on the next one (the narrow layout).
        assert account in lines[at] + lines[at + 1], screen


def test_list_filters_by_state(populated: Populated) -> None:
    result = run_cli(["intents", "list", "--state", "pending", "--journal", str(populated.path)])
    assert result.exit_code == 0, result.output
    assert "order-pending" in result.stdout
    assert "order-1" not in result.stdout
    assert "order-unknown" not in result.stdout

    both = _json(
        run_cli(
            ["intents", "list", "--state", "pending", "--state", "UNKNOWN", "--json"],
            env={"PAYONCE_JOURNAL": str(populated.path)},
        )
    )
    assert {item["reference"] for item in both} == {"order-pending", "order-unknown"}


def test_list_json_is_machine_readable(populated: Populated) -> None:
    result = run_cli(["intents", "list", "--journal", str(populated.path), "--json"])
    items = _json(result)
    assert [item["reference"] for item in items] == list(reversed(list(populated.keys)))
    by_reference = {item["reference"]: item for item in items}
    assert by_reference["order-1"]["state"] == "succeeded"
    assert by_reference["order-1"]["response_status"] == 201
    assert by_reference["order-1"]["key"] == populated.keys["order-1"]
    assert by_reference["order-declined"]["state"] == "failed"
    assert by_reference["order-unknown"]["state"] == "unknown"
    assert by_reference["order-unknown"]["attempt_count"] == 5
    assert "retries exhausted" in by_reference["order-unknown"]["unknown_reason"]
    assert by_reference["order-pending"]["state"] == "pending"
    assert by_reference["order-pending"]["response_status"] is None
    assert all(item["method"] == "POST" and item["path"] == "/v1/payments" for item in items)
    assert all(item["created_at"].endswith("+00:00") for item in items)
    assert "\x1b" not in result.stdout  # no terminal styling in machine output


def test_list_limit_and_empty_selection(populated: Populated) -> None:
    newest = _json(
        run_cli(
            ["intents", "list", "--limit", "2", "--json"],
            env={"PAYONCE_JOURNAL": str(populated.path)},
        )
    )
    assert [item["reference"] for item in newest] == ["order-pending", "order-unknown"]
    result = run_cli(["intents", "list", "--state", "abandoned", "--journal", str(populated.path)])
    assert result.exit_code == 0
    assert result.stdout == ""  # piped: records only; the message goes to stderr
    assert "no intents in state abandoned" in result.stderr
    assert (
        _json(
            run_cli(
                [
                    "intents",
                    "list",
                    "--state",
                    "abandoned",
                    "--json",
                    "--journal",
                    str(populated.path),
                ]
            )
        )
        == []
    )


def test_list_help_names_the_valid_states() -> None:
    result = run_cli(["intents", "list", "--help"])
    assert result.exit_code == 0
    for state in payonce.IntentState:
        assert state.value in result.stdout


def test_bad_state_is_a_usage_error_without_traceback(populated: Populated) -> None:
    result = run_cli(["intents", "list", "--state", "settled", "--journal", str(populated.path)])
    assert result.exit_code == 2
    assert "settled" in result.stderr
    assert "Traceback" not in _all_output(result)


def test_reference_is_never_taken_for_markup(
    make_client: Callable[..., payonce.Client], journal_path: Path
) -> None:
    reference = "order-[bold]7[/bold]"
    make_client().post("/v1/payments", json=_payment(reference), reference=reference)
    result = run_cli(["intents", "list", "--journal", str(journal_path)])
    assert reference in result.stdout
    result = run_cli(["intents", "show", reference, "--journal", str(journal_path)])
    assert reference in result.stdout


def test_list_shows_the_lease_of_an_intent_in_flight(
    make_client: Callable[..., payonce.Client], journal_path: Path
) -> None:
    transport = GatedTransport()
    client = make_client(transport=transport)
    sender = threading.Thread(
        target=client.post,
        args=("/v1/payments",),
        kwargs={"json": _payment("order-slow"), "reference": "order-slow"},
    )
    sender.start()
    try:
        assert transport.entered.wait(30)
        # Journaled before the first byte went out: pending, and leased by the sender.
        (item,) = _json(run_cli(["intents", "list", "--json", "--journal", str(journal_path)]))
        table = run_cli(["intents", "list", "--journal", str(journal_path)])
    finally:
        transport.gate.set()
        sender.join()
    assert item["state"] == "pending"
    assert item["lease_owner"]
    assert item["lease_expires_at"]
    assert "lease" in table.stdout
    assert item["lease_owner"] in table.stdout
    (settled,) = _json(run_cli(["intents", "list", "--json", "--journal", str(journal_path)]))
    assert settled["state"] == "succeeded"
    assert settled["lease_owner"] is None


def test_narrow_terminal_still_shows_leases_and_unknown_reasons(
    sandbox: SandboxServer, make_client: Callable[..., payonce.Client], journal_path: Path
) -> None:
    sandbox.script(["fail_before"] * 5)
    with pytest.raises(payonce.OutcomeUnknown):
        make_client().post("/v1/payments", json=_payment("order-u"), reference="order-u")
    transport = GatedTransport()
    client = make_client(transport=transport)
    sender = threading.Thread(
        target=client.post,
        args=("/v1/payments",),
        kwargs={"json": _payment("order-slow"), "reference": "order-slow"},
    )
    sender.start()
    try:
        assert transport.entered.wait(30)
        (held,) = [
            item
            for item in _json(
                run_cli(["intents", "list", "--json", "--journal", str(journal_path)])
            )
            if item["reference"] == "order-slow"
        ]
        narrow = run_cli(
            ["intents", "list", "--journal", str(journal_path)], columns=80, terminal=True
        )
        detail = run_cli(
            ["intents", "show", "order-slow", "--journal", str(journal_path)],
            columns=80,
            terminal=True,
        )
    finally:
        transport.gate.set()
        sender.join()
    assert narrow.exit_code == 0, narrow.output
    screen = _unstyled(narrow.stdout)
    assert all(len(line) <= 80 for line in screen.splitlines())
    # Values wrap at spaces, never inside a word. The lease keeps the table: until when it
    # holds, its owner's long name left to `intents show`, which has it whole.
    assert "key / reference" in screen
    words = " ".join(screen.split())
    assert "lease: held until 20" in words
    assert "retries exhausted; last failure: HTTP 503" in words
    shown = _unstyled(detail.stdout)
    assert all(len(line) <= 80 for line in shown.splitlines())
    assert f"{held['lease_owner']} until 20" in " ".join(shown.split())


def test_narrow_terminal_still_shows_every_value(populated: Populated) -> None:
    result = run_cli(
        ["intents", "list", "--journal", str(populated.path)], columns=80, terminal=True
    )
    assert result.exit_code == 0, result.output
    screen = _unstyled(result.stdout)
    assert all(len(line) <= 80 for line in screen.splitlines())
    for reference, key in populated.keys.items():
        assert reference in screen
        assert key in screen


# -- intents show -----------------------------------------------------------------------------


def test_show_lists_the_attempts(populated: Populated) -> None:
    where = ["--journal", str(populated.path)]
    result = run_cli(["intents", "show", "order-unknown", *where])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert populated.keys["order-unknown"] in out
    assert "unknown" in out
    assert "retries exhausted" in out
    attempts = _section(out, "attempt\tstarted_utc\t")
    assert [line.split("\t")[0] for line in attempts] == ["1", "2", "3", "4", "5"]
    assert [line.split("\t")[3] for line in attempts] == ["503"] * 5
    assert "5 attempt(s)" in _unstyled(
        run_cli(["intents", "show", "order-unknown", *where], terminal=True).stdout
    )


def test_show_by_key(populated: Populated) -> None:
    key = populated.keys["order-1"]
    result = run_cli(["intents", "show", key, "--journal", str(populated.path)])
    assert result.exit_code == 0, result.output
    assert "order-1" in result.stdout
    assert "response\tHTTP 201\n" in result.stdout
    (attempt,) = _section(result.stdout, "attempt\tstarted_utc\t")
    assert attempt.split("\t")[3] == "201"


def test_show_json(populated: Populated) -> None:
    (intent,) = _json(
        run_cli(["intents", "show", "order-declined", "--json", "--journal", str(populated.path)])
    )
    assert intent["key"] == populated.keys["order-declined"]
    assert intent["state"] == "failed"
    assert intent["response_status"] == 402
    (attempt,) = intent["attempts"]
    assert attempt["number"] == 1
    assert attempt["status_code"] == 402
    assert attempt["in_flight"] is False
    assert "request" not in intent
    assert "response" not in intent

    (pending,) = _json(
        run_cli(["intents", "show", "order-pending", "--json", "--journal", str(populated.path)])
    )
    assert [a["status_code"] for a in pending["attempts"]] == [429] * 5
    assert all(a["ambiguous"] is False for a in pending["attempts"])


def test_show_includes_reconciliations(
    sandbox: SandboxServer, make_client: Callable[..., payonce.Client], journal_path: Path
) -> None:
    client = make_client()
    sandbox.script(["fail_before"] * 5)
    with pytest.raises(payonce.OutcomeUnknown):
        client.post("/v1/payments", json=_payment("order-r"), reference="order-r")
    client.reconcile("order-r")
    where = ["--journal", str(journal_path)]
    (intent,) = _json(run_cli(["intents", "show", "order-r", "--json", *where]))
    (entry,) = intent["reconciliations"]
    assert entry["outcome"] == "not_found"  # a 503 before executing: the provider has nothing
    table = run_cli(["intents", "show", "order-r", *where])
    (line,) = _section(table.stdout, "at_utc\toutcome\tstatus\tdetail")
    assert line.split("\t")[1] == "not_found"
    assert "1 reconciliation(s)" in _unstyled(
        run_cli(["intents", "show", "order-r", *where], terminal=True).stdout
    )


def test_bodies_only_with_body_flag(populated: Populated) -> None:
    where = ["--journal", str(populated.path)]
    plain = run_cli(["intents", "show", "order-1", *where])
    plain_json = run_cli(["intents", "show", "order-1", "--json", *where])
    listing = run_cli(["intents", "list", "--json", *where])
    for result in (plain, plain_json, listing):
        assert result.exit_code == 0, result.output
        assert BODY_MARKER not in _all_output(result)

    with_body = run_cli(["intents", "show", "order-1", "--body", *where])
    assert with_body.exit_code == 0, with_body.output
    assert with_body.stdout.count(BODY_MARKER) == 2  # the request and the stored response

    (intent,) = _json(run_cli(["intents", "show", "order-1", "--json", "--body", *where]))
    assert intent["request"]["body_encoding"] == "utf-8"
    assert json.loads(intent["request"]["body"])["metadata"] == {"cart": BODY_MARKER}
    assert intent["response"]["status"] == 201
    assert json.loads(intent["response"]["body"])["reference"] == "order-1"

    (pending,) = _json(run_cli(["intents", "show", "order-pending", "--json", "--body", *where]))
    assert pending["response"] is None


def test_show_not_found_exits_1(populated: Populated) -> None:
    result = run_cli(["intents", "show", "order-404", "--journal", str(populated.path)])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ")
    assert "order-404" in result.stderr
    assert result.stdout == ""
    assert "Traceback" not in _all_output(result)


# -- journals that are damaged, missing or foreign --------------------------------------------

SQLITE_HEADER = b"SQLite format 3\x00"


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"these are not the payments you are looking for\n" * 40, id="not-sqlite"),
        pytest.param(SQLITE_HEADER + bytes(range(256)) * 16, id="damaged-sqlite"),
    ],
)
@pytest.mark.parametrize(
    "command",
    [["intents", "list"], ["intents", "list", "--json"], ["intents", "show", "order-1"]],
)
def test_corrupt_journal_is_reported_and_left_alone(
    tmp_path: Path, content: bytes, command: list[str]
) -> None:
    path = tmp_path / "journal.db"
    path.write_bytes(content)
    result = run_cli([*command, "--journal", str(path)])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in _all_output(result)
    assert result.stdout == ""
    assert path.read_bytes() == content


@pytest.mark.parametrize("command", [["intents", "list"], ["intents", "show", "order-1"]])
def test_missing_journal_is_not_created(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "nowhere" / "journal.db"
    result = run_cli([*command, "--journal", str(path)])
    assert result.exit_code == 2
    assert result.stderr == f"error: no journal at {path}\n"
    assert not path.exists()
    assert not path.parent.exists()

    sibling = tmp_path / "journal.db"  # the directory exists, the file does not
    assert run_cli([*command, "--journal", str(sibling)]).exit_code == 2
    assert not sibling.exists()


def test_default_journal_is_not_created_by_reading(tmp_path: Path) -> None:
    result = run_cli(["intents", "list"])  # no --journal, no PAYONCE_JOURNAL: the default
    assert result.exit_code == 2
    assert "no journal at" in result.stderr
    assert "journal.db" in result.stderr
    assert not any(p.name == "journal.db" for p in (tmp_path / "home").rglob("*"))


def test_a_directory_is_not_a_journal(tmp_path: Path) -> None:
    result = run_cli(["intents", "list", "--journal", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")
    assert "Traceback" not in _all_output(result)


# -- secrets, version, a real process ---------------------------------------------------------


def test_no_command_ever_prints_the_api_key(populated: Populated) -> None:
    where = ["--journal", str(populated.path)]
    runs = [
        ["intents", "list", *where],
        ["intents", "list", "--json", *where],
        ["intents", "list", "--state", "unknown", *where],
    ]
    for reference in populated.keys:
        runs += [
            ["intents", "show", reference, *where],
            ["intents", "show", reference, "--body", *where],
            ["intents", "show", reference, "--json", "--body", *where],
        ]
    runs += [["intents", "show", "nope", *where], ["intents", "list", "--journal", "/nonexistent"]]
    for args in runs:
        result = run_cli(args)
        assert DEFAULT_API_KEY not in _all_output(result), args
        assert "Bearer" not in _all_output(result), args


def test_version() -> None:
    result = run_cli(["--version"])
    assert result.exit_code == 0
    assert payonce.__version__ in result.stdout


def _env() -> dict[str, str]:
    return python_env(COLUMNS="200")


def test_real_process_lists_the_journal(populated: Populated) -> None:
    env = {"PAYONCE_JOURNAL": str(populated.path)}
    done = run_cli_process(
        ["intents", "list", "--json"], env=env, command=[sys.executable, "-m", "payonce.cli"]
    )
    assert done.exit_code == 0, done.stderr
    assert [item["reference"] for item in json.loads(done.stdout)][-1] == "order-1"

    main = [sys.executable, "-c", "from payonce.cli import main; main()"]
    done = run_cli_process(["intents", "show", "x"], env=env, command=main)
    assert done.exit_code == 1
    assert done.stderr == "error: no intent with key or reference 'x'\n"


@pytest.fixture
def sandbox_process() -> Iterator[tuple[subprocess.Popen[str], str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "payonce.cli", "sandbox", "--port", "0", "--fail-after", "0.5"],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert "listening on http://127.0.0.1:" in first, first + process.stderr.read()
        yield process, first.rsplit(" ", 1)[1].strip()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def _output_once_exited(process: subprocess.Popen[str], timeout: float = 30) -> tuple[str, str]:
    """The rest of what the process wrote, once it has exited (it writes a few lines only,
    so it cannot block on a full pipe). Read through the same buffered streams as the lines
    read before: communicate() reads the raw pipes and misses what readline() buffered."""
    process.wait(timeout)
    assert process.stdout is not None
    assert process.stderr is not None
    return process.stdout.read(), process.stderr.read()


def test_sandbox_command_serves_until_interrupted(
    sandbox_process: tuple[subprocess.Popen[str], str], journal_path: Path
) -> None:
    process, url = sandbox_process
    with payonce.Client(
        base_url=url,
        provider="sandbox",
        account="acct_demo",
        api_key=DEFAULT_API_KEY,
        journal=journal_path,
        retry=NO_RETRY_AFTER,
        timeout=5.0,
    ) as client:
        for n in range(4):
            response = client.post("/v1/payments", json=_payment(f"o-{n}"), reference=f"o-{n}")
            assert response.status_code == 201
    process.send_signal(signal.SIGINT)
    out, err = _output_once_exited(process)
    assert process.returncode == 0, err
    assert f"test API key: {DEFAULT_API_KEY}" in out
    assert "fail after 50%" in out
    assert "Traceback" not in err


def test_sandbox_command_reports_a_busy_port(sandbox: SandboxServer) -> None:
    port = sandbox.url.rsplit(":", 1)[1]
    result = run_cli(["sandbox", "--port", port])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: cannot serve on 127.0.0.1:")


def test_control_characters_from_the_journal_are_printed_escaped_never_raw(
    make_client: Callable[..., payonce.Client], journal_path: Path
) -> None:
    hostile = "ref\x1b[2J\x1b]0;pwned\x07"  # clear the screen, retitle the window, ring
    client = make_client()
    with pytest.raises(payonce.ProviderError):
        client.post(
            "/v1/payments",
            content=b"note=\x1b[31mred\x1b[0m",
            headers={"Content-Type": "text/plain"},
            reference="ref-plain",
        )
    client.close()
    # payonce refuses such a reference from a caller; a journal written by an older payonce,
    # another tool or a hand may still hold one.
    with sqlite3.connect(journal_path) as db:
        db.execute("UPDATE intents SET reference = ? WHERE reference = 'ref-plain'", (hostile,))
    (record,) = make_client().journal.find(hostile)

    for args in (
        ["intents", "list"],
        ["intents", "show", hostile, "--body"],
        ["ack", "--list"],
        ["ack", record.key],
    ):
        result = run_cli([*args, "--journal", str(journal_path)])
        printed = result.stdout + result.stderr
        assert "\x1b" not in printed, args
        assert "\x07" not in printed, args
        assert "\\x1b" in printed, args
