"""The split between engine and TUI, checked in a clean interpreter (sys.modules does not lie)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CASES = [
    ("import specchat", ("torch", "transformers", "textual")),
    ("import specchat.engine.events, specchat.engine.metrics", ("torch", "textual", "rich")),
    ("import specchat.engine.session", ("textual",)),
    ("import specchat.ui.app", ("torch", "transformers")),
    ("import specchat.store.folder, specchat.store.markdown, specchat.ui.state.live", ("torch", "textual")),
]


@pytest.mark.parametrize(("statement", "forbidden"), CASES)
def test_imports_stay_on_their_side(statement: str, forbidden: tuple[str, ...]) -> None:
    code = f"{statement}\nimport sys\nprint(','.join(m for m in {forbidden!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    leaked = [m for m in result.stdout.strip().split(",") if m]
    assert not leaked, f"{statement!r} imported {leaked}"
