"""What a test does when a service it needs is missing: skip, saying why; under CI fail.

CI (``CI=true``, set by ``.ci/run``) installs every such service (``make test-packages``),
so a test that cannot run there is a broken set-up, never a reason to pass.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

__all__ = ["on_ci", "skip_or_fail"]


def on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the test for ``reason``; on CI fail it instead, since CI must run it."""
    if on_ci():
        pytest.fail(f"CI=true but this test cannot run: {reason}", pytrace=False)
    pytest.skip(reason)
