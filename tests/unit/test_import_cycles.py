"""No two stoker modules import each other, however far round: every ``import`` and
``from ... import`` in a file counts (inside functions, under ``if TYPE_CHECKING:``, relative
ones resolved), so each module can be read, tested and loaded after the ones it names."""

from __future__ import annotations

import ast
from pathlib import Path

import stoker

ROOT = Path(stoker.__file__).parent


def _module_name(path: Path) -> str:
    parts = ("stoker", *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in ROOT.rglob("*.py")}


def _deepest_module(name: str) -> str | None:
    """The module a dotted name is, or is inside (``stoker.x.y.f`` -> ``stoker.x.y``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> set[str]:
    """The stoker modules ``module`` names in any import statement of its file."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import name``: the module pkg.name if there is one, else pkg itself.
            named.update(f"{base}.{alias.name}" for alias in node.names)
    found = {_deepest_module(n) for n in named if n == "stoker" or n.startswith("stoker.")}
    return {m for m in found if m is not None and m != module}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(_one_cycle(graph, group) for group in groups)


def _one_cycle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest way round from the group's first module back to it."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    following.append(w)
        frontier = following
    raise AssertionError(f"no way round {sorted(group)}")


def test_the_graph_sees_every_kind_of_import() -> None:
    graph = {m: _imports(m) for m in MODULES}
    assert "stoker.engine.process_iter" in graph["stoker.loader"]  # inside a method
    assert "stoker.formats.pack" in graph["stoker.formats"]  # under TYPE_CHECKING
    assert "stoker.cli.doctor" in graph["stoker.cli"] or "stoker.cli.pack" in graph["stoker.cli"]


def test_the_cycle_finder_names_a_cycle_of_any_length() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d", "a"}, "e": {"f"}, "f": {"e"}}
    assert _cycles(graph) == [["a", "b", "c", "a"], ["e", "f", "e"]]


def test_no_stoker_module_imports_itself_round_a_cycle() -> None:
    graph = {m: _imports(m) for m in MODULES}
    cycles = _cycles(graph)
    assert not cycles, "import cycles (break each by moving what both need below both):\n" + (
        "\n".join(" -> ".join(cycle) for cycle in cycles)
    )
