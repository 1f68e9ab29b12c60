"""Stripe's form encoding: nested mappings, lists, booleans and None exactly as Stripe's own
Python SDK encodes them, checked against its encoder over a corpus and random values."""

from __future__ import annotations

import datetime
from typing import Any
from urllib.parse import urlencode

import hypothesis
import pytest
from hypothesis import strategies as st
from stripe._encode import _api_encode

from payonce._lifecycle import canonical_request
from payonce._providers._stripe import stripe_form_pairs


def _sdk_body(data: dict[str, Any]) -> str:
    """What stripe-python sends for these parameters."""
    return urlencode(list(_api_encode(data))).replace("%5B", "[").replace("%5D", "]")


def _our_body(data: dict[str, Any]) -> str:
    request = canonical_request(
        "POST", "/v1/payment_intents", form=data, form_encoder=stripe_form_pairs
    )
    return request.body.decode()


CORPUS: list[dict[str, Any]] = [
    {"metadata": {"order": "o-1"}, "payment_method_types": ["card"], "confirm": True},
    {"amount": 4200, "currency": "eur", "capture_method": "manual"},
    {"description": None, "amount": 1},
    {"confirm": False, "off_session": True},
    {"items": [{"price": "price_1", "quantity": 2}, {"price": "price_2"}]},
    {"shipping": {"address": {"line1": "1 Rue de la Paix", "city": "Paris"}, "name": "Zoé"}},
    {"expand": ["customer", "latest_charge.balance_transaction"]},
    {"metadata": {"note": "a&b=c [x] 100%"}, "statement_descriptor": "café+crème"},
    {"payment_method_options": {"card": {"request_three_d_secure": "any"}}},
    {"tiers": [{"up_to": 10, "unit_amount": 5}, {"up_to": "inf", "unit_amount": 3}]},
    {"flags": [True, False, None], "nested": [[1, 2], [3]]},
    {"amount": 12.5, "zero": 0, "empty": "", "empty_list": [], "empty_map": {}},
]


@pytest.mark.parametrize("data", CORPUS)
def test_the_stripe_profile_sends_what_stripe_python_sends(data: dict[str, Any]) -> None:
    assert _our_body(data) == _sdk_body(data)


def test_a_datetime_is_sent_as_its_unix_timestamp() -> None:
    moment = datetime.datetime(2026, 11, 30, 12, 0, tzinfo=datetime.UTC)
    assert _our_body({"expires_at": moment}) == _sdk_body({"expires_at": moment})
    assert _our_body({"expires_at": moment}) == "expires_at=1796040000"


def test_the_fingerprint_covers_the_encoded_pairs() -> None:
    first = {"metadata": {"order": "o-1", "cart": "c-9"}, "confirm": True}
    reordered = {"confirm": True, "metadata": {"cart": "c-9", "order": "o-1"}}
    other = {"metadata": {"order": "o-1", "cart": "c-9"}, "confirm": False}

    def fingerprint(data: dict[str, Any]) -> str:
        encoded = canonical_request("POST", "/v1/x", form=data, form_encoder=stripe_form_pairs)
        return encoded.fingerprint

    assert fingerprint(first) == fingerprint(reordered), "the order of a mapping is no matter"
    assert fingerprint(first) != fingerprint(other)


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
_keys = st.text(min_size=1, max_size=12)
_values = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_keys, children, max_size=4),
    max_leaves=20,
)


@pytest.mark.slow
@hypothesis.settings(max_examples=400, deadline=None)
@hypothesis.given(data=st.dictionaries(_keys, _values, max_size=6))
def test_any_parameters_are_encoded_as_stripe_python_encodes_them(data: dict[str, Any]) -> None:
    assert _our_body(data) == _sdk_body(data)
