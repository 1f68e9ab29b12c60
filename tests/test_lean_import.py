"""``import payonce`` loads what a service needs and no more: not httpx's command line
(click, rich, pygments), nor what only the first key, the default journal path, the async
client or the webhook inbox needs.
Each check runs in a fresh interpreter, since this process has imported everything."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(
    "module",
    [
        "click",  # httpx's CLI and payonce's: neither is run by a service
        "rich",
        "pygments",
        "ulid",  # until the first key is made
        "platformdirs",  # until a journal is opened at the default path
        "psycopg",  # the postgres extra, until a postgresql:// journal is opened
        "starlette",  # the sandbox extra
        "asyncio",  # until AsyncClient or the webhook inbox is used
        "payonce.webhooks",
        "opentelemetry",  # the otel extra, until payonce.otel is imported
    ],
)
def test_import_payonce_leaves_out(module: str) -> None:
    loaded = _python(f"import sys, payonce; print({module!r} in sys.modules)")
    assert loaded.strip() == "False"


def test_httpx_s_own_command_line_still_runs_after_import_payonce() -> None:
    usage = _python(
        "import payonce, httpx\n"
        "try:\n"
        "    httpx.main(['--help'])\n"
        "except SystemExit as done:\n"
        "    assert done.code == 0, done.code\n"
    )
    assert "Usage: httpx" in usage


def test_httpx_s_cli_module_is_the_real_one_when_imported_after_payonce() -> None:
    found = _python("import payonce, httpx, httpx._main as cli; print(cli.Client is httpx.Client)")
    assert found.strip() == "True"


def test_nothing_is_changed_when_httpx_was_imported_first() -> None:
    kind = _python("import httpx, payonce; print(type(httpx.main).__name__)")
    assert kind.strip() == "Command", "httpx's own click command, untouched"


def test_keys_are_still_ulids_once_the_first_is_made() -> None:
    key = _python("import payonce._lifecycle as l; print(l.new_key('ulid'))").strip()
    assert len(key) == 26
    assert key.isalnum()


def test_the_names_imported_on_first_use_are_the_public_ones() -> None:
    names = _python(
        "import payonce, payonce.webhooks as hooks, payonce._runtime._async as aio\n"
        "assert payonce.AsyncClient is aio.AsyncClient\n"
        "assert payonce.AsyncOperation is aio.AsyncOperation\n"
        "assert payonce.WebhookInbox is hooks.WebhookInbox\n"
        "assert payonce.webhooks is hooks\n"
        "from payonce import *\n"
        "print(sorted(set(payonce.__all__) - set(dir(payonce))))"
    )
    assert names.strip() == "[]"
