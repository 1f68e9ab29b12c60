"""A real HTTP proxy on loopback between payonce and the provider, that can answer in the
provider's place (a captive portal's or a misconfigured proxy's page, which never reached
the provider) or relay the provider's answer one byte at a time, as a congested or hostile
middlebox does."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import httpx

PORTAL_PAGE = b"<html><head><title>Sign in to the hotel Wi-Fi</title></head></html>"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _ProxyServer

    def log_message(self, format: str, *args: object) -> None:
        pass  # the tests' output stays the tests'

    def _relay(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.server.take_portal_turn():
            self.send_response(200)
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("content-length", str(len(PORTAL_PAGE)))
            self.end_headers()
            self.wfile.write(PORTAL_PAGE)
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
        answer = httpx.request(
            self.command, self.server.upstream + self.path, headers=headers, content=body
        )
        if self.server.trickle is not None:
            self._trickle(answer, self.server.trickle)
            return
        self.send_response(answer.status_code)
        for name, value in answer.headers.items():
            if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(name, value)
        self.send_header("content-length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

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
        self.portal_turns = 0
        """How many of the next requests the portal answers instead of the provider."""
        self.trickle: Trickled | None = None
        """Which part of the provider's answers to relay one byte at a time."""

    def take_portal_turn(self) -> bool:
        with self._lock:
            if self.portal_turns <= 0:
                return False
            self.portal_turns -= 1
            return True

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


@contextmanager
def portal_in_front_of(upstream: str, *, turns: int) -> Iterator[_ProxyServer]:
    """A proxy to ``upstream`` whose first ``turns`` answers are a portal's 200 HTML page."""
    with _proxy_to(upstream) as server:
        server.portal_turns = turns
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
