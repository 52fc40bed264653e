"""The shape of the package: nothing oversized, no import cycles, sides kept apart.

Issue 26 drew these lines; a test keeps them, so a module that grows past them is
split when it happens rather than in another architecture step.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "nbckpt"
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 300


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The nbckpt modules ``name`` imports at module level (not inside functions)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):  # TYPE_CHECKING blocks import nothing at run time
                test = node.test
                if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
                    visit(node.orelse)
                    continue
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("nbckpt"))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join([*base, node.module] if node.module else base)
                else:
                    module = node.module or ""
                if not module.startswith("nbckpt"):
                    continue
                for alias in node.names:
                    full = f"{module}.{alias.name}"
                    found.add(full if full in MODULES else module)

    visit(tree.body)
    return {m for m in found if m in MODULES and m != name}


def test_no_module_is_oversized() -> None:
    big = {
        name: n
        for name, path in MODULES.items()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not big, f"modules over {MAX_MODULE_LINES} lines: {big}"


def test_no_class_is_oversized() -> None:
    big = {}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    big[f"{name}.{node.name}"] = lines
    assert not big, f"classes over {MAX_CLASS_LINES} lines: {big}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in graph:
        if v not in index:
            strong(v)
    return groups


def _package_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    # A package's __init__ re-exporting its own modules is not a cycle of concepts.
    return {
        v: {w for w in ws if not (v in MODULES and w.startswith(v + ".") and _is_package(v))}
        for v, ws in graph.items()
    }


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def test_no_import_cycles() -> None:
    graph = _package_edges({name: _imports(name, path) for name, path in MODULES.items()})
    assert _cycles(graph) == []


def test_the_checker_sees_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_engine_never_imports_the_kernel_side() -> None:
    kernel = ("nbckpt.session", "nbckpt.magics", "nbckpt.widgets", "nbckpt.server")
    crossing = {
        name: sorted(m for m in _imports(name, path) if m.startswith(kernel))
        for name, path in MODULES.items()
        if name.startswith("nbckpt.engine")
    }
    assert {k: v for k, v in crossing.items() if v} == {}


def _every_import(path: Path) -> set[str]:
    """Every nbckpt module ``path`` imports, at module level or in a function.

    ``from pkg import module`` names the module; ``from pkg import name``, the package.
    """
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in MODULES else node.module)
    return {m for m in found if m in MODULES}


def test_magics_reach_nbckpt_through_the_session_only() -> None:
    # The magics are thin shells: the session (client, cluster) and the words, errors
    # and widgets they show; never the engine, the formats or the storage directly.
    # Only the argument module reads the protocol's words (choices, defaults).
    allowed = ("nbckpt.session", "nbckpt.magics", "nbckpt.errors", "nbckpt.widgets")
    crossing = {
        name: sorted(
            m
            for m in _every_import(path)
            if not m.startswith(allowed)
            and not (name.startswith("nbckpt.magics.args") and m.startswith("nbckpt.protocol"))
        )
        for name, path in MODULES.items()
        if name.startswith("nbckpt.magics")
    }
    assert {k: v for k, v in crossing.items() if v} == {}


def test_formats_and_restore_have_no_cycle_even_inside_functions() -> None:
    # Restore once picked Orbax's reader through a function-level import of a module
    # that imported it back; the registry of layouts (nbckpt.formats.registry) and the
    # shared target checks (nbckpt.engine.restore.targets) replaced that.
    areas = ("nbckpt.formats", "nbckpt.engine.restore")
    graph = {
        name: {m for m in _every_import(path) if m.startswith(areas) and m != name}
        for name, path in MODULES.items()
        if name.startswith(areas)
    }
    assert _cycles(_package_edges(graph)) == []
