"""Journal rows made by hand, the journal's store read or written around payonce, and the
private store (``store_of``) through which the tests write to a journal as a client would."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

from payonce._journal import _sql as sql
from payonce._journal._engine import Tx
from payonce._journal._inbox import Inbox
from payonce._journal._open import inbox_of, store_of
from payonce._journal._store import IntentStore
from payonce._lifecycle import (
    IntentDraft,
    Transition,
    canonical_request,
    credential_fingerprint,
    make_scope,
)
from payonce.journal import Journal, StoredResponse
from payonce.sandbox import DEFAULT_API_KEY

__all__ = [
    "RESPONSE",
    "Inbox",
    "IntentDraft",
    "IntentStore",
    "OpenJournal",
    "draft_for",
    "inbox_of",
    "raw_transaction",
    "rows",
    "settle",
    "store_of",
]

OpenJournal = Callable[..., Journal]
"""Opens a journal (a "host") on the test's store; ``store_of`` gives its private writes."""


def draft_for(
    number: int,
    *,
    account: str = "acct_demo",
    reference: str | None = "",
    key: str | None = None,
    key_supplied: bool = False,
    amount: int | None = None,
    path: str = "/v1/payments",
    padding: int = 0,
) -> IntentDraft:
    """The draft a client would journal for payment number ``number``, sent with the
    sandbox's default key (whose fingerprint it journals); ``padding`` characters of
    metadata make its body that much longer."""
    body: dict[str, Any] = {
        "amount": amount if amount is not None else 1000 + number,
        "currency": "eur",
    }
    if padding:
        body["metadata"] = {"note": "x" * padding}
    canonical = canonical_request("POST", path, json_body=body)
    return IntentDraft(
        key=key or f"key-{number:05d}",
        key_supplied=key_supplied,
        scope=make_scope(account, "POST", path),
        reference=f"order-{number:05d}" if reference == "" else reference,
        account=account,
        provider="sandbox",
        method="POST",
        url=f"http://127.0.0.1:9{path}",
        fingerprint=canonical.fingerprint,
        request_headers=(("content-type", "application/json"),),
        body=canonical.body,
        credential=credential_fingerprint(DEFAULT_API_KEY),
    )


RESPONSE = StoredResponse(
    status=201,
    headers=(("content-type", "application/json"), ("request-id", "req_1")),
    body=b'{"id":"pay_1","description":"caf\xc3\xa9"}\n\x00\xff',
)


@contextlib.contextmanager
def raw_transaction(location: str) -> Iterator[Tx]:
    """A transaction on the store through a connection of its own, not through payonce."""
    if sql.is_postgres_url(location):
        with psycopg.connect(location, autocommit=True) as conn:
            cur = conn.cursor()
            cur.execute("BEGIN")
            yield Tx(cur, sql.POSTGRES)
            cur.execute("COMMIT")
    else:
        with contextlib.closing(sqlite3.connect(location, isolation_level=None)) as db:
            db.execute("BEGIN IMMEDIATE")
            yield Tx(db.cursor(), sql.SQLITE)
            db.execute("COMMIT")


def rows(location: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with raw_transaction(location) as tx:
        return tx.all(statement, params)


def settle(store: IntentStore, key: str, owner: str, now: float, attempt: int = 1) -> None:
    """Settle a held intent as succeeded, with ``RESPONSE``."""
    store.settle(
        key,
        transition=Transition.SUCCEEDED,
        owner=owner,
        now=now,
        response=RESPONSE,
        attempt=attempt,
    )
