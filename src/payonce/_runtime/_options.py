"""Checks of the options a client is built with: misconfiguration fails at construction,
with a ``ConfigurationError`` that names the option, never later inside an attempt."""

from __future__ import annotations

import math
from typing import Any

import attrs
import httpx

from ..errors import ConfigurationError

__all__ = [
    "check_base_url",
    "check_count",
    "check_number",
    "check_seconds",
    "check_timeout",
    "number_field",
]


def check_number(name: str, value: object, *, minimum: float, above: bool = False) -> float:
    """A finite number of at least ``minimum`` (greater than it, with ``above``)."""
    valid = (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and (value > minimum if above else value >= minimum)
    )
    if not valid:
        bound = f"greater than {minimum:g}" if above else f"at least {minimum:g}"
        raise ConfigurationError(f"{name} must be a finite number {bound}, not {value!r}")
    return float(value)  # type: ignore[arg-type]


def check_seconds(name: str, value: object, *, positive: bool = False) -> float:
    """A finite number of seconds, not negative (positive, with ``positive``)."""
    return check_number(name, value, minimum=0.0, above=positive)


def check_count(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} must be a whole number of at least {minimum}")
    return value


def number_field(default: float, *, minimum: float = 0.0, above: bool = False) -> Any:
    """An attrs field holding a finite number, checked with ``check_number``."""

    def validate(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
        check_number(attribute.name, value, minimum=minimum, above=above)

    return attrs.field(default=default, validator=validate)


def check_timeout(timeout: float | httpx.Timeout) -> httpx.Timeout:
    """An ``httpx.Timeout`` whose every set part is a finite, positive number of seconds."""
    if isinstance(timeout, httpx.Timeout):
        parts = {
            "connect": timeout.connect,
            "read": timeout.read,
            "write": timeout.write,
            "pool": timeout.pool,
        }
        for part, value in parts.items():
            if value is not None:
                check_seconds(f"timeout.{part}", value, positive=True)
        return timeout
    return httpx.Timeout(check_seconds("timeout", timeout, positive=True))


def check_base_url(base_url: object) -> str:
    """An http(s) URL with a host and no credentials; returned without a trailing slash."""
    if not isinstance(base_url, str):
        raise ConfigurationError(f"base_url must be a string, not {type(base_url).__name__}")
    try:
        url = httpx.URL(base_url)
    except httpx.InvalidURL:
        # Not quoted back, nor httpx's message about it: it may hold a pasted secret.
        raise ConfigurationError("base_url is not a valid URL") from None
    if url.scheme not in ("http", "https") or not url.host:
        # Not quoted back: whatever was pasted there by mistake may be a secret.
        raise ConfigurationError(
            "base_url must be an http:// or https:// URL with a host, such as "
            "https://api.stripe.com"
        )
    if url.userinfo:
        raise ConfigurationError(
            "base_url must not carry credentials (user:password@): pass api_key= instead"
        )
    return base_url.rstrip("/")
