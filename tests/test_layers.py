"""Every top-level module of ``specchat`` has a place: a layer of the import contract
(pyproject's ``[tool.importlinter]``, checked by ``lint-imports`` in CI) or the short list of
ground every layer may stand on. A new module outside both would escape the contract unseen."""

from __future__ import annotations

import tomllib
from pathlib import Path

import specchat

PACKAGE_ROOT = Path(specchat.__file__).parent
PYPROJECT = PACKAGE_ROOT.parent / "pyproject.toml"
GROUND = {"params", "errors", "files", "untrusted", "cache_root"}


def layered_modules() -> set[str]:
    contracts = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]
    names: set[str] = set()
    for contract in contracts:
        for layer in contract.get("layers", []):
            names.update(part.strip().removeprefix("specchat.") for part in layer.split("|"))
    return names


def top_level_modules() -> set[str]:
    modules = {path.stem for path in PACKAGE_ROOT.glob("*.py") if path.stem != "__init__"}
    packages = {path.parent.name for path in PACKAGE_ROOT.glob("*/__init__.py")}
    return modules | packages


def test_every_module_is_in_a_layer_or_on_the_ground() -> None:
    layered = layered_modules()
    assert not layered & GROUND, "a module is both layered and ground"
    assert top_level_modules() - layered - GROUND == set()


def test_every_layer_names_a_module_that_exists() -> None:
    assert layered_modules() - top_level_modules() == set()
