"""A docs page run as its reader runs it: its ``$`` lines by a shell, its ``>>>`` lines in one
Python session, and what the page shows after a line checked against what the line printed.

What the page shows after a line is what the line must print, and a line must exit 0 unless
an ``echo $?`` after it says otherwise; ``…`` stands for anything, keys, payment ids and
times for any of their kind, and spacing is free (the tables are printed for an 80-column
terminal). ``PORT`` on the page (8765) is put wherever the reader's sandbox listens.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from helpers.processes import python_env

PORT = "8765"

_FENCE = re.compile(r"^```(\w+)\n(.*?)^```\n", re.DOTALL | re.MULTILINE)
_SAVE_AS = re.compile(r"save this as `([\w.]+)`:\s*$")
_STOP = "stop the sandbox (Ctrl-C in its terminal)"
_START_AGAIN = re.compile(r"start the sandbox again as before \(`(payonce sandbox[^`]*)`\)")
_KINDS_OF_ANY = re.compile(
    r"(?P<key>\b[0-9A-HJKMNP-TV-Z]{26}\b)"  # a ULID
    r"|(?P<payment>\bpay_[0-9a-f]{24}\b)"
    r"|(?P<intent>\bpi_[0-9A-Za-z]{24}\b)"  # a Stripe PaymentIntent
    r"|(?P<time>\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)"
)
_ANY_OF_KIND = {
    "key": r"[0-9A-HJKMNP-TV-Z]{26}",
    "payment": r"pay_[0-9a-f]{24}",
    "intent": r"pi_[0-9A-Za-z]{24}",
    "time": r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ",
}


@attrs.frozen
class Block:
    language: str
    code: str
    before: str
    """The page's text between the previous block and this one."""


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    blocks, end = [], 0
    for match in _FENCE.finditer(text):
        blocks.append(Block(match[1], match[2], text[end : match.start()]))
        end = match.end()
    return blocks


def sections(page: Path) -> dict[str, list[Block]]:
    """The page's blocks under each of its ``##`` headings."""
    found: dict[str, list[Block]] = {}
    for part in re.split(r"^## ", page.read_text(), flags=re.MULTILINE)[1:]:
        heading, _, text = part.partition("\n")
        found[heading] = []
        end = 0
        for match in _FENCE.finditer(text):
            found[heading].append(Block(match[1], match[2], text[end : match.start()]))
            end = match.end()
    return found


def shown(expected: str) -> re.Pattern[str]:
    """What the page shows, as a pattern of what may be printed."""
    pattern = ""
    parts = [part for part in re.split(r"(…|\s+|─+)", expected.strip()) if part]
    for at, part in enumerate(parts):
        if part == "…":
            pattern += ".*?"
        elif part.isspace():
            # Beside a "…" that stands for nothing (the last line, say), no space at all.
            beside_any = "…" in (parts[at - 1], parts[at + 1 : at + 2] and parts[at + 1])
            pattern += r"\s*" if beside_any else r"\s+"
        elif part and set(part) == {"─"}:
            pattern += "─+"
        elif part:
            end = 0
            for found in _KINDS_OF_ANY.finditer(part):
                pattern += re.escape(part[end : found.start()])
                pattern += _ANY_OF_KIND[str(found.lastgroup)]
                end = found.end()
            pattern += re.escape(part[end:])
    return re.compile(pattern, re.DOTALL)


def check(printed: str, expected: str, what: str) -> None:
    printed = re.sub(r"\x1b\[[0-9;]*m", "", printed).strip()
    assert shown(expected).fullmatch(printed), f"{what} printed:\n{printed}\npage:\n{expected}"


class Reader:
    """The reader's terminals, session and directory."""

    def __init__(self, page: Path, home: Path, port: str) -> None:
        self.page = page
        self.home = home
        self.port = port
        self.substitutions: dict[str, str] = {}
        """What else of the page stands for something of the reader's (a service's port, a
        database's URL), replaced as PORT is."""
        self.sandbox: subprocess.Popen[str] | None = None
        self.started: tuple[str, str] | None = None
        """The first sandbox command and what it printed, for "as before"."""
        self.exports: list[str] = []
        self.session: dict[str, Any] = {}
        self.bin = Path(sys.executable).parent
        self.env = python_env(
            PATH=f"{self.bin}{os.pathsep}{os.environ['PATH']}",
            COLUMNS="80",
            TTY_COMPATIBLE="1",  # the reader's terminal: tables, as the page shows them
            HOME=str(home),
            XDG_DATA_HOME=str(home / ".local" / "share"),
        )
        for name in ("PAYONCE_BASE_URL", "PAYONCE_PROVIDER", "PAYONCE_ACCOUNT", "PAYONCE_API_KEY"):
            self.env.pop(name, None)

    def here(self, text: str) -> str:
        for page_s, reader_s in self.substitutions.items():
            text = text.replace(page_s, reader_s)
        return text.replace(PORT, self.port)

    # -- the sandbox's terminal ---------------------------------------------------------------

    def start_sandbox(self, command: str, expected: str) -> None:
        self.stop_sandbox()
        self.sandbox = subprocess.Popen(
            [str(self.bin / "payonce"), *shlex.split(command)[1:]],
            cwd=self.home,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.sandbox.stdout is not None
        lines = [self.sandbox.stdout.readline() for _ in expected.strip().splitlines()]
        check("".join(lines), expected, command)
        self.started = self.started or (command, expected)

    def stop_sandbox(self) -> None:
        if self.sandbox is not None:
            self.sandbox.send_signal(signal.SIGINT)  # Ctrl-C
            self.sandbox.wait(30)
            assert self.sandbox.stdout is not None
            self.sandbox.stdout.close()
            self.sandbox = None

    # -- the shell ----------------------------------------------------------------------------

    def console(self, code: str) -> None:
        steps = re.split(r"^\$ ", self.here(code), flags=re.MULTILINE)[1:]
        status, previous = None, ""
        for step in steps:
            command, _, expected = step.partition("\n")
            if command.startswith("payonce sandbox"):
                self.start_sandbox(command, expected)
            elif command.startswith("export "):
                self.exports.append(command)
            elif command == "echo $?":
                assert str(status) == expected.strip(), f"the exit status was {status}"
                status = None
            else:
                assert status in (None, 0), f"{previous!r} exited {status}"
                status, printed = self.shell(command)
                previous = command
                if expected.strip():
                    check(printed, expected, command)
        assert status in (None, 0), f"the block's last command exited {status}"

    def shell(self, command: str) -> tuple[int, str]:
        script = "\n".join([*self.exports, command])
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=self.home,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return done.returncode, done.stdout + done.stderr

    # -- the Python session -------------------------------------------------------------------

    def python(self, block: Block) -> None:
        code = self.here(block.code)
        saved = _SAVE_AS.search(block.before)
        if _STOP in block.before:
            self.stop_sandbox()
        if saved:
            (self.home / saved[1]).write_text(code)
        elif code.startswith(">>> "):
            self.interactive(code)
        else:
            exec(compile(code, str(self.page), "exec"), self.session)
        again = _START_AGAIN.search(block.before)
        if again:
            assert self.started is not None
            assert again[1] == self.started[0].replace(self.port, PORT), "not as before"
            self.start_sandbox(self.started[0], self.started[1])

    def interactive(self, code: str) -> None:
        lines = code.splitlines()
        while lines:
            statement = [lines.pop(0).removeprefix(">>> ")]
            while lines and lines[0].startswith("... "):
                statement.append(lines.pop(0).removeprefix("... "))
            expected = []
            while lines and not lines[0].startswith(">>> "):
                expected.append(lines.pop(0))
            source = "\n".join(statement)
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed), _in(self.home):
                exec(compile(source, str(self.page), "single"), self.session)
            check(printed.getvalue(), "\n".join(expected), source)

    def close(self) -> None:
        client = self.session.get("client")
        if client is not None:
            client.close()
        self.stop_sandbox()


@contextlib.contextmanager
def _in(directory: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(before)
