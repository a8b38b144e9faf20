"""The package's layers (docs/architecture.md, "The layers") and no import cycle.

Every import counts: at module level, inside a function (kept lazy for start-up time)
and under ``TYPE_CHECKING``. A lazy import still ties two modules together.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Bottom to top: a part imports only from its own layer or the ones below it.
LAYERS: list[set[str]] = [
    {"turnkeeper", "errors", "config", "logconfig", "owner", "secret", "chunks", "envelope"},
    {"store", "log", "sandbox", "embedded"},
    {"agents", "hosts", "queues"},
    {"workers"},
    {"driver"},
    {"reconciler", "watcher"},
    {"tasks"},
    {"conversation", "client", "checkup"},
    {"web", "cli", "__main__"},
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / "turnkeeper").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ours ``name`` imports (a name imported from a package is the
    package's; a submodule imported from it is the submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in modules:
                    found.add(full)
                elif base in modules:
                    found.add(base)
    return found - {name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root, targets in graph.items():
        if root in index:
            continue
        work = [(root, iter(sorted(targets)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            target = next(edges, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def test_no_module_imports_itself_back() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_each_part_imports_only_its_layer_and_below() -> None:
    layer_of = {part: n for n, parts in enumerate(LAYERS) for part in parts}
    graph = _graph()
    unplaced = sorted({_part(module) for module in graph} - set(layer_of))
    assert unplaced == [], "put each new part in a layer of LAYERS"
    upward = sorted(
        (module, target)
        for module, targets in graph.items()
        for target in targets
        if layer_of[_part(target)] > layer_of[_part(module)]
    )
    assert upward == []
