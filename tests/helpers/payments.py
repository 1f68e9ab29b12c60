"""Payments, clients and the ways a worker can leave an intent behind."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

import payonce
from payonce.sandbox import SandboxServer

PAYMENT = {"amount": 4200, "currency": "eur"}
DECLINED = {"amount": 40200, "currency": "eur"}  # the sandbox declines this amount: a 402
FAST_RETRY = payonce.RetryPolicy(initial_wait=0.001, max_wait=0.01, max_attempts=5)

MakeClient = Callable[..., payonce.Client]


def payonce_options(server: SandboxServer, provider: str, journal: str | Path) -> dict[str, Any]:
    """A payonce client used only as the SDK's transport: the SDK brings its credentials."""
    return {
        "base_url": server.url,
        "provider": provider,
        "account": "acct_shop",
        "journal": journal,
        "retry": FAST_RETRY,
        "timeout": 5.0,
        "transport_only": True,
    }


class DiesAfterSending(httpx.HTTPTransport):
    """Really sends the request, then fails as if the worker died before reading the answer."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        super().handle_request(request).close()
        raise RuntimeError("worker died after sending")


def leave_pending(make_client: MakeClient, reference: str, **options: Any) -> payonce.IntentRecord:
    """A worker sends the payment and dies before the answer: the intent stays pending."""
    dying = make_client(transport=DiesAfterSending(), **options)
    with pytest.raises(RuntimeError, match="worker died"):
        dying.post("/v1/payments", json=PAYMENT, reference=reference)
    (record,) = dying.journal.find(reference)
    assert record.state is payonce.IntentState.PENDING
    return record


def make_unknown(
    make_client: MakeClient, sandbox: SandboxServer, reference: str, *faults: str, **options: Any
) -> payonce.IntentRecord:
    """Every attempt the client may make meets one of ``faults`` (a 503 before or after
    executing, a dropped answer): the intent ends unknown."""
    client = make_client(
        retry=payonce.RetryPolicy(max_attempts=len(faults), initial_wait=0), **options
    )
    sandbox.script(faults)
    with pytest.raises(payonce.OutcomeUnknown):
        client.post("/v1/payments", json=PAYMENT, reference=reference)
    (record,) = client.journal.find(reference)
    assert record.state is payonce.IntentState.UNKNOWN
    return record


@contextmanager
def paying_in_background(
    client: payonce.Client, reference: str, provider: SandboxServer
) -> Iterator[Future[httpx.Response]]:
    """The payment is at ``provider`` for the whole block, sent from another thread: its
    request has arrived and its key is claimed, and the provider holds it, however long
    the block takes on a loaded machine (give ``client`` a read timeout that outlasts the
    block). The provider answers once the block ends; the thread is joined then."""
    with ThreadPoolExecutor(1) as pool:
        with provider.holding():
            paying = pool.submit(client.post, "/v1/payments", json=PAYMENT, reference=reference)
            if not provider.wait_held(1):
                if paying.done():
                    paying.result()  # its error says why it never arrived
                pytest.fail("the payment never reached the provider")
            yield paying
        paying.result()


def free_port() -> int:
    """A loopback port nothing listens on now: connecting is refused, a server may bind it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
