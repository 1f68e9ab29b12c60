"""How the sandbox fails on the wire: API errors in its dialect, and connections it drops."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Message, Receive, Scope, Send

from payonce.sandbox._dialects import Dialect, error_body
from payonce.sandbox._store import StoredResponse

ExceptionHandler = Callable[[Request, Exception], Awaitable[Response]]


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        type_: str,
        message: str,
        headers: Mapping[str, str] | None = None,
        *,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.headers = dict(headers or {})
        self.fields = dict(fields or {})
        """More of the error object in Stripe's dialect (``param``, ``payment_intent``...)."""


def error_handlers(dialect: Dialect) -> dict[type[Exception], ExceptionHandler]:
    """Starlette's exception handlers: the API's errors in ``dialect``, routing errors (an
    unknown path, a wrong method) in the sandbox's own shape."""

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return _error(dialect, exc.status, exc.type, exc.message, exc.headers, exc.fields)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        type_ = "not_found" if exc.status_code == 404 else "invalid_request"
        return _error("sandbox", exc.status_code, type_, exc.detail, exc.headers or {})

    return {ApiError: api_error, HTTPException: http_error}


def _error(
    dialect: Dialect,
    status: int,
    type_: str,
    message: str,
    headers: Mapping[str, str],
    fields: Mapping[str, Any] | None = None,
) -> Response:
    response = JSONResponse(error_body(dialect, status, type_, message, fields), status)
    response.headers.update(headers)
    return response


class ConnectionDropped(Exception):
    """Raised on purpose so that uvicorn closes the socket in the middle of a response."""


class DroppedResponse(Response):
    """Promises the whole stored body, sends half of it, then breaks the connection."""

    def __init__(self, stored: StoredResponse) -> None:
        super().__init__(stored.body, status_code=stored.status, media_type="application/json")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start: Message = {
            "type": "http.response.start",
            "status": self.status_code,
            "headers": self.raw_headers,
        }
        await send(start)
        half = self.body[: len(self.body) // 2]
        await send({"type": "http.response.body", "body": half, "more_body": True})
        raise ConnectionDropped


class _QuietDrops(logging.Filter):
    # uvicorn logs every exception escaping the app with a traceback; a drop we injected on
    # purpose is not an error worth one.
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], ConnectionDropped))


def silence_injected_drops() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _QuietDrops) for f in logger.filters):
        logger.addFilter(_QuietDrops())
