"""The sandbox provider as one ASGI app: its payments API and control endpoints, over one
store, one fault injector and one webhook sender."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from payonce.sandbox._config import SandboxConfig
from payonce.sandbox._control import ControlApi
from payonce.sandbox._errors import error_handlers, silence_injected_drops
from payonce.sandbox._faults import FaultInjector
from payonce.sandbox._guard import KeyGuard
from payonce.sandbox._hold import Hold
from payonce.sandbox._middleware import (
    Activity,
    ActivityMiddleware,
    DateMiddleware,
    RequestIdMiddleware,
    RetryHintMiddleware,
)
from payonce.sandbox._payments import PaymentsApi
from payonce.sandbox._sdk_payments import SdkPaymentsApi
from payonce.sandbox._store import SandboxStore
from payonce.sandbox._stripe_api import PaymentIntentsApi
from payonce.sandbox._webhooks import WebhookSender

RESET_TIMEOUT: Final = 30.0


def _stripe_routes(intents: PaymentIntentsApi) -> list[Route]:
    """Stripe's own resources, served only when the sandbox speaks Stripe's dialect."""
    return [
        Route("/v1/payment_intents", intents.create, methods=["POST"]),
        Route("/v1/payment_intents", intents.list, methods=["GET"]),
        # Before the {intent_id} route, which would take "search" for an id.
        Route("/v1/payment_intents/search", intents.search, methods=["GET"]),
        Route("/v1/payment_intents/{intent_id}", intents.retrieve, methods=["GET"]),
        Route("/v1/payment_intents/{intent_id}/confirm", intents.confirm, methods=["POST"]),
    ]


class Sandbox:
    """One provider: its configuration, store and fault injector, and the app serving them."""

    def __init__(self, config: SandboxConfig, store: SandboxStore, *, owns_store: bool) -> None:
        self.config = config
        self.store = store
        self.injector = FaultInjector(config.faults)
        self.webhooks = WebhookSender(config.webhooks) if config.webhooks is not None else None
        self._owns_store = owns_store
        self._activity = Activity()
        silence_injected_drops()
        self.hold = Hold()
        guard = KeyGuard(config, store, self.injector, self.hold)
        payments = PaymentsApi(config, store, guard, self.webhooks)
        control = ControlApi(store, self.injector, self.webhooks, self.reset)
        self.app = Starlette(
            # Every endpoint in one table: the provider's API, then the test hooks.
            routes=[
                Route("/v1/payments", payments.create_payment, methods=["POST"]),
                Route("/v1/payments", payments.list_payments, methods=["GET"]),
                Route("/v1/payments/search", payments.search_payments, methods=["GET"]),
                Route("/v1/payments/{payment_id}", payments.get_payment, methods=["GET"]),
                *(
                    _stripe_routes(PaymentIntentsApi(config, store, guard))
                    if config.dialect == "stripe"
                    else []
                ),
                # Adyen's, Mollie's and Square's own resources, in their dialects only.
                *SdkPaymentsApi(config, store, guard).routes(),
                Route("/_sandbox/executions", control.executions, methods=["GET"]),
                Route("/_sandbox/script", control.script_faults, methods=["POST"]),
                Route("/_sandbox/faults", control.set_faults, methods=["POST"]),
                Route("/_sandbox/clock", control.advance_clock, methods=["POST"]),
                Route("/_sandbox/reset", control.reset, methods=["POST"]),
                Route("/_sandbox/webhooks", control.webhook_attempts, methods=["GET"]),
            ],
            middleware=[
                Middleware(ActivityMiddleware, activity=self._activity),
                Middleware(DateMiddleware, clock=store.clock.now),
                Middleware(RequestIdMiddleware),
                Middleware(
                    RetryHintMiddleware, header=config.retry_hint_header, hints=config.retry_hints
                ),
            ],
            exception_handlers=error_handlers(config.dialect),
            lifespan=self._lifespan,
        )

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        yield
        if self.webhooks is not None:
            self.webhooks.close()
        if self._owns_store:
            self.store.close()

    def wait_idle(self, timeout: float) -> bool:
        return self._activity.wait_idle(timeout)

    def reset(self, timeout: float = RESET_TIMEOUT) -> None:
        # A request still being handled would otherwise execute into the fresh state: a
        # payment that no one of the next users asked for.
        if not self._activity.wait_idle(timeout):
            raise RuntimeError(f"the sandbox still had requests in flight after {timeout} s")
        self.store.reset()
        self.injector.reset(self.config.faults)
        if self.webhooks is not None and not self.webhooks.reset(timeout):
            raise RuntimeError(f"a webhook delivery was still in flight after {timeout} s")


def create_app(config: SandboxConfig | None = None, store: SandboxStore | None = None) -> Starlette:
    """The ASGI app; without a store it opens ``config.store_path`` and closes it on shutdown."""
    config = config or SandboxConfig()
    if store is None:
        return Sandbox(config, SandboxStore(config.store_path), owns_store=True).app
    return Sandbox(config, store, owns_store=False).app
