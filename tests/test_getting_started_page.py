"""docs/getting-started.md, every fenced block run in order as its reader runs it.

The reader's two terminals and Python session, for real: the sandbox started by the page's
own ``payonce sandbox`` lines (stopped where the page says Ctrl-C), ``first_payment.py``
saved and run as a process, each ``$`` line run by a shell with the page's exports in a
fresh directory (so ``PAYONCE_JOURNAL=$PWD/journal.db`` is the test's own), and each ``>>>``
line run in one Python session. What the page shows after a line is what the line must
print, and a line must exit 0 unless an ``echo $?`` after it says otherwise; ``…`` stands
for anything, keys, payment ids and times for any of their kind, and spacing is free (the
tables are printed for an 80-column terminal). The sandbox listens on a free port, put
wherever the page says 8765.

The blocks that cannot run here are named, with why; a block that is neither run nor named
fails the test, so a new block is run or explained.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.pages import Reader, blocks
from helpers.payments import free_port

PAGE = Path(__file__).resolve().parents[1] / "docs" / "getting-started.md"

NOT_RUN = {
    "pip install 'payonce[sandbox]'": "installs from PyPI: this test runs the checkout's payonce",
    "make demo": "builds a virtual environment: `make test-all` is how this test runs",
    'client = payonce.Client(\n    base_url="https://api.stripe.com",': "needs a Stripe account",
}


@pytest.fixture
def reader(tmp_path: Path) -> Iterator[Reader]:
    home = tmp_path / "reader"
    home.mkdir()
    reader = Reader(PAGE, home, str(free_port()))
    yield reader
    reader.close()


@pytest.mark.slow
def test_every_block_of_getting_started_runs_as_the_page_says(reader: Reader) -> None:
    ran = 0
    for block in blocks(PAGE):
        if any(block.code.startswith(start) for start in NOT_RUN):
            continue
        if block.language == "console":
            reader.console(block.code)
        elif block.language == "python":
            reader.python(block)
        else:
            pytest.fail(f"a {block.language} block neither run nor in NOT_RUN:\n{block.code}")
        ran += 1
    assert ran >= 10
    assert all(any(b.code.startswith(s) for b in blocks(PAGE)) for s in NOT_RUN), "stale NOT_RUN"
