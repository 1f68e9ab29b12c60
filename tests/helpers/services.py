"""The checkout service example (examples/checkout_service.py) run as it is deployed: under
uvicorn, in a child process of its own, configured as its docstring says."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from helpers.processes import EXAMPLES, deployed_env
from payonce.sandbox import DEFAULT_ACCOUNT, DEFAULT_API_KEY


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


class CheckoutService:
    """examples/checkout_service.py under uvicorn, in a child process of its own, configured
    as its docstring says, against the sandbox speaking Stripe's API."""

    def __init__(self, tmp_path: Path, stripe_url: str, port: int) -> None:
        self.env = deployed_env(
            tmp_path / "service-home",
            STRIPE_API_KEY=DEFAULT_API_KEY,
            STRIPE_API_BASE=stripe_url,
            PAYONCE_ACCOUNT=DEFAULT_ACCOUNT,
            PAYONCE_JOURNAL=str(tmp_path / "payonce-journal.db"),
            ORDERS_DB=str(tmp_path / "orders.db"),
        )
        self.log = tmp_path / "service.log"
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, crash_at: str | None = None) -> CheckoutService:
        self.launch(crash_at=crash_at)
        # Its start imports FastAPI, uvicorn and stripe-python: long on a loaded machine.
        wait_for(self._ready, "the checkout service to start", timeout=90.0)
        return self

    def launch(self, *, crash_at: str | None = None) -> None:
        """Start the process, not waiting for it to take requests."""
        env = dict(self.env)
        if crash_at is not None:
            env["PAYONCE_CRASH_AT"] = crash_at
        command = [
            sys.executable, "-m", "uvicorn", "checkout_service:app",
            "--app-dir", str(EXAMPLES),
            "--host", "127.0.0.1", "--port", str(self.port),
            "--loop", "asyncio", "--http", "h11", "--ws", "none", "--lifespan", "on",
        ]  # fmt: skip
        with self.log.open("ab") as log:
            log.write(f"--- start (PAYONCE_CRASH_AT={crash_at})\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                command, env=env, cwd=self.log.parent, stdout=log, stderr=subprocess.STDOUT
            )

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            pytest.fail(f"the checkout service exited ({self.process.returncode}):\n{self.output}")
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_killed(self) -> None:
        assert self.process is not None
        assert self.process.wait(timeout=30) == -signal.SIGKILL, self.output

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.wait_killed()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def pay(self, order_id: str, card: str = "pm_card_visa", amount: int = 4200) -> httpx.Response:
        payment = {"amount": amount, "currency": "eur", "payment_method": card}
        return httpx.post(f"{self.url}/orders/{order_id}/pay", json=payment, timeout=60.0)

    def order(self, order_id: str) -> httpx.Response:
        return httpx.get(f"{self.url}/orders/{order_id}", timeout=10.0)
