"""Room sizes: no function in ``specchat/`` over 80 lines, no module over 500.

A long function hides its steps and a long module several jobs (STYLE.md, "Where the code should
grow"). A module allowed past the line is named in LONG_MODULES with the reason (none today); a
module that falls back under the line must leave the list (the last test).
"""

from __future__ import annotations

import ast
from pathlib import Path

import specchat

PACKAGE_ROOT = Path(specchat.__file__).parent
FUNCTION_LINES = 80
MODULE_LINES = 500

LONG_MODULES: dict[str, str] = {}
"""Module path (relative to specchat/) -> why it is one room although longer than MODULE_LINES."""


def python_files() -> list[Path]:
    return sorted(PACKAGE_ROOT.rglob("*.py"))


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_function_is_over_80_lines() -> None:
    long: list[str] = []
    for path in python_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE_ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "\n".join(long)


def test_no_module_is_over_500_lines_unless_named() -> None:
    long = [
        f"{path.relative_to(PACKAGE_ROOT)} ({line_count(path)} lines)"
        for path in python_files()
        if line_count(path) > MODULE_LINES and str(path.relative_to(PACKAGE_ROOT)) not in LONG_MODULES
    ]
    assert not long, "\n".join(long)


def test_every_named_long_module_is_still_long() -> None:
    shorter = [name for name in LONG_MODULES if line_count(PACKAGE_ROOT / name) <= MODULE_LINES]
    assert not shorter, f"back under {MODULE_LINES} lines, take them off LONG_MODULES: {shorter}"
