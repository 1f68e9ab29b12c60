"""``import payonce`` without httpx's command line.

httpx imports its CLI (``httpx._main``: click, rich, pygments, about 45 ms) whenever click
and rich are installed, and payonce's own CLI installs them. A service that imports
payonce never runs httpx's CLI, so httpx is imported here with ``httpx.main`` deferred:
it imports the real CLI when called. Nothing else changes: ``httpx._main`` stays
importable as usual, and if httpx was imported first, this does nothing.
"""

from __future__ import annotations

import sys
import types
from typing import Any

__all__: list[str] = []  # importing this module does its work


def _deferred_main(*args: Any, **kwargs: Any) -> Any:
    from httpx._main import main

    return main(*args, **kwargs)


def import_httpx_without_its_cli() -> None:
    if "httpx" in sys.modules:
        return
    placeholder = types.ModuleType("httpx._main", "httpx's CLI, imported when first run")
    placeholder.main = _deferred_main  # type: ignore[attr-defined]
    sys.modules["httpx._main"] = placeholder
    try:
        import httpx
    finally:
        # The placeholder served httpx's one ``from ._main import main``, and goes.
        if sys.modules.get("httpx._main") is placeholder:
            del sys.modules["httpx._main"]
    if getattr(httpx, "_main", None) is placeholder:
        del httpx._main


import_httpx_without_its_cli()
