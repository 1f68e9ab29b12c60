"""The provider: its idempotency semantics, as payonce's ``sandbox`` and ``generic``
profiles describe them, and every execution counted per business operation.

- An idempotency key is scoped per account (the account of the credential a request
  carries): the same key under another account's credential is a new execution.
- A key is remembered for ``key_lifetime`` seconds of the provider's clock, then forgotten.
- A request whose key is still executing answers 409; a key reused with another request
  (method, path, body) answers 422; a repeat of a finished one replays its answer, marked
  ``Idempotent-Replayed: true``.
- The status look-up (``GET /v1/payments?idempotency_key=K``) finds what executed under
  a key of the credential's account, and nothing of another account's.
- Each mutating request names its business operation in its body (``operation``, the
  shop's own id such as ``order-7/pay``): the world counts executions per operation, so
  "order-7 was paid twice" is seen even under two keys or two accounts.

It answers in-process and instantly; delays and losses are the network's (``_network``).
"""

from __future__ import annotations

import email.utils
import hashlib
import json
from collections import Counter
from typing import Any

import attrs
import httpx

from payonce.providers import ProviderProfile, get_profile, register_profile

from ._clocks import Clocks

__all__ = [
    "CREDENTIALS",
    "DECLINED_AMOUNT",
    "PROFILES",
    "Execution",
    "ProviderModel",
    "profile_named",
]

CREDENTIALS = {"sk_sim_merchant_a": "acct_a", "sk_sim_merchant_b": "acct_b"}
"""The API keys the provider knows, and the account each one belongs to."""

DECLINED_AMOUNT = 40200
"""A payment of this amount is declined (402), as the sandbox's is."""


def _sees_creations(method: str, path: str) -> bool:
    return path in ("/v1/payments", "/v1/customers")


PROFILES = ("sandbox", "sandbox-verify", "sandbox-partial", "generic")


def profile_named(name: str) -> ProviderProfile:
    """The profile the world's provider speaks: ``sandbox``; ``sandbox-verify``, the
    sandbox's verifying with its look-up before any resend; ``sandbox-partial``, the
    sandbox's with a look-up that sees creations only (and says so, as Stripe's profile
    says its search sees no confirm); ``generic`` (no look-up, quoted keys)."""
    if name in ("sandbox", "generic"):
        return get_profile(name)
    sandbox = get_profile("sandbox")
    assert sandbox.lookup is not None
    if name == "sandbox-verify":
        profile = attrs.evolve(sandbox, name=name, resend="verify")
    elif name == "sandbox-partial":
        lookup = attrs.evolve(sandbox.lookup, finds=_sees_creations)
        profile = attrs.evolve(sandbox, name=name, lookup=lookup)
    else:
        raise ValueError(f"no profile {name!r} in the world")
    register_profile(profile)  # recovery rebuilds a profile by the name it journaled
    return profile


@attrs.define
class Execution:
    """One execution of a request at the provider."""

    operation: str
    account: str
    key: str | None
    object_id: str
    succeeded: bool
    at: float
    by: str = ""
    """The simulated process whose request it was."""
    rerun: bool = False
    """Whether that process ran an order's code again after a crash."""


@attrs.define
class _KeyEntry:
    path: str
    fingerprint: str
    first_seen: float
    busy_until: float
    status: int
    body: dict[str, Any]


class ProviderModel:
    """The provider's whole state, answering ``handle(request)`` at the provider's clock."""

    def __init__(self, clocks: Clocks, profile: ProviderProfile) -> None:
        self.clocks = clocks
        key_lifetime, quoted_keys = profile.key_lifetime, profile.quote_key
        self._sees = profile.lookup.finds if profile.lookup is not None else None
        self.key_lifetime = key_lifetime
        self.quoted_keys = quoted_keys
        self.executions: list[Execution] = []
        self.per_operation: Counter[str] = Counter()
        """Successful executions per business operation: more than one is a double."""
        self._keys: dict[tuple[str, str], _KeyEntry] = {}
        self._objects: dict[str, dict[str, Any]] = {}
        self._next_id = 0
        self.sender: tuple[str, bool] = ("", False)
        """Who sends the request being handled (the world's bookkeeping, not the
        provider's): each execution is tagged with it."""

    # -- answering ----------------------------------------------------------------------------

    def handle(self, request: httpx.Request, *, busy_for: float = 0.0) -> httpx.Response:
        """The provider's answer; ``busy_for``: the execution goes on that long after the
        request arrived (the network's "delayed past the timeout"), answering 409 to a
        repeat meanwhile."""
        path = request.url.path
        if request.method == "HEAD":
            return self._answer(200, None)
        account = CREDENTIALS.get(request.headers.get("authorization", "").removeprefix("Bearer "))
        if account is None:
            return self._answer(401, _error("authentication_error", "invalid API key"))
        if request.method == "GET" and path == "/v1/payments" and self._sees is not None:
            return self._look_up(account, request.url.params.get("idempotency_key", ""))
        if request.method != "POST":
            return self._answer(404, _error("invalid_request_error", f"no route {path}"))
        body = request.read()
        try:
            params = json.loads(body)
        except ValueError:
            return self._answer(400, _error("invalid_request_error", "a JSON body, please"))
        key = request.headers.get("idempotency-key")
        if key is not None and self.quoted_keys:
            key = key.strip('"')
        fingerprint = hashlib.sha256(f"{request.method} {path} ".encode() + body).hexdigest()
        now = self.clocks.provider()
        if key is not None:
            entry = self._keys.get((account, key))
            if entry is not None and now - entry.first_seen > self.key_lifetime:
                del self._keys[(account, key)]  # forgotten: a new request under that key
                entry = None
            if entry is not None:
                if entry.fingerprint != fingerprint:
                    return self._answer(
                        422, _error("idempotency_error", "key reused with another request")
                    )
                if now < entry.busy_until:
                    return self._answer(
                        409, _error("idempotency_error", "a request with this key is in flight")
                    )
                return self._answer(entry.status, entry.body, replayed=True)
        status, answer = self._execute(account, key, path, params)
        if key is not None:
            self._keys[(account, key)] = _KeyEntry(
                path, fingerprint, now, now + busy_for, status, answer
            )
        return self._answer(status, answer)

    def _execute(
        self, account: str, key: str | None, path: str, params: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        operation = str(params.get("operation", "?"))
        if path == "/v1/customers":
            return 200, self._executed("cus", operation, account, key, {"object": "customer"})
        if path == "/v1/coupons":
            return 200, self._executed("cpn", operation, account, key, {"object": "coupon"})
        if path == "/v1/payments":
            if params.get("amount") == DECLINED_AMOUNT:
                self.executions.append(
                    Execution(operation, account, key, "", False, self.clocks.true, *self.sender)
                )
                return 402, {
                    **_error("card_error", "your card was declined"),
                    "operation": operation,
                }
            extra = {"object": "payment", "amount": params.get("amount"), "confirmed": False}
            return 200, self._executed("pay", operation, account, key, extra)
        parts = path.strip("/").split("/")
        if len(parts) == 4 and parts[:2] == ["v1", "payments"] and parts[3] == "confirm":
            payment = self._objects.get(parts[2])
            if payment is None or payment["account"] != account:
                return 404, _error("invalid_request_error", f"no such payment {parts[2]}")
            if payment["confirmed"]:
                return 400, {
                    **_error("invalid_request_error", "payment already confirmed"),
                    "operation": operation,
                }
            payment["confirmed"] = True
            return 200, self._executed("cnf", operation, account, key, {"payment": parts[2]})
        return 404, _error("invalid_request_error", f"no route {path}")

    def _executed(
        self, prefix: str, operation: str, account: str, key: str | None, extra: dict[str, Any]
    ) -> dict[str, Any]:
        self._next_id += 1
        object_id = f"{prefix}_{self._next_id}"
        answer = {
            "id": object_id,
            "status": "succeeded",
            "operation": operation,
            "account": account,
            **extra,
        }
        self._objects[object_id] = answer
        self.executions.append(
            Execution(operation, account, key, object_id, True, self.clocks.true, *self.sender)
        )
        self.per_operation[operation] += 1
        return answer

    def _look_up(self, account: str, key: str) -> httpx.Response:
        entry = self._keys.get((account, key))
        now = self.clocks.provider()
        found: list[dict[str, Any]] = []
        seen = entry is not None and self._sees is not None and self._sees("POST", entry.path)
        if entry is not None and seen and now - entry.first_seen <= self.key_lifetime:
            if 200 <= entry.status < 300:
                found.append(entry.body)
            elif entry.status == 402:
                found.append({"id": "", "status": "failed", **entry.body})
        return self._answer(200, {"object": "list", "data": found})

    def _answer(
        self, status: int, body: dict[str, Any] | None, *, replayed: bool = False
    ) -> httpx.Response:
        headers = {"date": email.utils.formatdate(self.clocks.provider(), usegmt=True)}
        if replayed:
            headers["idempotent-replayed"] = "true"
        if body is None:
            return httpx.Response(status, headers=headers)
        return httpx.Response(status, headers=headers, json=body)

    # -- what the invariants read -------------------------------------------------------------

    def executed(self, object_id: str) -> Execution | None:
        return next((e for e in self.executions if e.object_id == object_id), None)

    def executions_under(self, key: str) -> list[Execution]:
        return [e for e in self.executions if e.key == key]


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"error": {"type": kind, "message": message}}
