"""Importing an integration without its SDK: an ImportError that says what to install."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require"]


def require(module: str, *, extra: str, sdk: str) -> ModuleType:
    """Import ``module``, or raise ``ImportError`` naming the payonce extra that brings it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"payonce.integrations.{extra} needs {sdk}, which is not installed: "
            f"pip install 'payonce[{extra}]'",
            name=module,
        ) from exc
