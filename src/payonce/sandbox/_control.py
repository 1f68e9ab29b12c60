"""The control endpoints under ``/_sandbox/``: what tests and scripts use to steer the
provider (faults, clock, reset) and to read what it did (executions, webhook attempts).

They take no API key: the sandbox is a test double, and these are its test hooks.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from payonce.sandbox._errors import ApiError
from payonce.sandbox._faults import FaultInjector, Faults
from payonce.sandbox._requests import json_object
from payonce.sandbox._store import SandboxStore
from payonce.sandbox._webhooks import WebhookSender


@attrs.frozen
class ControlApi:
    store: SandboxStore
    injector: FaultInjector
    webhooks: WebhookSender | None
    reset_sandbox: Callable[[], None]
    """Puts the whole sandbox back as it started; RuntimeError if requests stay in flight."""

    async def executions(self, request: Request) -> Response:
        executions = await run_in_threadpool(self.store.executions)
        return JSONResponse({"executions": executions, "total": sum(executions.values())})

    async def script_faults(self, request: Request) -> Response:
        body = json_object(await request.body())
        names, replace = body.get("faults"), body.get("replace", False)
        if not isinstance(names, list):
            raise ApiError(400, "invalid_request", "faults must be a list of fault names")
        if not isinstance(replace, bool):
            raise ApiError(400, "invalid_request", "replace must be true or false")
        try:
            self.injector.script(names, replace=replace)
        except ValueError as exc:
            raise ApiError(400, "invalid_request", str(exc)) from None
        return JSONResponse({"script": self.injector.pending_script()})

    async def set_faults(self, request: Request) -> Response:
        try:
            faults = Faults.from_json(json_object(await request.body()))
        except (TypeError, ValueError) as exc:
            raise ApiError(400, "invalid_request", str(exc)) from None
        self.injector.set_faults(faults)
        return JSONResponse(attrs.asdict(faults))

    async def advance_clock(self, request: Request) -> Response:
        seconds = json_object(await request.body()).get("advance")
        if not isinstance(seconds, int | float) or isinstance(seconds, bool):
            raise ApiError(400, "invalid_request", "advance must be a number of seconds")
        await run_in_threadpool(self.store.clock.advance, seconds)
        return JSONResponse({"now": self.store.clock.now()})

    async def webhook_attempts(self, request: Request) -> Response:
        if self.webhooks is None:
            raise ApiError(404, "not_found", "this sandbox sends no webhooks")
        return JSONResponse(
            {
                "config": self.webhooks.config.to_json(),
                "attempts": [attempt.to_json() for attempt in self.webhooks.attempts()],
                "pending": self.webhooks.pending(),
            }
        )

    async def reset(self, request: Request) -> Response:
        try:
            await run_in_threadpool(self.reset_sandbox)
        except RuntimeError as exc:
            raise ApiError(409, "in_flight", str(exc)) from None
        return JSONResponse({"reset": True})
