"""A TCP relay on loopback between payonce and a real PostgreSQL server that can lose the
connection at the worst moment: while a ``COMMIT`` is on its way, either before the
server has it (the transaction is rolled back) or after (it is committed, and the answer
never comes back), and that can stop accepting connections (a database that is gone)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Literal

Cut = Literal["before_commit", "after_commit"]

_COMMIT = b"COMMIT\x00"


class PostgresRelay:
    """Relays every connection to ``upstream``; ``cut_next(...)`` loses the next ``COMMIT``."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._cuts: list[Cut] = []
        self.cuts_made = 0
        self._refusing = False
        self._sockets: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def cut_next(self, *cuts: Cut) -> None:
        """Lose the connection at each of the next ``COMMIT``s, in this order."""
        with self._lock:
            self._cuts.extend(cuts)

    def refuse(self) -> None:
        """Drop every connection and refuse new ones: the database is gone."""
        with self._lock:
            self._refusing = True
            sockets = list(self._sockets)
        for sock in sockets:
            _close(sock)

    def _take_cut(self) -> Cut | None:
        with self._lock:
            return self._cuts.pop(0) if self._cuts else None

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._refusing:
                    _close(client)
                    continue
            try:
                server = socket.create_connection(self._upstream)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._sockets.update((client, server))
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        keep_sink = False
        try:
            while data := source.recv(65536):
                cut = self._take_cut() if from_client and _COMMIT in data else None
                if cut == "after_commit":
                    # The server gets the COMMIT and carries it out; its answer, relayed
                    # the other way, finds the client gone.
                    sink.sendall(data)
                    keep_sink = True
                    self.cuts_made += 1
                    return
                if cut == "before_commit":
                    self.cuts_made += 1  # the server never sees it: rolled back
                    return
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _close(source)
            if not keep_sink:
                _close(sink)

    def close(self) -> None:
        self.refuse()
        _close(self._listener)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


@contextlib.contextmanager
def relay_to(host: str, port: int) -> Iterator[PostgresRelay]:
    relay = PostgresRelay(host, port)
    try:
        yield relay
    finally:
        relay.close()
