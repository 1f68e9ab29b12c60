"""Tables never cut text, and every listing has --json.

At 80 columns a long detail and a 26-character key (a ULID's length) come out whole: on a
terminal every word of the detail (wrapped at spaces only) and the key on one line; piped,
a header line and one tab-separated line per record, fit for grep and cut. Run through the
views with rich consoles forced to be a terminal or not, and through the commands with
click's runner (rich's TTY_COMPATIBLE=1 makes it a terminal).
"""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import click
import pytest
from rich.console import Console

import payonce
from helpers.cli import run_cli
from helpers.journals import draft_for, settle, store_of
from payonce._lifecycle import Transition
from payonce.cli import cli
from payonce.cli._recovery_views import Row, print_rows

KEY = "01JQ7ZK3M5N8P2R4T6V8X0Y2AB"
DETAIL = (
    "the provider has no record and the key is still valid: payonce resume sends it again "
    "once, with its journaled bytes under the same idempotency key, so it is executed at most "
    "once whatever happened before"
)
UNKNOWN = payonce.IntentState.UNKNOWN
PENDING = payonce.IntentState.PENDING

RESUMED = [Row(KEY, "order-2026-000123", None, PENDING, None, DETAIL, None)]
RECONCILED = [
    Row(KEY, "order-2026-000123", UNKNOWN, PENDING, "not_found", DETAIL, None),
    Row("01JQ7ZK3M5N8P2R4T6V8X0Y2CD", "order-7", UNKNOWN, UNKNOWN, "unreachable", DETAIL, DETAIL),
]


def _unstyled(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _printed(rows: Sequence[Row], *, terminal: bool, width: int = 80) -> str:
    out = Console(width=width, force_terminal=terminal, file=io.StringIO(), highlight=False)
    print_rows(out, rows, title=f"{len(rows)} intent(s)")
    assert isinstance(out.file, io.StringIO)
    return _unstyled(out.file.getvalue())


def _every_word_whole(text: str, output: str, times: int = 1) -> None:
    """Each word of ``text`` is a whole word of ``output`` (wrapped at spaces, never cut)."""
    printed = Counter(output.split())
    for word, count in Counter(text.split()).items():
        assert printed[word] >= count * times, (word, output)


@pytest.mark.parametrize("rows", [RESUMED, RECONCILED], ids=["resume", "reconcile"])
def test_on_an_80_column_terminal_the_detail_wraps_at_words_and_the_key_stays_whole(
    rows: list[Row],
) -> None:
    screen = _printed(rows, terminal=True)

    lines = screen.splitlines()
    assert all(len(line) <= 80 for line in lines), screen
    for row in rows:
        assert any(row.key in line for line in lines), screen  # on one line, never split
        assert str(row.reference) in screen
    _every_word_whole(DETAIL, screen, times=len(rows))
    assert "…" not in screen


@pytest.mark.parametrize("rows", [RESUMED, RECONCILED], ids=["resume", "reconcile"])
def test_piped_each_result_is_one_tab_separated_line_under_a_header(rows: list[Row]) -> None:
    header, *lines = _printed(rows, terminal=False).splitlines()

    reconciled = rows[0].before is not None
    states = ["before", "after", "outcome"] if reconciled else ["state"]
    assert header.split("\t") == ["key", "reference", *states, "detail"]
    for row, line in zip(rows, lines, strict=True):
        fields = line.split("\t")
        assert (fields[0], fields[1], fields[-1]) == (row.key, row.reference, DETAIL)
        if reconciled:
            assert row.before is not None
            assert fields[2:5] == [row.before.value, row.after.value, row.outcome]


def test_a_terminal_too_narrow_for_any_table_gets_each_record_field_by_field() -> None:
    screen = _printed(RECONCILED, terminal=True, width=40)

    lines = screen.splitlines()
    assert KEY in lines  # the key alone on its line, whole
    assert all(len(line) <= 40 for line in lines), screen
    _every_word_whole(DETAIL, screen, times=2)
    assert "…" not in screen
    assert "outcome    not_found" in screen


def test_a_reference_too_long_to_sit_beside_its_name_gets_a_line_of_its_own_whole() -> None:
    reference = "order-" + "a-very-long-reference-for-the-width-check-" + "1234567890" * 3
    assert 72 < len(reference) <= 80
    rows = [Row(KEY, reference, UNKNOWN, UNKNOWN, "unreachable", DETAIL, None)]

    screen = _printed(rows, terminal=True, width=80)

    assert reference in screen.splitlines(), screen
    _every_word_whole(DETAIL, screen)
    assert "…" not in screen


# -- through the commands ---------------------------------------------------------------------


def _unknown_intent(journal_path: Path) -> str:
    """An unknown intent with a long reason, and a settled one: the real keys are ULIDs."""
    with payonce.open_journal(str(journal_path)) as journal:
        store = store_of(journal)
        store.claim(draft_for(1, key=KEY), owner="w", now=1000.0, lease_seconds=30)
        store.mark_unknown(
            KEY, transition=Transition.EXHAUSTED, owner="w", now=1001.0, reason=DETAIL
        )
        store.claim(draft_for(2), owner="w", now=1002.0, lease_seconds=30)
        settle(store, "key-00002", "w", 1003.0)
    return KEY


def test_intents_list_at_80_columns_keeps_the_key_and_every_word_of_the_reason(
    journal_path: Path,
) -> None:
    key = _unknown_intent(journal_path)
    where = ["--journal", str(journal_path)]

    terminal = run_cli(["intents", "list", *where], columns=80, terminal=True)
    piped = run_cli(["intents", "list", *where], columns=80, terminal=False)

    assert terminal.exit_code == 0, terminal.output
    screen = _unstyled(terminal.stdout)
    assert all(len(line) <= 80 for line in screen.splitlines()), screen
    assert any(key in line for line in screen.splitlines())
    _every_word_whole(DETAIL, screen)
    assert "…" not in screen

    assert piped.exit_code == 0, piped.output
    assert "\x1b" not in piped.stdout
    header, *lines = piped.stdout.splitlines()
    names = header.split("\t")
    assert names[:3] == ["key", "reference", "state"]
    records = [dict(zip(names, line.split("\t"), strict=True)) for line in lines]
    assert [(r["key"], r["state"]) for r in records] == [
        ("key-00002", "succeeded"),
        (key, "unknown"),
    ]
    assert records[1]["unknown_reason"] == DETAIL
    assert records[1]["account"] == "acct_demo"


def test_a_value_with_tabs_and_newlines_stays_on_its_record_line(journal_path: Path) -> None:
    with payonce.open_journal(str(journal_path)) as journal:
        store = store_of(journal)
        store.claim(draft_for(1, reference="a\tb\nc"), owner="w", now=1.0, lease_seconds=30)
    piped = run_cli(["intents", "list", "--journal", str(journal_path)], columns=80, terminal=False)
    header, line = piped.stdout.splitlines()
    assert line.split("\t")[1] == "a\\x09b\\x0ac"
    assert len(line.split("\t")) == len(header.split("\t"))


def test_intents_show_at_80_columns_keeps_every_word_terminal_and_piped(
    journal_path: Path,
) -> None:
    key = _unknown_intent(journal_path)
    where = ["--journal", str(journal_path)]
    for terminal in (True, False):
        shown = run_cli(["intents", "show", key, *where], columns=80, terminal=terminal)
        assert shown.exit_code == 0, shown.output
        output = _unstyled(shown.stdout)
        assert any(key in line for line in output.splitlines())
        _every_word_whole(DETAIL, output)
        assert "…" not in output
    assert f"key\t{key}\n" in shown.stdout  # piped: name<TAB>value
    assert f"unknown_reason\t{DETAIL}\n" in shown.stdout  # field names as in the listings


# -- --json on every listing ------------------------------------------------------------------

NO_LISTING = {
    ("abandon",),  # acts on one intent and says so in a line
    ("journal", "backup"),
    ("journal", "init"),  # creates the journal and says so in a line
    ("journal", "migrate"),
    ("keys", "set"),
    ("keys", "delete"),
    ("sandbox",),  # a server
    ("demo",),  # a report of the demonstration
    ("worker",),  # a long-running process: log lines, its counts through the hooks
}


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += _commands(command, (*prefix, name))
        else:
            found.append((*prefix, name))
    return found


def test_every_command_that_lists_something_takes_json() -> None:
    commands = _commands(cli)
    assert set(commands) >= NO_LISTING
    for path in commands:
        command: click.Command = cli
        for name in path:
            assert isinstance(command, click.Group)
            command = command.commands[name]
        takes_json = any("--json" in param.opts for param in command.params)
        assert takes_json == (path not in NO_LISTING), path


LISTINGS = [
    ["intents", "list", "--json"],
    ["intents", "show", "order-00002", "--json"],
    ["ack", "--list", "--json"],
    ["journal", "check", "--json"],
    ["prune", "--older-than", "1d", "--dry-run", "--json"],
    ["resume", "--base-url", "http://127.0.0.1:9", "--json"],
    ["reconcile", "--all", "--base-url", "http://127.0.0.1:9", "--json"],
]


@pytest.mark.parametrize("command", LISTINGS, ids=lambda c: " ".join(c[:2]))
def test_json_output_is_one_json_document_on_stdout_even_on_a_terminal(
    journal_path: Path, command: list[str]
) -> None:
    _unknown_intent(journal_path)
    with payonce.open_journal(
        str(journal_path)
    ) as journal:  # nothing for resume or reconcile to send
        journal.abandon(KEY, reason="checked by hand", now=2000.0)

    result = run_cli([*command, "--journal", str(journal_path)], columns=80, terminal=True)

    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert isinstance(document, list | dict)
