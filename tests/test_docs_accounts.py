"""Every snippet and example that builds a payonce client names its account (issue 29).

A client built without ``account=`` journals its intents under the account ``default``,
which nobody chose: recovering them then takes that name (``--account default``) and its
key, found only by running the commands. So no code a reader copies leaves it out.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"^```python\n(.*?)^```\n", re.DOTALL | re.MULTILINE)
_BUILT = re.compile(r"\bpayonce\.(?:Async)?Client\(")


def _code() -> dict[str, str]:
    """Each page's Python blocks, and each example's source, by where they are."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    code = {
        str(page.relative_to(ROOT)): "\n".join(_FENCE.findall(page.read_text())) for page in pages
    }
    for example in sorted((ROOT / "examples").rglob("*.py")):
        code[str(example.relative_to(ROOT))] = example.read_text()
    return code


def _calls(source: str) -> list[str]:
    """The text of each ``payonce.Client(...)`` / ``payonce.AsyncClient(...)`` call."""
    calls = []
    for found in _BUILT.finditer(source):
        depth, end = 1, found.end()
        while depth and end < len(source):
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            end += 1
        calls.append(source[found.start() : end])
    return calls


def test_the_pages_and_examples_build_clients_at_all() -> None:
    built = {where: calls for where, source in _code().items() if (calls := _calls(source))}
    assert "README.md" in built
    assert "docs/integrations.md" in built
    assert any(where.startswith("examples/") for where in built)


def test_every_client_a_reader_copies_names_its_account() -> None:
    unnamed = [
        f"{where}: {call.splitlines()[0]}"
        for where, source in _code().items()
        for call in _calls(source)
        if "account=" not in call
    ]
    assert unnamed == []
