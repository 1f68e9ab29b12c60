"""docs/integrations.md (and docs/steps.md, its reference) and README's first example,
each "after" block run as its reader would run it against the sandbox speaking its
provider's dialect (``SandboxConfig.like(...)``), twice: the second run is the code run
again for the same order (a new process would do the same: each run has a namespace of its
own).

What a reader changes to run a block here is said per block (``RUN``): the provider's URL
becomes the sandbox's, a live key the sandbox's, and the names a block takes from the code
around it (``order``, ``api_key``, ``nonce``...) are given. Every step must execute once at
the provider, the journal must hold every intent succeeded, and the run again must execute
nothing. A Python block that is neither run nor named with why (``NOT_RUN``) fails the test.
"""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import Adyen
import attrs
import httpx
import mollie.api.client
import pytest
import requests
import stripe
from square import Square

import payonce
import payonce.integrations.adyen
import payonce.integrations.mollie
import payonce.integrations.square
import payonce.integrations.stripe
from helpers.processes import python_env
from helpers.sandboxes import SharedSandboxes
from payonce.sandbox import DEFAULT_API_KEY, MOLLIE_TEST_API_KEY, SandboxConfig, SandboxServer

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "integrations.md"
STEPS = ROOT / "docs" / "steps.md"
"""The rules of a block, moved out of PAGE: its one snippet is a fragment run elsewhere."""
README = ROOT / "README.md"
URL = "{url}"
"""Where a substitution puts the sandbox's URL."""

_FENCE = re.compile(r"^```(\w+)\n(.*?)^```\n", re.DOTALL | re.MULTILINE)


@attrs.frozen
class Example:
    """A block to run: against which dialect, with which of the reader's changes."""

    dialect: str
    changes: dict[str, str] = attrs.field(factory=dict)


RUN = {
    "import httpx\nimport payonce\n\nclient = payonce.Client(": Example(
        "stripe", {'"https://api.stripe.com"': f'"{URL}"'}
    ),
    "import payonce\nimport payonce.integrations.stripe\n": Example(
        "stripe",
        {
            '"https://api.stripe.com"': f'"{URL}"',
            '"sk_live_…", http_client=': (
                f'api_key, base_addresses={{"api": "{URL}"}}, http_client='
            ),
        },
    ),
    "import payonce.integrations.adyen\n": Example(
        "adyen",
        {
            '"https://…-checkout-live.adyenpayments.com/checkout/v72"': f'"{URL}/v72"',
            'xapikey="AQE…", platform="live", live_endpoint_prefix="…"': (
                "xapikey=api_key, platform='test'"
            ),
            "payonce.integrations.adyen.use_transport(": f"on_sandbox(adyen, '{URL}')\n"
            "payonce.integrations.adyen.use_transport(",
        },
    ),
    "import payonce.integrations.mollie\n": Example(
        "mollie",
        {
            '"https://api.mollie.com"': f'"{URL}"',
            "mollie.api.client.Client()": f'mollie.api.client.Client(api_endpoint="{URL}")',
            '"live_…"': "mollie_key",
        },
    ),
    "import payonce.integrations.square\n": Example(
        "square",
        {
            '"https://connect.squareup.com"': f'"{URL}"',
            'Square(token="EAAA…", httpx_client=http)': (
                f'Square(token=api_key, base_url="{URL}", httpx_client=http)'
            ),
        },
    ),
    "session = requests.Session()\n": Example(
        "stripe",
        # The sandbox speaks plain HTTP on loopback; the provider, HTTPS.
        {'session.mount("https://"': 'session.mount("http://"'},
    ),
}

NOT_RUN = {
    'client = stripe.StripeClient("sk_live_…")': "the SDK alone, at the provider: "
    "test_integrations_sdks.py's baselines run its calls against the sandbox",
    'adyen = Adyen.Adyen(xapikey="AQE…"': "the SDK alone (as above)",
    "mollie_client = mollie.api.client.Client()\nmollie_client.set_api_key": "the SDK alone",
    'square = Square(token="EAAA…")': "the SDK alone (as above)",
    'URL = "http://127.0.0.1:8801"\n\n# stripe-python': "where each SDK is pointed at the "
    "sandbox: the settings every example above is run with (RUN's changes, on_sandbox)",
}

STEPS_NOT_RUN = {
    'with payments.intent(f"order-{order.id}"):\n    context = contextvars.copy_context()': (
        "a fragment of a block: test_outside_block_threads.py runs the same code with "
        "stripe-python against the sandbox, twice"
    ),
}

README_EXAMPLE = Example(
    "stripe",
    {
        '"https://api.stripe.com"': f'"{URL}"',
        "stripe.StripeClient(api_key, http_client=": (
            f'stripe.StripeClient(api_key, base_addresses={{"api": "{URL}"}}, http_client='
        ),
    },
)


def python_blocks(page: Path) -> list[str]:
    return [body for kind, body in _FENCE.findall(page.read_text()) if kind == "python"]


def example_of(block: str) -> Example | None:
    for start, example in RUN.items():
        if block.startswith(start):
            return example
    return None


def on_sandbox(adyen: Adyen.Adyen, url: str) -> None:
    """Adyen's services hold their base URLs: point them at the sandbox, as the tests of
    the integration do."""
    for api in (adyen.checkout.payments_api, adyen.checkout.modifications_api):
        api.baseUrl = re.sub(r"^https://[^/]+", url, api.baseUrl)


def the_reader_s_names(url: str, journal: Path) -> dict[str, Any]:
    """What a block takes from the code around it."""
    return {
        "httpx": httpx,
        "payonce": payonce,
        "requests": requests,
        "stripe": stripe,
        "Adyen": Adyen,
        "mollie": mollie,
        "Square": Square,
        "uuid": __import__("uuid"),
        "api_key": DEFAULT_API_KEY,
        "mollie_key": MOLLIE_TEST_API_KEY,
        "order": types.SimpleNamespace(id="cmd_4711"),
        "nonce": "cnon:card-nonce-ok",
        "request": {
            "amount": {"value": 1000, "currency": "EUR"},
            "reference": "order-cmd_4711",
            "merchantAccount": "PayonceShop",
            "paymentMethod": {"type": "scheme", "encryptedCardNumber": "test_4111111111111111"},
            "returnUrl": "https://shop.example/return",
        },
        "on_sandbox": on_sandbox,
        # The requests-based block's session, client and request.
        "client": payonce.Client(
            base_url=url, provider="stripe", journal=journal, transport_only=True
        ),
        "base": url,
        "auth": {"Authorization": f"Bearer {DEFAULT_API_KEY}"},
    }


def close_what_it_opened(names: dict[str, Any]) -> None:
    """What a block leaves open (its process would end instead): HTTP clients, sessions,
    payonce clients."""
    for value in names.values():
        if isinstance(value, httpx.Client | requests.Session | payonce.Client):
            value.close()
        elif isinstance(value, stripe.StripeClient):
            value._requestor._client.close()  # type: ignore[attr-defined]
        elif isinstance(value, Adyen.Adyen):
            value.client.http_client.close()
        elif isinstance(value, mollie.api.client.Client):
            value._client.close()


def run_twice(block: str, example: Example, server: SandboxServer, journal: Path) -> None:
    code = block.replace("data=...", 'data={"amount": 4200, "currency": "eur"}')
    for old, new in example.changes.items():
        assert old in code, f"the block no longer has {old!r}: update RUN"
        code = code.replace(old, new.replace(URL, server.url))
    executions: dict[str, int] | None = None
    for _ in range(2):  # the code, then the code run again for the same order
        names = the_reader_s_names(server.url, journal)
        given = names["client"]
        exec(compile(code, "<docs example>", "exec"), names)
        close_what_it_opened({**names, "given client": given})
        server.wait_idle()
        if executions is None:
            executions = server.store.executions()
    assert executions, "the block executed nothing at the provider"
    assert server.store.executions() == executions, "the run again executed something"
    assert all(count == 1 for key, count in executions.items() if key), executions
    with payonce.open_journal(journal) as read:
        states = {record.key: record.state for record in read.list_intents()}
    assert states
    assert set(states.values()) == {payonce.IntentState.SUCCEEDED}, states


def test_every_python_block_of_the_page_is_run_or_says_why_not() -> None:
    for block in python_blocks(PAGE):
        named = [why for start, why in NOT_RUN.items() if block.startswith(start)]
        assert example_of(block) is not None or named, f"neither run nor named:\n{block}"
    for block in python_blocks(STEPS):
        named = [why for start, why in STEPS_NOT_RUN.items() if block.startswith(start)]
        assert named, f"a block of steps.md neither run nor named:\n{block}"


def test_the_page_opens_with_what_a_newcomer_must_know_and_sends_the_rules_to_steps() -> None:
    # A newcomer read the page twice to learn that create-then-confirm needs none of the
    # step rules: the page opens with the five things to know, and the rules live apart.
    text = PAGE.read_text()
    must_know = text.split("## What you must know\n", 1)[1].split("\n```", 1)[0]
    assert len(must_know.strip().splitlines()) <= 25, must_know
    for point in (
        "One block per business operation",
        "The same reference format",
        "run the whole block again",
        "Name the account",
        "Copy the context into thread pools",
        "(steps.md)",
    ):
        assert point in must_know, point
    steps = STEPS.read_text()
    for rule in (
        "## When the code takes another path",
        "## A declined step may be redone differently",
        "## The same request twice",
        "## Threads",
        "## Outside any block",
    ):
        assert rule in steps, rule
        assert rule not in text, rule


@pytest.mark.parametrize("start", list(RUN), ids=lambda start: start.split("\n")[0][:40])
def test_an_integrations_page_example_runs_and_its_run_again_executes_nothing(
    start: str,
    shared_sandboxes: SharedSandboxes,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (block,) = [block for block in python_blocks(PAGE) if block.startswith(start)]
    example = RUN[start]
    server = shared_sandboxes.get(
        f"sdk {example.dialect}",
        SandboxConfig.like(example.dialect),  # type: ignore[arg-type]
    )
    journal = tmp_path / "journal.db"
    monkeypatch.setenv("PAYONCE_JOURNAL", str(journal))  # the blocks name no journal
    run_twice(block, example, server, journal)


def test_the_readme_s_first_example_runs_and_its_run_again_executes_nothing(
    shared_sandboxes: SharedSandboxes,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (block,) = [b for b in python_blocks(README) if "payonce.integrations.stripe" in b]
    server = shared_sandboxes.get("sdk stripe", SandboxConfig.like("stripe"))
    journal = tmp_path / "journal.db"
    monkeypatch.setenv("PAYONCE_JOURNAL", str(journal))
    run_twice(block, README_EXAMPLE, server, journal)


@pytest.mark.slow
def test_the_readme_s_first_example_runs_as_written_in_a_fresh_interpreter(
    shared_sandboxes: SharedSandboxes, tmp_path: Path
) -> None:
    # Its imports are its own: nothing this test module imported may stand in for them.
    (block,) = [b for b in python_blocks(README) if "payonce.integrations.stripe" in b]
    server = shared_sandboxes.get("sdk stripe", SandboxConfig.like("stripe"))
    code = block
    for old, new in README_EXAMPLE.changes.items():
        code = code.replace(old, new.replace(URL, server.url))
    preamble = (
        f"import types\napi_key = {DEFAULT_API_KEY!r}\norder = types.SimpleNamespace(id='rd_1')\n"
    )
    env = python_env(PAYONCE_JOURNAL=str(tmp_path / "journal.db"))
    counts: list[dict[str, int]] = [server.store.executions()]
    for _ in range(2):  # the code, then the code run again for the same order
        done = subprocess.run(
            [sys.executable, "-c", preamble + code],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        server.wait_idle()
        counts.append(server.store.executions())
    before, first, again = counts
    made = {key: n for key, n in first.items() if before.get(key) != n}
    assert len(made) == 2, made  # the create and the confirm, once each
    assert again == first  # the run again executed nothing


def test_the_examples_name_an_order_s_intent_the_same_way_everywhere() -> None:
    # A reader who copies two examples must not get two reference formats: a run again
    # under another format starts new intents, and pays again.
    formats = {
        found
        for page in (README, PAGE, STEPS, ROOT / "docs" / "providers.md")
        for found in re.findall(r"\.intent\(f\"([^\"]*)\"\)", page.read_text())
    }
    assert formats == {"order-{order.id}"}
