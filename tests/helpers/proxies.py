"""A real HTTP proxy on loopback between payonce and the provider, that can answer in the
provider's place (a captive portal's or a load balancer's page, which never reached the
provider), relay the provider's answer one byte at a time, as a congested or hostile
middlebox does, or relay it mislabelled as gzip-compressed."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, NamedTuple

import httpx

PORTAL_PAGE = b"<html><head><title>Sign in to the hotel Wi-Fi</title></head></html>"


class Page(NamedTuple):
    """An answer the proxy writes itself, in the provider's place."""

    status: int
    content_type: str | None
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    after_relaying: bool = False
    """Relay the request to the provider first and answer this page instead of its answer,
    as a firewall that inspects answers does: the provider has executed the request."""


PORTAL = Page(200, "text/html; charset=utf-8", PORTAL_PAGE)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _ProxyServer

    def log_message(self, format: str, *args: object) -> None:
        pass  # the tests' output stays the tests'

    def _relay(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        page = self.server.next_page()
        if page is not None and not page.after_relaying:
            self._answer(page)
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
        try:
            answer = httpx.request(
                self.command, self.server.upstream + self.path, headers=headers, content=body
            )
        except httpx.TransportError:
            # The provider's answer was lost on the way (it dropped the connection): so is
            # the client's.
            self.close_connection = True
            return
        if page is not None:
            self._answer(page)
            return
        if self.server.trickle is not None:
            self._trickle(answer, self.server.trickle)
            return
        self.send_response(answer.status_code)
        for name, value in answer.headers.items():
            if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(name, value)
        if self.command in self.server.false_gzip:
            self.send_header("content-encoding", "gzip")  # and the body is not
        self.send_header("content-length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    def _answer(self, page: Page) -> None:
        self.send_response(page.status)
        if page.content_type is not None:
            self.send_header("content-type", page.content_type)
        for name, value in page.headers:
            self.send_header(name, value)
        self.send_header("content-length", str(len(page.body)))
        self.end_headers()
        self.wfile.write(page.body)

    def _trickle(self, answer: httpx.Response, part: Trickled) -> None:
        """The provider's answer, ``part`` of it one byte per ``TRICKLE_INTERVAL``; the
        connection is closed after ``TRICKLE_FOR`` seconds whether all of it went or not."""
        lines = [f"HTTP/1.1 {answer.status_code} {answer.reason_phrase}"]
        lines += [
            f"{name}: {value}"
            for name, value in answer.headers.items()
            if name.lower() not in ("content-length", "transfer-encoding", "connection")
        ]
        lines += [f"content-length: {len(answer.content)}", "connection: close"]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        at_once, slowly = (b"", head + answer.content) if part == "head" else (head, answer.content)
        self.close_connection = True
        stop = time.monotonic() + TRICKLE_FOR
        try:
            self.wfile.write(at_once)
            for byte in slowly:
                if time.monotonic() > stop:
                    return
                self.wfile.write(bytes([byte]))
                time.sleep(TRICKLE_INTERVAL)
        except (BrokenPipeError, ConnectionResetError):
            return  # the client hung up: what a deadline does

    do_GET = do_POST = _relay


Trickled = Literal["head", "body"]
TRICKLE_INTERVAL = 0.05
"""Well inside any read timeout: every read gets a byte in time."""
TRICKLE_FOR = 20.0


class _ProxyServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream = upstream
        self._lock = threading.Lock()
        self.pages: list[Page | None] = []
        """What answers each of the next requests: a page of the proxy's own, or None for
        the provider (relayed). Once the list is used up, every request is relayed."""
        self.trickle: Trickled | None = None
        """Which part of the provider's answers to relay one byte at a time."""
        self.false_gzip: frozenset[str] = frozenset()
        """The methods whose answers are relayed labelled gzip-compressed, which they are not."""

    def next_page(self) -> Page | None:
        with self._lock:
            return self.pages.pop(0) if self.pages else None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


@contextmanager
def portal_in_front_of(upstream: str, *, turns: int) -> Iterator[_ProxyServer]:
    """A proxy to ``upstream`` whose first ``turns`` answers are a portal's 200 HTML page."""
    with pages_in_front_of(upstream, [PORTAL] * turns) as server:
        yield server


@contextmanager
def pages_in_front_of(upstream: str, pages: list[Page | None]) -> Iterator[_ProxyServer]:
    """A proxy to ``upstream`` whose next answers are ``pages`` (None: the provider's)."""
    with _proxy_to(upstream) as server:
        server.pages = list(pages)
        yield server


@contextmanager
def mislabelling_in_front_of(upstream: str, *methods: str) -> Iterator[_ProxyServer]:
    """A proxy that relays ``upstream``'s answers to ``methods`` labelled
    ``Content-Encoding: gzip``, as a misconfigured one does, though they are not."""
    with _proxy_to(upstream) as server:
        server.false_gzip = frozenset(methods)
        yield server


@contextmanager
def trickling_in_front_of(upstream: str, *, part: Trickled) -> Iterator[_ProxyServer]:
    """A proxy that relays ``upstream``'s answers with ``part`` of each one trickled."""
    with _proxy_to(upstream) as server:
        server.trickle = part
        yield server


@contextmanager
def _proxy_to(upstream: str) -> Iterator[_ProxyServer]:
    server = _ProxyServer(upstream)
    # A short poll: shutdown() waits for the next one, 0.5 s by default.
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextmanager
def https_server_with_an_untrusted_certificate() -> Iterator[str]:
    """An HTTPS server on loopback whose certificate no client trusts (a fresh test CA's),
    as a man in the middle or a misconfigured endpoint presents: its URL."""
    import ssl

    import trustme

    authority = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(context)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    # A short poll: shutdown() waits for the next one, 0.5 s by default.
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"https://localhost:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
