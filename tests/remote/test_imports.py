"""Attaching to a server needs neither torch nor textual (a thin client on any machine)."""

from __future__ import annotations

import subprocess
import sys


def test_remote_backend_imports_neither_torch_nor_textual() -> None:
    code = (
        "import sys, specchat.remote, specchat.bench.server, specchat.engine.backend\n"
        "print(sorted(m for m in ('torch', 'textual', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
