"""No import circles: every ``specchat`` import counts (module level, inside a function, lazy),
and so do those under ``if TYPE_CHECKING:``: they never run, but a type-only circle is still two
modules that each need the other to be understood (a Protocol on one side breaks it).

A circle is a strongly connected component of the module graph. The UI must have none (its
screens and panels get what they need through their constructors); the second test holds the
whole package to the same rule, and the third counts the type-only edges too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import specchat

PACKAGE_ROOT = Path(specchat.__file__).parent


def module_names() -> dict[str, Path]:
    """Every module of the package, by dotted name (a package by its ``__init__``)."""
    names: dict[str, Path] = {}
    for path in PACKAGE_ROOT.rglob("*.py"):
        parts = ["specchat", *path.relative_to(PACKAGE_ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports that can run: everything but the body of ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from _runtime_imports(ast.Module(body=[child], type_ignores=[]))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _runtime_imports(node)


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _every_import(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports anywhere, ``if TYPE_CHECKING:`` included."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def dependencies(module: str, path: Path, known: set[str], *, type_only: bool = False) -> set[str]:
    """The package's modules that ``module`` imports at run time (and for type checking only,
    with ``type_only``)."""
    found: set[str] = set()
    walk = _every_import if type_only else _runtime_imports
    for node in walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = _absolute(module, path, node)
            # ``from pkg import mod`` depends on pkg.mod where that is a module.
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        found.update(t for t in targets if t in known and t != module)
    return found | _parent_packages(found, module, known)


def _parent_packages(targets: set[str], module: str, known: set[str]) -> set[str]:
    """Importing ``a.b.c`` first runs ``a`` and ``a.b``: those count too, except the importer's
    own parents, which Python has already run by the time the importer runs."""
    own = {module.rsplit(".", n)[0] for n in range(1, module.count(".") + 1)}
    parents: set[str] = set()
    for target in targets:
        for n in range(1, target.count(".") + 1):
            parent = target.rsplit(".", n)[0]
            if parent in known and parent not in own and parent != module:
                parents.add(parent)
    return parents


def import_graph(*, type_only: bool = False) -> dict[str, set[str]]:
    names = module_names()
    known = set(names)
    return {module: dependencies(module, path, known, type_only=type_only) for module, path in names.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _describe(components: list[list[str]]) -> str:
    return "\n".join(" <-> ".join(component) for component in components) or "none"


def test_the_ui_has_no_import_circle() -> None:
    everywhere = circles(import_graph())
    in_ui = [c for c in everywhere if any(m.startswith("specchat.ui") for m in c)]
    assert in_ui == [], (
        f"import circles through the UI:\n{_describe(in_ui)}\nall circles:\n{_describe(everywhere)}"
    )


def test_the_package_has_no_import_circle() -> None:
    everywhere = circles(import_graph())
    assert everywhere == [], f"import circles in specchat:\n{_describe(everywhere)}"


def test_the_package_has_no_circle_even_through_type_only_imports() -> None:
    everywhere = circles(import_graph(type_only=True))
    assert everywhere == [], f"import circles, type-only imports counted:\n{_describe(everywhere)}"


def test_the_walk_finds_a_circle_and_tells_type_only_imports_apart() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\ndef f():\n    import y\n"
    )
    assert [n.names[0].name for n in _runtime_imports(tree) if isinstance(n, ast.Import)] == ["y"]
    assert [n.names[0].name for n in _every_import(tree) if isinstance(n, ast.Import)] == ["x", "y"]


def test_importing_a_submodule_counts_its_package() -> None:
    """``bench.command`` importing ``cli.options`` ran ``cli/__init__``, which imported the bench
    command back half-built: the walk must see that edge."""
    known = {"p", "p.cli", "p.cli.options", "p.bench", "p.bench.command"}
    assert _parent_packages({"p.cli.options"}, "p.bench.command", known) == {"p.cli"}
    assert _parent_packages({"p.cli.options"}, "p.cli.group", known) == set()
