"""Sandbox servers shared by the whole session, each handed out reset."""

from __future__ import annotations

from payonce.sandbox import SandboxConfig, SandboxServer


class SharedSandboxes:
    """One running server per configuration name, started on first use.

    Each use resets it (``SandboxServer.reset``: nothing of the previous test is left),
    which costs next to nothing, where starting and stopping a server of its own costs a
    test about 0.2 s. A test that stops the server (the provider going away) gets it
    replaced on the next use.
    """

    def __init__(self) -> None:
        self._servers: dict[str, SandboxServer] = {}

    def get(self, name: str, config: SandboxConfig) -> SandboxServer:
        server = self._servers.get(name)
        if server is not None and server.running:
            if server.config != config:
                raise ValueError(f"the shared sandbox {name!r} has another configuration")
            server.reset()
            return server
        server = SandboxServer(config).start()
        self._servers[name] = server
        return server

    def close(self) -> None:
        for server in self._servers.values():
            server.stop()
        self._servers.clear()
