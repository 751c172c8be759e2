"""Attaching to a server needs neither torch nor transformers (a thin client on any machine).

The import checks run the real paths against a loopback server in a fresh interpreter: the
``generate --server`` command end to end, and what the chat runs when it attaches (opening the
backend in its load worker, then streaming a reply through the worker bridge).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.remote.server import FakeServer, llama_script

HEAVY = ("torch", "transformers")
ROOT = Path(__file__).resolve().parents[2]
REPORT = "print('HEAVY', sorted(m for m in {heavy!r} if m in sys.modules))"


def heavy_modules_after(code: str) -> str:
    script = code + "\n" + REPORT.format(heavy=HEAVY)
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stdout.splitlines() if line.startswith("HEAVY ")]
    assert lines, run.stdout
    return lines[-1].removeprefix("HEAVY ")


def test_remote_backend_imports_neither_torch_nor_textual() -> None:
    code = (
        "import sys, specchat.remote, specchat.bench.server, specchat.engine.backend\n"
        "print(sorted(m for m in ('torch', 'textual', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_generate_with_a_server_loads_no_torch() -> None:
    with FakeServer(llama_script()) as server:
        code = (
            "import sys\n"
            "from specchat.cli import main\n"
            f"main(['generate', 'hi', '--server', {server.url!r}, '--max-new-tokens', '8'])"
        )
        assert heavy_modules_after(code) == "[]"


def test_the_chat_attached_to_a_server_loads_no_torch() -> None:
    """The real app: attach, send a line, wait for the reply (conversations kept in a temp dir)."""
    with FakeServer(llama_script()) as server:
        code = (
            "import asyncio, sys\n"
            "from tests.remote.test_ui import attached, make_app, send, wait_idle\n"
            "async def chat() -> None:\n"
            f"    app = make_app({server.url!r})\n"
            "    async with app.run_test(size=(130, 40)) as pilot:\n"
            "        await attached(pilot, app)\n"
            "        await send(pilot, 'hi')\n"
            "        await wait_idle(pilot, app)\n"
            "asyncio.run(chat())\n"
        )
        assert heavy_modules_after(code) == "[]"
