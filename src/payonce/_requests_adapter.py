"""A ``requests`` adapter that sends through any httpx transport.

``requests``-based SDKs (Mollie's, and any code on a ``requests.Session``) mount it to reach
an httpx transport: a plain ``httpx.HTTPTransport`` or payonce's own. It knows nothing of
payonce's runtime: a ``PayonceError`` the transport raises goes up unchanged, for the
integration (or the caller) to turn into what its SDK's callers expect.

It lives beside the runtime, importing nothing of payonce, so that both
``Client.requests_adapter()`` and ``payonce.integrations`` (which reaches only
``payonce.errors`` and this module) can build one; ``payonce.integrations.requests``
re-exports it. Imported only when used: ``requests`` is an extra.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import httpx
import requests
import requests.adapters
import requests.exceptions
from requests.structures import CaseInsensitiveDict
from requests.utils import get_encoding_from_headers

__all__ = ["TransportAdapter"]

RequestsTimeout = float | tuple[float | None, float | None] | None


class TransportAdapter(requests.adapters.BaseAdapter):
    """Mount on a ``requests.Session`` to send its requests through an httpx transport.

    ```python
    session = requests.Session()
    adapter = TransportAdapter(httpx.HTTPTransport())
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    ```

    The transport owns the connection: ``verify``, ``cert`` and ``proxies`` given to
    ``requests`` are the transport's business (configure them on it), and are ignored
    here. ``timeout`` is passed on (a number, or requests' ``(connect, read)`` pair).
    Transport errors become the ``requests.exceptions`` a ``requests`` caller catches
    (``ConnectTimeout``, ``ReadTimeout``, ``ConnectionError``...); the adapter owns the
    transport and closes it with the session.
    """

    def __init__(self, transport: httpx.BaseTransport) -> None:
        super().__init__()
        if not isinstance(transport, httpx.BaseTransport):
            raise TypeError(
                f"TransportAdapter needs a synchronous httpx transport (httpx.BaseTransport), "
                f"not {type(transport).__name__}: requests sends synchronously"
            )
        self.transport = transport

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: RequestsTimeout = None,
        verify: bool | str = True,
        cert: Any = None,
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        outgoing = _to_httpx(request, timeout)
        try:
            answer = self.transport.handle_request(outgoing)
        except httpx.TransportError as exc:
            raise _requests_error(exc, request) from exc
        response = _to_requests(answer, request, stream=stream)
        # Digest auth and hooks resend through response.connection, as with HTTPAdapter.
        response.connection = self  # type: ignore[assignment]
        return response

    def close(self) -> None:
        self.transport.close()


def _to_httpx(request: requests.PreparedRequest, timeout: RequestsTimeout) -> httpx.Request:
    if request.url is None or request.method is None:
        raise requests.exceptions.InvalidURL("the prepared request has no URL or method")
    return httpx.Request(
        request.method,
        request.url,
        # Whitespace around a value is not part of it (RFC 9110, 5.5), and h11 refuses to
        # send it; requests sends what it is given (Mollie's client info ends in a space).
        headers=[(name, value.strip()) for name, value in request.headers.items()],
        content=_body_bytes(request.body),
        extensions={"timeout": _timeouts(timeout)},
    )


def _body_bytes(body: object) -> bytes:
    # Read once, whole: payonce journals the exact bytes, and every attempt sends them again.
    if body is None:
        return b""
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    read = getattr(body, "read", None)
    if callable(read):
        data = read()
        return data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if isinstance(body, Iterable):
        return b"".join(
            chunk.encode("utf-8") if isinstance(chunk, str) else bytes(chunk) for chunk in body
        )
    raise requests.exceptions.InvalidJSONError(
        f"cannot send a request body of type {type(body).__name__}"
    )


def _timeouts(timeout: RequestsTimeout) -> dict[str, float | None]:
    if isinstance(timeout, tuple):
        connect, read = timeout
    else:
        connect = read = timeout
    # requests has no write or pool timeout: the read one bounds them, as urllib3's does.
    return {"connect": connect, "read": read, "write": read, "pool": connect}


def _requests_error(
    exc: httpx.TransportError, request: requests.PreparedRequest
) -> requests.exceptions.RequestException:
    # The most specific first: httpx's timeouts are also network errors of a kind.
    kinds: list[tuple[type[httpx.TransportError], type[requests.exceptions.RequestException]]] = [
        (httpx.ConnectTimeout, requests.exceptions.ConnectTimeout),
        (httpx.ReadTimeout, requests.exceptions.ReadTimeout),
        (httpx.WriteTimeout, requests.exceptions.Timeout),
        (httpx.PoolTimeout, requests.exceptions.Timeout),
        (httpx.ProxyError, requests.exceptions.ProxyError),
        (httpx.UnsupportedProtocol, requests.exceptions.InvalidSchema),
    ]
    for httpx_kind, requests_kind in kinds:
        if isinstance(exc, httpx_kind):
            return requests_kind(str(exc) or type(exc).__name__, request=request)
    # Connect, read and write errors, a peer closing mid-answer: what requests reports as
    # ConnectionError from urllib3's own.
    return requests.exceptions.ConnectionError(str(exc) or type(exc).__name__, request=request)


def _to_requests(
    answer: httpx.Response, request: requests.PreparedRequest, *, stream: bool
) -> requests.Response:
    response = requests.Response()
    response.status_code = answer.status_code
    response.reason = answer.reason_phrase
    response.headers = CaseInsensitiveDict(_joined_headers(answer.headers))
    response.encoding = get_encoding_from_headers(response.headers)
    response.url = request.url or ""
    response.request = request
    body = _Body(answer, request)
    response.raw = body
    if not stream:
        # Read now, as requests does for a non-streamed call: a body cut short is an error
        # of this call, not of a later attribute access.
        try:
            response._content = body.read()
        finally:
            body.close()
    return response


def _joined_headers(headers: httpx.Headers) -> dict[str, str]:
    # requests shows a repeated header once, its values joined by ", " (urllib3's way).
    joined: dict[str, str] = {}
    names: dict[str, str] = {}
    for name, value in headers.multi_items():
        lower = name.lower()
        if lower in names:
            joined[names[lower]] += ", " + value
        else:
            names[lower] = name
            joined[name] = value
    return joined


class _Body(io.RawIOBase):
    """The answer's (decoded) body as the file-like ``response.raw`` requests reads from."""

    def __init__(self, answer: httpx.Response, request: requests.PreparedRequest) -> None:
        super().__init__()
        self._answer = answer
        self._request = request
        self._chunks: Iterator[bytes] = answer.iter_bytes()
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            try:
                self._pending = next(self._chunks)
            except StopIteration:
                return 0
            except httpx.TimeoutException as exc:
                raise requests.exceptions.ConnectionError(
                    str(exc) or "read timed out", request=self._request
                ) from exc
            except httpx.TransportError as exc:
                # A peer that promised a body and closed the connection halfway through.
                raise requests.exceptions.ChunkedEncodingError(
                    str(exc) or type(exc).__name__, request=self._request
                ) from exc
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size

    def close(self) -> None:
        if not self.closed:
            self._answer.close()
        super().close()

    def release_conn(self) -> None:
        # requests calls this when it is done with a streamed response.
        self.close()
