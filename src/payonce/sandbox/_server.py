"""Running the sandbox with uvicorn: in a background thread, or in the foreground."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

import uvicorn
from starlette.types import ASGIApp

from payonce.sandbox._app import RESET_TIMEOUT, Sandbox
from payonce.sandbox._config import SandboxConfig
from payonce.sandbox._faults import Faults
from payonce.sandbox._store import SandboxStore
from payonce.sandbox._webhooks import WebhookAttempt

_START_TIMEOUT = 10.0
_STOP_TIMEOUT = 10.0


def _listen(host: str, port: int) -> socket.socket:
    # Binding here rather than in uvicorn tells us the real port (for port 0) before it starts.
    # The explicit IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on accepted sockets whose
    # proto says TCP, and without it every response costs a 40 ms delayed-ACK stall.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _uvicorn_server(app: ASGIApp) -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        # Pinned rather than "auto", so the injected connection drop behaves the same
        # whether or not uvloop/httptools happen to be installed.
        loop="asyncio",
        http="h11",
        ws="none",
        lifespan="on",
        # None: leave the host program's logging configuration alone.
        log_config=None,
        log_level="warning",
        access_log=False,
        # The sandbox dates its answers by its own clock (advance_clock included).
        date_header=False,
        timeout_graceful_shutdown=5,
    )
    return uvicorn.Server(config)


class SandboxServer:
    """A sandbox provider on a real socket, served from a daemon thread."""

    def __init__(
        self, config: SandboxConfig | None = None, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.config = config or SandboxConfig()
        self.host = host
        self.port = port
        self.store = SandboxStore(self.config.store_path)
        self._sandbox = Sandbox(self.config, self.store, owns_store=False)
        self._url: str | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def running(self) -> bool:
        """Started and not yet stopped."""
        return self._url is not None and not self._closed

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("the sandbox server is not started")
        return self._url

    def start(self) -> SandboxServer:
        if self._thread is not None or self._closed:
            raise RuntimeError("a SandboxServer can be started only once")
        sock = _listen(self.host, self.port)
        self.port = sock.getsockname()[1]
        url = _url(sock)
        server = _uvicorn_server(self._sandbox.app)
        # Off the main thread uvicorn installs no signal handlers, which is what we want.
        thread = threading.Thread(
            target=server.run,
            kwargs={"sockets": [sock]},
            name=f"payonce-sandbox-{self.port}",
            daemon=True,
        )
        self._server, self._thread = server, thread
        thread.start()
        deadline = time.monotonic() + _START_TIMEOUT
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                sock.close()
                self.stop()
                raise RuntimeError("the sandbox server failed to start")
            time.sleep(0.002)
        self._url = url
        return self

    def stop(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(_STOP_TIMEOUT)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(_STOP_TIMEOUT)
        if self._sandbox.webhooks is not None:
            self._sandbox.webhooks.close()
        self.store.close()

    def __enter__(self) -> SandboxServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def script(self, faults: Sequence[str]) -> None:
        """Queue faults for the next payment requests, one each, ahead of random faults."""
        self._sandbox.injector.script(faults)

    def set_faults(self, faults: Faults) -> None:
        self._sandbox.injector.set_faults(faults)

    def advance_clock(self, seconds: float) -> None:
        self.store.clock.advance(seconds)

    def reset(self, timeout: float = RESET_TIMEOUT) -> None:
        """Put the running server back as it started, for its next user.

        Payments, PaymentIntents, idempotency keys, execution counts and the clock offset
        are forgotten; the faults are the configured ones again, with their random draws
        restarted from the seed and no scripted fault left; queued webhook deliveries and
        recorded attempts are dropped. The configuration itself (API keys, dialect,
        processing time, ...) stays. It first waits, up to ``timeout`` seconds, for the API
        requests still being handled to end, so that none of them lands in the fresh state;
        ``RuntimeError`` if some never do. A test suite can so share one server between its
        tests instead of starting one for each. ``POST /_sandbox/reset`` does the same over
        HTTP.
        """
        self._sandbox.reset(timeout)

    @contextmanager
    def holding(self) -> Iterator[None]:
        """While the block runs, every request that executes (a payment, a PaymentIntent
        created or confirmed) waits at the provider, its idempotency key claimed, before it
        executes; it executes and answers once the block ends. A test so decides when the
        provider answers (another worker tries the same intent meanwhile, a lease is
        renewed meanwhile), however loaded the machine, where ``processing_seconds`` only
        bets on how long that takes. ``wait_held`` tells when a request has arrived."""
        self._sandbox.hold.hold()
        try:
            yield
        finally:
            self._sandbox.hold.let_go()

    @property
    def held(self) -> int:
        """How many requests are waiting in ``holding`` now."""
        return self._sandbox.hold.held

    def wait_held(self, count: int = 1, timeout: float = 30.0) -> bool:
        """Wait until ``count`` requests are waiting in ``holding``; False on timeout."""
        return self._sandbox.hold.wait_held(count, timeout)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until no request is being handled, slow executions a client gave up on
        included, so that counts read afterwards are final. False on timeout."""
        return self._sandbox.wait_idle(timeout)

    def webhook_attempts(self) -> list[WebhookAttempt]:
        """Every webhook delivery attempt so far, in the order they ended."""
        if self._sandbox.webhooks is None:
            raise RuntimeError("this sandbox is configured without webhooks")
        return self._sandbox.webhooks.attempts()

    def wait_for_webhooks(self, timeout: float = 10.0) -> bool:
        """Wait until every webhook delivery, retry and redelivery scheduled has ended."""
        if self._sandbox.webhooks is None:
            raise RuntimeError("this sandbox is configured without webhooks")
        return self._sandbox.webhooks.wait_idle(timeout)


@contextmanager
def _exit_on_signals(server: uvicorn.Server) -> Iterator[None]:
    # uvicorn handles SIGINT/SIGTERM while serving, then re-raises the signal against the
    # previous handler; with this one in place that ends in a clean return, not a traceback
    # or a death by signal. It also covers a signal arriving during start-up.
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        server.should_exit = True

    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, handle) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


async def _serve_until_exit(
    server: uvicorn.Server, sock: socket.socket, ready: Callable[[str], None] | None
) -> None:
    url = _url(sock)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.005)
    if server.started and ready is not None:
        ready(url)
    await serving


def serve(
    config: SandboxConfig,
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve in the foreground until SIGINT/SIGTERM; ``ready`` gets the base URL once listening."""
    store = SandboxStore(config.store_path)
    try:
        sandbox = Sandbox(config, store, owns_store=False)
        server = _uvicorn_server(sandbox.app)
        sock = _listen(host, port)
        with _exit_on_signals(server):
            asyncio.run(_serve_until_exit(server, sock, ready))
    finally:
        store.close()
