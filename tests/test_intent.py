"""Keys and fingerprints: the identity of an intent."""

from __future__ import annotations

import time
import uuid

import pytest
from ulid import ULID

import payonce
from payonce._lifecycle import canonical_request, make_scope, new_key, validate_key


def test_default_keys_are_ulids_and_unique() -> None:
    keys = {new_key() for _ in range(1000)}
    assert len(keys) == 1000
    for key in keys:
        assert str(ULID.from_str(key)) == key


def test_a_ulid_key_carries_the_millisecond_it_was_made_and_sorts_by_it() -> None:
    before = time.time_ns() // 1_000_000
    first = new_key()
    time.sleep(0.002)
    second = new_key()
    after = time.time_ns() // 1_000_000
    assert before <= ULID.from_str(first).milliseconds <= ULID.from_str(second).milliseconds
    assert ULID.from_str(second).milliseconds <= after
    assert first < second


def test_uuid4_keys_on_request() -> None:
    key = new_key("uuid4")
    assert uuid.UUID(key).version == 4


def test_unknown_key_format_is_a_configuration_error() -> None:
    with pytest.raises(payonce.ConfigurationError, match="key_format"):
        new_key("sequential")  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["a", "order-42_retry.1", "x" * 255, "~!#$%&'*+-.^_`|"])
def test_valid_caller_keys_are_accepted(key: str) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize(
    ("key", "complaint"),
    [
        ("", "non-empty"),
        ("x" * 256, "at most 255"),
        ("has space", "printable ASCII"),
        ("tab\there", "printable ASCII"),
        ("clé", "printable ASCII"),
        ("line\nbreak", "printable ASCII"),
    ],
)
def test_invalid_caller_keys_are_refused_clearly(key: str, complaint: str) -> None:
    with pytest.raises(payonce.ConfigurationError, match=complaint):
        validate_key(key)


def test_a_provider_limit_shorter_than_255_applies() -> None:
    with pytest.raises(payonce.ConfigurationError, match="at most 64"):
        validate_key("k" * 65, max_length=64)


def test_scope_separates_accounts_methods_and_paths() -> None:
    scopes = {
        make_scope("acct_a", "post", "/v1/payments"),
        make_scope("acct_b", "POST", "/v1/payments"),
        make_scope("acct_a", "PUT", "/v1/payments"),
        make_scope("acct_a", "POST", "/v1/refunds"),
    }
    assert len(scopes) == 4


def test_json_fingerprint_ignores_key_order_and_whitespace() -> None:
    a = canonical_request("POST", "/v1/payments", json_body={"amount": 1, "currency": "eur"})
    b = canonical_request("post", "/v1/payments", json_body={"currency": "eur", "amount": 1})
    assert a.fingerprint == b.fingerprint
    assert a.body == b'{"amount":1,"currency":"eur"}'


def test_fingerprint_changes_with_anything_that_changes_the_operation() -> None:
    base = canonical_request("POST", "/v1/payments", json_body={"amount": 1})
    others = [
        canonical_request("POST", "/v1/payments", json_body={"amount": 2}),
        canonical_request("PUT", "/v1/payments", json_body={"amount": 1}),
        canonical_request("POST", "/v1/refunds", json_body={"amount": 1}),
        canonical_request("POST", "/v1/payments", json_body={"amount": 1}, params={"x": "1"}),
        canonical_request("POST", "/v1/payments", form={"amount": "1"}),
    ]
    assert all(other.fingerprint != base.fingerprint for other in others)


def test_form_bodies_keep_their_order_on_the_wire_but_not_in_the_fingerprint() -> None:
    a = canonical_request("POST", "/v1/charges", form=[("b", "2"), ("a", "1")])
    b = canonical_request("POST", "/v1/charges", form={"a": "1", "b": "2"})
    assert a.body == b"b=2&a=1"
    assert a.fingerprint == b.fingerprint
    assert a.content_type == "application/x-www-form-urlencoded"


def test_query_strings_are_canonicalised_too() -> None:
    a = canonical_request("POST", "/v1/p?b=2&a=1")
    b = canonical_request("POST", "/v1/p", params={"a": "1", "b": "2"})
    assert a.fingerprint == b.fingerprint


def test_unencodable_json_is_a_clear_error() -> None:
    with pytest.raises(payonce.ConfigurationError, match="JSON"):
        canonical_request("POST", "/v1/payments", json_body={"amount": float("nan")})


def test_only_one_body_kind_at_a_time() -> None:
    with pytest.raises(payonce.ConfigurationError, match="at most one"):
        canonical_request("POST", "/x", json_body={}, content=b"x")


def test_relative_paths_are_refused() -> None:
    with pytest.raises(payonce.ConfigurationError, match="start with '/'"):
        canonical_request("POST", "v1/payments")
