"""The application code the simulated processes run, and the shop's own database.

Order kinds:

- ``oneshot``: ``client.post("/v1/payments", ..., reference=order)``;
- ``declined``: the same, for an amount the provider declines;
- ``block``: ``with client.intent(order)``: create the customer, the payment, confirm it;
- ``conditional`` (world feature ``changed_code``): create the customer only if the shop's
  database has none for the order yet, then the payment: a run again after a crash past
  the customer's commit skips that step, so its block's first request differs;
- ``retried-block``: the ``block`` inside a retry loop around the whole block (up to three
  runs in one process, on ``OutcomeUnknown``, ``ProviderUnavailable`` or
  ``IntentInFlight``), as the docs advise for retrying;
- ``confirm-unless-confirmed`` (``changed_code``): the ``block``, whose confirmation is
  skipped when the shop's database says the payment was confirmed already;
- ``coupon-added`` (``changed_code``): create the customer, then, only if an earlier run
  committed that a coupon was offered, apply it, then the payment: a run again after a
  crash past that commit has a step *added* before the payment;
- ``reordered`` (``changed_code``): create the customer and apply a coupon, in the other
  order once an earlier run committed that it got past the first: a run again sends the
  same steps reordered;
- ``twice`` (``changed_code``): the same payment request twice in one block, on purpose (two
  identical items: its operation ``order-N/item*2`` may execute twice, not three times);
- ``repriced`` (``changed_code``): create the customer, commit a new price, pay: a run again
  after that commit sends the payment with another amount, which payonce must refuse if
  the first run's payment was journaled (a step whose body changes);
- ``late-request`` (``changed_code``): the ``block``'s customer, then a request through a
  copy of the block's context after the block ended (``order-N/late*0``: never executed);
- ``sdk``: SDK-shaped code, an ``httpx.Client`` over ``client.transport()`` of one
  transport-only payonce client, drawing a uuid4 ``Idempotency-Key`` per call and carrying
  its merchant's credential on each request (two merchants under world feature
  ``per_request_credentials``, else one).

Every answer a process is told is handed to ``Told`` for the invariants to judge.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import httpx

import payonce

from ._provider import DECLINED_AMOUNT

__all__ = ["BASE_URL", "ORDER_KINDS", "Shop", "Told", "run_order"]

BASE_URL = "https://provider.sim"

ORDER_KINDS = (
    "oneshot",
    "block",
    "retried-block",
    "sdk",
    "declined",
    "conditional",
    "confirm-unless-confirmed",
    "coupon-added",
    "reordered",
    "twice",
    "repriced",
    "late-request",
)

RETRIED = (payonce.OutcomeUnknown, payonce.ProviderUnavailable, payonce.IntentInFlight)
"""What the shop's retry loop around a whole block retries."""


class Told(Protocol):
    """Where a process reports what payonce told it."""

    def told(self, operation: str, response: httpx.Response) -> None: ...

    def boundary(self, what: str) -> None: ...

    def uuid4(self) -> str: ...

    def tell(self, line: str) -> None: ...


@attrs.define
class Shop:
    """The shop's database: what survives a crash is what was committed."""

    customers: dict[str, str] = attrs.Factory(dict)
    confirmed: set[str] = attrs.Factory(set)
    coupon_offered: set[str] = attrs.Factory(set)
    past_first_step: set[str] = attrs.Factory(set)
    repriced: set[str] = attrs.Factory(set)


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def run_order(
    kind: str,
    order: str,
    amount: int,
    client: payonce.Client,
    shop: Shop,
    told: Told,
    sdk_http: Callable[[], httpx.Client] | None = None,
    merchant_key: str = "",
    reference: str | None = None,
) -> str:
    """Run the order's code once; what it came to, in words, for the story. ``reference``:
    the intent's reference, the order's own unless a deliberately broken world says not."""
    if reference is None:
        reference = order
    if kind in ("oneshot", "declined"):
        amount = DECLINED_AMOUNT if kind == "declined" else amount
        operation = f"{order}/pay"
        response = client.post(
            "/v1/payments", json={"operation": operation, "amount": amount}, reference=reference
        )
        told.told(operation, response)
        return f"paid: HTTP {response.status_code}"
    if kind in ("block", "confirm-unless-confirmed"):
        return _block(
            order, reference, amount, client, shop, told, unless_confirmed=kind != "block"
        )
    if kind == "retried-block":
        for run in range(1, 4):
            try:
                return _block(order, reference, amount, client, shop, told, unless_confirmed=False)
            except RETRIED as error:
                if run == 3:
                    raise
                told.tell(f"retries the whole block after {type(error).__name__}")
                told.boundary("retries the whole block")
        raise AssertionError("not reached")
    if kind == "conditional":
        with client.intent(reference) as op:
            customer = shop.customers.get(order)
            if customer is None:
                customer = _step(op.post, told, "/v1/customers", {"operation": f"{order}/customer"})
                told.boundary("commits the customer to the shop's database")
                shop.customers[order] = customer
                told.tell(f"commits customer {customer} of {order} to the shop's database")
            _step(
                op.post,
                told,
                "/v1/payments",
                {"operation": f"{order}/pay", "amount": amount, "customer": customer},
            )
        return "payment done"
    if kind == "coupon-added":
        with client.intent(reference) as op:
            customer = _step(op.post, told, "/v1/customers", {"operation": f"{order}/customer"})
            if order in shop.coupon_offered:
                _step(op.post, told, "/v1/coupons", {"operation": f"{order}/coupon"})
            else:
                told.boundary("commits that a coupon was offered")
                shop.coupon_offered.add(order)
                told.tell(f"commits that a coupon was offered for {order}")
            _step(
                op.post,
                told,
                "/v1/payments",
                {"operation": f"{order}/pay", "amount": amount, "customer": customer},
            )
        return "payment done"
    if kind == "reordered":
        with client.intent(reference) as op:
            steps = [("/v1/customers", f"{order}/customer"), ("/v1/coupons", f"{order}/coupon")]
            if order in shop.past_first_step:
                steps.reverse()
            for at, (path, operation) in enumerate(steps):
                _step(op.post, told, path, {"operation": operation})
                if at == 0 and order not in shop.past_first_step:
                    told.boundary("commits that it got past the first step")
                    shop.past_first_step.add(order)
                    told.tell(f"commits that {order} got past its first step")
            _step(op.post, told, "/v1/payments", {"operation": f"{order}/pay", "amount": amount})
        return "customer, coupon and payment done"
    if kind == "twice":
        with client.intent(reference) as op:
            item = {"operation": f"{order}/item*2", "amount": amount}
            _step(op.post, told, "/v1/payments", item)
            _step(op.post, told, "/v1/payments", item)
        return "two identical items paid"
    if kind == "repriced":
        price = amount + 100 if order in shop.repriced else amount
        with client.intent(reference) as op:
            customer = _step(op.post, told, "/v1/customers", {"operation": f"{order}/customer"})
            told.boundary("commits a new price")
            shop.repriced.add(order)
            told.tell(f"commits a new price for {order}")
            _step(
                op.post,
                told,
                "/v1/payments",
                {"operation": f"{order}/pay", "amount": price, "customer": customer},
            )
        return f"paid {price}"
    if kind == "late-request":
        with client.intent(reference) as op:
            _step(op.post, told, "/v1/customers", {"operation": f"{order}/customer"})
            copy = contextvars.copy_context()  # a thread or task started inside the block
        told.boundary("sends a request through the block's context copy")
        try:
            response = copy.run(client.post, "/v1/coupons", json={"operation": f"{order}/late*0"})
        except payonce.ConfigurationError as error:
            if "after the block" not in str(error):
                raise
            told.tell("its request after the block ended is refused")
            return "customer done; the late request refused"
        told.told(f"{order}/late*0", response)
        return f"customer done; the late request sent: HTTP {response.status_code}"
    if kind == "sdk":
        assert sdk_http is not None
        with sdk_http() as http, client.intent(order):

            def post(path: str, *, json: dict[str, Any]) -> httpx.Response:
                headers = {
                    "Idempotency-Key": told.uuid4(),
                    "Authorization": f"Bearer {merchant_key}",
                }
                response = http.post(path, json=json, headers=headers)
                if response.status_code >= 400:
                    raise SdkError(response)
                return response

            customer = _step(post, told, "/v1/customers", {"operation": f"{order}/customer"})
            _step(
                post,
                told,
                "/v1/payments",
                {"operation": f"{order}/pay", "amount": amount, "customer": customer},
            )
        return "payment done through the SDK"
    raise ValueError(f"no order kind {kind!r}")


def _block(
    order: str,
    reference: str,
    amount: int,
    client: payonce.Client,
    shop: Shop,
    told: Told,
    *,
    unless_confirmed: bool,
) -> str:
    with client.intent(reference) as op:
        customer = _step(op.post, told, "/v1/customers", {"operation": f"{order}/customer"})
        payment = _step(
            op.post,
            told,
            "/v1/payments",
            {"operation": f"{order}/pay", "amount": amount, "customer": customer},
        )
        if unless_confirmed and order in shop.confirmed:
            return "customer and payment done; confirmed already"
        _step(op.post, told, f"/v1/payments/{payment}/confirm", {"operation": f"{order}/confirm"})
        if unless_confirmed:
            told.boundary("commits the confirmation to the shop's database")
            shop.confirmed.add(order)
            told.tell(f"commits the confirmation of {order} to the shop's database")
    return "customer, payment and confirmation done"


class SdkError(Exception):
    """What an SDK raises for an error answer (as stripe-python's ``StripeError``)."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


def _step(post: Callable[..., httpx.Response], told: Told, path: str, body: dict[str, Any]) -> str:
    try:
        response = post(path, json=body)
    except SdkError as error:
        told.told(str(body["operation"]), error.response)
        raise
    told.told(str(body["operation"]), response)
    return str(_json(response).get("id", ""))
