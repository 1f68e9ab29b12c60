"""Misconfiguration fails at construction with a ConfigurationError that names the option,
before a journal is opened or created."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import httpx
import pytest

import payonce

GOOD: dict[str, Any] = {"base_url": "https://psp.example", "api_key": "sk_test"}


@pytest.mark.parametrize("cls", [payonce.Client, payonce.AsyncClient])
@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"base_url": "psp.example/v1"}, "base_url"),
        ({"base_url": "ftp://psp.example"}, "base_url"),
        ({"base_url": "https://"}, "base_url"),
        ({"base_url": "https://user:secret@psp.example"}, "base_url"),
        ({"base_url": "http://[::1"}, "base_url"),
        ({"timeout": -1.0}, "timeout"),
        ({"timeout": math.nan}, "timeout"),
        ({"timeout": math.inf}, "timeout"),
        ({"timeout": httpx.Timeout(5.0, read=-2.0)}, "timeout.read"),
        ({"lease_seconds": 0}, "lease_seconds"),
        ({"lease_seconds": -5.0}, "lease_seconds"),
        ({"lease_seconds": math.inf}, "lease_seconds"),
        ({"max_stored_response_bytes": -1}, "max_stored_response_bytes"),
        ({"in_flight_wait": -0.5}, "in_flight_wait"),
        ({"in_flight_wait": math.nan}, "in_flight_wait"),
        ({"retry": 3}, "RetryPolicy"),
        ({"key_format": "sequential"}, "key_format"),
        ({"provider": "stirpe"}, "unknown provider"),
        ({"on_retry": "print"}, "on_retry"),
    ],
)
def test_a_wrong_option_is_refused_at_construction_and_nothing_is_opened(
    cls: type[payonce.Client] | type[payonce.AsyncClient],
    options: dict[str, Any],
    named: str,
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal.db"
    with pytest.raises(payonce.ConfigurationError, match=named.replace("[", r"\[")):
        cls(**{**GOOD, "journal": journal, **options})
    assert not journal.exists()


def test_the_secret_in_a_base_url_is_never_quoted_back(tmp_path: Path) -> None:
    with pytest.raises(payonce.ConfigurationError) as raised:
        payonce.Client(base_url="https://user:hunter2@[psp", api_key="k", journal=tmp_path / "j.db")
    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 2.5}, "max_attempts"),
        ({"max_elapsed": 0}, "max_elapsed"),
        ({"max_elapsed": math.inf}, "max_elapsed"),
        ({"initial_wait": -0.1}, "initial_wait"),
        ({"initial_wait": math.nan}, "initial_wait"),
        ({"max_wait": math.inf}, "max_wait"),
        ({"multiplier": 0.5}, "multiplier"),
        ({"multiplier": math.nan}, "multiplier"),
        ({"max_retry_after": -1}, "max_retry_after"),
    ],
)
def test_a_retry_policy_with_a_negative_nan_or_infinite_number_is_refused(
    options: dict[str, Any], named: str
) -> None:
    with pytest.raises(payonce.ConfigurationError, match=named):
        payonce.RetryPolicy(**options)


def test_sound_options_are_accepted(tmp_path: Path) -> None:
    with payonce.Client(
        **GOOD,
        journal=tmp_path / "journal.db",
        timeout=httpx.Timeout(5.0, pool=None),
        lease_seconds=10,
        max_stored_response_bytes=0,
        in_flight_wait=0,
        retry=payonce.RetryPolicy(initial_wait=0, max_wait=0),
    ) as client:
        assert client.account == "default"
