"""A TCP relay between payonce and a real PostgreSQL server that counts round trips.

A round trip is one wait of the client for the server: the server speaking after the
client has sent something since the server last spoke. The relay sees both directions in
one thread, in the order the bytes arrive, so an answer is never counted before the
request it answers. Nothing is parsed or changed: the count is the network's, whatever
the driver batches (pipelined statements sent together and answered together count
once).
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import urllib.parse
from collections.abc import Iterator

__all__ = ["RoundTripCounter", "counting_round_trips"]


class RoundTripCounter:
    """Listens on loopback; every connection is relayed to ``upstream`` and counted."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)  # so that close() is seen
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._round_trips = 0
        self.flights: list[bytes] = []
        """What the client sent for each round trip counted, in order."""
        self._closed = False
        self._threads: list[threading.Thread] = []
        accepting = threading.Thread(target=self._accept, name="pg-round-trips", daemon=True)
        accepting.start()
        self._threads.append(accepting)

    @property
    def round_trips(self) -> int:
        with self._lock:
            return self._round_trips

    def reset(self) -> None:
        with self._lock:
            self._round_trips = 0
            self.flights = []

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            server = socket.create_connection(self._upstream)
            relay = threading.Thread(target=self._relay, args=(client, server), daemon=True)
            relay.start()
            self._threads.append(relay)

    def _relay(self, client: socket.socket, server: socket.socket) -> None:
        client_spoke, flight = False, bytearray()
        with client, server:
            while not self._closed:
                readable, _, _ = select.select([client, server], [], [], 0.2)
                for side in readable:
                    data = side.recv(65536)
                    if not data:
                        return
                    if side is client:
                        client_spoke = True
                        flight += data
                        server.sendall(data)
                    else:
                        if client_spoke:
                            client_spoke = False
                            with self._lock:
                                self._round_trips += 1
                                self.flights.append(bytes(flight))
                            flight.clear()
                        client.sendall(data)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for thread in self._threads:
            thread.join(timeout=5)


@contextlib.contextmanager
def counting_round_trips(url: str) -> Iterator[tuple[str, RoundTripCounter]]:
    """``url`` rewritten to go through a counting relay (no TLS, so the relay sees the
    protocol as it is), and the counter."""
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None, url
    assert parts.port is not None, url
    counter = RoundTripCounter((parts.hostname, parts.port))
    userinfo = parts.netloc.rpartition("@")[0]
    plain = [("sslmode", "disable"), ("gssencmode", "disable")]
    query = [*urllib.parse.parse_qsl(parts.query), *plain]
    relayed = parts._replace(
        netloc=f"{userinfo}@127.0.0.1:{counter.port}", query=urllib.parse.urlencode(query)
    )
    try:
        yield urllib.parse.urlunsplit(relayed), counter
    finally:
        counter.close()
