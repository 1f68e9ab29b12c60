"""The shape of the package, pinned: no import cycles, nothing imported upward, and no I/O
in the lifecycle that decides everything (docs/architecture.md).

Read from the source with ``ast``, every import counted (those under ``TYPE_CHECKING`` and
inside functions too), so a cycle cannot hide behind a lazy import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "payonce"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> Iterator[str]:
    """The modules ``path`` imports, absolute (``from .m import x`` gives ``package.m`` and
    ``package.m.x``, of which only real modules count)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                anchor = ".".join([*base, node.module] if node.module else base)
            else:
                anchor = node.module or ""
            if not name.startswith(anchor + "."):
                # ``from . import x`` runs the package first, as every import of a module
                # inside it does: not an arrow of its own.
                yield anchor
            for alias in node.names:
                yield f"{anchor}.{alias.name}"


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _graph() -> dict[str, set[str]]:
    """Module -> the payonce modules it imports (a package counts as its __init__)."""
    return {
        name: {target for target in _imports(path) if target in MODULES and target != name}
        for name, path in MODULES.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_there_is_no_import_cycle() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    # The check above can fail: a loop of three is found, a chain is not.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


LAYERS = {
    # What each private package may import from payonce, besides itself.
    "payonce._lifecycle": {"payonce.errors"},
    "payonce._providers": {"payonce.errors", "payonce._lifecycle"},
    "payonce._journal": {
        "payonce.errors",
        "payonce._lifecycle",
        "payonce._providers",
        "payonce._owners",
        "payonce._fork",
        "payonce._crash",
        "payonce._lean_import",
        "payonce._version",
    },
    # The SDK glue reaches a client through its public transport() only: it plugs into
    # whatever transport the runtime gives, and the runtime never depends on it. The
    # requests adapter both build (Client.requests_adapter(), the Mollie glue) is a leaf
    # below them, importing nothing of payonce.
    "payonce.integrations": {"payonce.errors", "payonce._requests_adapter"},
    "payonce._requests_adapter": set(),
}


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_nothing_is_imported_upward(layer: str) -> None:
    allowed = LAYERS[layer]
    upward = sorted(
        f"{name} imports {target}"
        for name, targets in _graph().items()
        if name == layer or name.startswith(layer + ".")
        for target in targets
        if not (target == layer or target.startswith(layer + "."))
        and not any(target == a or target.startswith(a + ".") for a in allowed)
    )
    assert upward == []


IO_MODULES = {
    "os",
    "socket",
    "time",
    "threading",
    "sqlite3",
    "asyncio",
    "subprocess",
    "signal",
    "select",
    "pathlib",
    "psycopg",
    "random",
}


def test_the_lifecycle_imports_nothing_that_does_io() -> None:
    used = sorted(
        f"{name} imports {target}"
        for name, path in MODULES.items()
        if name.startswith("payonce._lifecycle")
        for target in _imports(path)
        if target.split(".")[0] in IO_MODULES
    )
    assert used == []
    # And no HTTP transport: httpx's requests and responses are data, its clients are not.
    for name, path in MODULES.items():
        if name.startswith("payonce._lifecycle"):
            text = path.read_text()
            for transport in ("httpx.Client(", "httpx.AsyncClient(", "Transport("):
                assert transport not in text, f"{name} uses {transport}"
