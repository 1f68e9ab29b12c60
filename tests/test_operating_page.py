"""The schema version the operators' pages show is the one this payonce writes.

docs/operating.md showed `schema version  3` from `payonce journal check` long after
payonce wrote 5: an operator comparing it with their own journal would have been misled.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import payonce
from helpers.cli import run_cli

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _written(journal_path: Path) -> int:
    payonce.open_journal(journal_path).close()  # created as a client creates it
    result = run_cli(["journal", "check", "--journal", str(journal_path), "--json"])
    assert result.exit_code == 0, result.output
    version: int = json.loads(result.stdout)["latest_schema_version"]
    return version


@pytest.mark.parametrize("page", ["operating.md", "cli.md"])
def test_journal_check_as_the_page_shows_it_has_this_payonce_s_schema(
    page: str, journal_path: Path
) -> None:
    text = (DOCS / page).read_text()
    shown = [int(n) for n in re.findall(r"^schema version  (\d+)$", text, re.MULTILINE)]
    writes = [int(n) for n in re.findall(r"this payonce writes (\d+)", text)]

    assert shown, f"{page} shows no `journal check`"
    assert set(shown + writes) == {_written(journal_path)}
