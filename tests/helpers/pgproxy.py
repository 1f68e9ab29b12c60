"""A TCP relay on loopback between payonce and a real PostgreSQL server that can lose the
connection at the worst moment: while a ``COMMIT`` is on its way, either before the
server has it (the transaction is rolled back) or after (it is committed, and the answer
never comes back), that can stop accepting connections (a database that is gone), and
that can freeze every connection without closing it (a network partition).

A write that is one statement in its own transaction carries no ``COMMIT``: the cut can
name that statement instead (``at=``, words of its text); named inside a transaction, the
cut falls on that transaction's ``COMMIT``. The relay reads the client's messages for it:
a simple query, a statement parsed, or one prepared earlier and bound by its name (a
connection that has used a statement a few times only binds it)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Literal

Cut = Literal["before_commit", "after_commit"]

COMMIT = b"COMMIT"
"""Where a cut happens unless told: the statement ``COMMIT`` (exactly)."""

_UNTYPED = {80877103, 80877104, 80877102}  # SSLRequest, GSSENCRequest, CancelRequest


class _Statements:
    """The client's side of one connection, read message by message: the text of each
    statement it sends to run, and of each it prepares, by name."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._started = False
        self._prepared: dict[bytes, bytes] = {}

    def sent(self, data: bytes) -> list[bytes]:
        """The statements whose messages ``data`` completes."""
        self._buffer += data
        texts: list[bytes] = []
        while True:
            if not self._started:  # untyped: length, then a code
                if len(self._buffer) < 8:
                    return texts
                length = int.from_bytes(self._buffer[:4], "big")
                if len(self._buffer) < length:
                    return texts
                code = int.from_bytes(self._buffer[4:8], "big")
                self._started = code not in _UNTYPED
                del self._buffer[:length]
                continue
            if len(self._buffer) < 5:
                return texts
            kind, length = self._buffer[:1], int.from_bytes(self._buffer[1:5], "big")
            if len(self._buffer) < 1 + length:
                return texts
            body = bytes(self._buffer[5 : 1 + length])
            del self._buffer[: 1 + length]
            if kind == b"Q":
                texts.append(body.split(b"\x00", 1)[0])
            elif kind == b"P":
                name, text = body.split(b"\x00", 2)[:2]
                if name:
                    self._prepared[name] = text
                texts.append(text)
            elif kind == b"B":
                name = body.split(b"\x00", 2)[1]
                if name in self._prepared:
                    texts.append(self._prepared[name])


def _names(text: bytes, at: bytes) -> bool:
    return text.strip() == at if at == COMMIT else at in text


class PostgresRelay:
    """Relays every connection to ``upstream``; ``cut_next(...)`` loses the next ``COMMIT``."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._cuts: list[tuple[Cut, bytes]] = []
        self.cuts_made = 0
        self._refusing = False
        self._refuse_next = 0
        self.refused = 0
        """Connections dropped as soon as they were accepted (``refuse_next``)."""
        self._sockets: set[socket.socket] = set()
        self._flowing = threading.Event()
        self._flowing.set()
        self.held = threading.Event()
        """Set once a frozen relay holds bytes back: someone is waiting on the database."""
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def cut_next(self, *cuts: Cut, at: bytes = COMMIT) -> None:
        """Lose the connection at each of the next ``COMMIT``s, in this order; or at the
        next statements whose text holds ``at``."""
        with self._lock:
            self._cuts.extend((cut, at) for cut in cuts)

    def refuse(self) -> None:
        """Drop every connection and refuse new ones: the database is gone."""
        with self._lock:
            self._refusing = True
            sockets = list(self._sockets)
        for sock in sockets:
            _close(sock)

    def accept(self) -> None:
        """Accept new connections again: the database is back (after ``refuse``)."""
        with self._lock:
            self._refusing = False

    def refuse_next(self, connections: int) -> None:
        """Drop the next ``connections`` as soon as they are accepted, as a database
        restarting (or failing over) does, then relay again."""
        with self._lock:
            self._refuse_next += connections

    def freeze(self) -> None:
        """A network partition: every connection stays open but nothing more crosses the
        relay either way (no reset, no FIN), until ``thaw``."""
        self.held.clear()
        self._flowing.clear()

    def thaw(self) -> None:
        """The partition ends: what was held back goes through."""
        self._flowing.set()

    def _take_cut(self, text: bytes) -> Cut | None:
        with self._lock:
            if self._cuts and _names(text, self._cuts[0][1]):
                return self._cuts.pop(0)[0]
            return None

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refused = self._refusing or self._refuse_next > 0
                if self._refuse_next > 0:
                    self._refuse_next -= 1
                    self.refused += 1
            if refused:
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
        statements = _Statements()
        # A statement named inside a transaction is lost with that transaction's COMMIT,
        # which may travel in a later flight: the cut waits for it (armed).
        in_transaction, armed = False, None
        try:
            while data := source.recv(65536):
                if not self._flowing.is_set():
                    self.held.set()
                    self._flowing.wait()
                cut = None
                for text in statements.sent(data) if from_client else ():
                    is_commit = text.strip() == COMMIT
                    if armed is not None and is_commit:
                        cut, armed = armed, None
                    elif armed is None and (taken := self._take_cut(text)) is not None:
                        if in_transaction and not is_commit:
                            armed = taken
                        else:
                            cut = taken
                    if cut is not None:
                        break
                    if text.lstrip().upper().startswith(b"BEGIN"):
                        in_transaction = True
                    elif is_commit or text.strip().upper() == b"ROLLBACK":
                        in_transaction = False
                if cut == "after_commit":
                    # The server gets the COMMIT and carries it out; its answer, relayed
                    # the other way, finds the client gone: gone first, so that no answer
                    # can slip through before the cut (a loaded machine let one, and the
                    # transaction then never lost its connection).
                    self.cuts_made += 1
                    _close(source)
                    sink.sendall(data)
                    keep_sink = True
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
        self.thaw()
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
