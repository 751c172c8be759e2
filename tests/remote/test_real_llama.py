"""Against a real llama-server with the packaged GGUF pair (skipped without a build).

Build: see docs/servers.md, "llama.cpp's llama-server" (scripts/build_llamacpp.sh). The server loads both
models (GBs of memory, both cores): run this under the shared lock, like the other slow tests.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from specchat.engine.backend import Controls
from specchat.engine.events import RoundEvent, SummaryEvent, TokenEvent
from specchat.remote import connect

# SPECCHAT_LLAMA_CPP names the build's bin folder for every peer test (SPECCHAT_LLAMA_BIN: this
# file's older name for it, still read).
BIN = Path(
    os.environ.get("SPECCHAT_LLAMA_CPP")
    or os.environ.get("SPECCHAT_LLAMA_BIN")
    or Path.home() / ".cache/specchat-peers/llamacpp/bin"
)
GGUF = Path(os.environ.get("SPECCHAT_GGUF_DIR", Path.home() / ".cache/specchat/gguf"))
SERVER = BIN / "llama-server"
TARGET, DRAFT = GGUF / "qwen.gguf", GGUF / "qwen05.gguf"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (SERVER.exists() and TARGET.exists() and DRAFT.exists()),
        reason="no llama-server build or packaged GGUF pair (docs/servers.md: llama.cpp's llama-server)",
    ),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    port = free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    env = {**os.environ, "LD_LIBRARY_PATH": str(BIN)}
    command = [
        str(SERVER), "-m", str(TARGET), "--model-draft", str(DRAFT), "--spec-type", "draft-simple",
        "-t", "2", "-td", "2", "-c", "2048", "-np", "1", "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"llama-server exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("llama-server did not start within 180 s")
        yield url, log
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def test_a_real_reply_rebuilds_the_rounds_the_server_logs(llama_server: tuple[str, Path]) -> None:
    url, log = llama_server
    backend = connect(url)
    assert backend.info.kind == "llama-server" and backend.info.speculative is True
    prompt = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]
    events = list(backend.stream_chat(prompt, Controls(gamma=3, temperature=0.0, max_new_tokens=24)))
    summary = events[-1]
    assert isinstance(summary, SummaryEvent) and summary.tokens > 0
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert "def" in "".join(t.text for t in tokens)
    assert {t.kind for t in tokens} & {"accepted", "bonus", "correction"}
    # The server logs its own count when the reply ends: ours must be the same.
    time.sleep(0.5)
    logged = re.findall(
        r"draft acceptance = [0-9.]+ \(\s*(\d+) accepted /\s*(\d+) generated\)", log.read_text()
    )
    assert logged, "the server logged no draft acceptance"
    accepted, drafted = map(int, logged[-1])
    assert (sum(r.accepted for r in rounds), sum(r.drafted for r in rounds)) == (accepted, drafted)
    backend.close()


def test_the_server_keeps_serving_after_a_cancelled_reply(llama_server: tuple[str, Path]) -> None:
    url, _ = llama_server
    backend = connect(url)
    cancel = threading.Event()
    prompt = [{"role": "user", "content": "Count from one to fifty in words."}]
    seen = 0
    events = []
    for event in backend.stream_chat(prompt, Controls(max_new_tokens=64), cancel):
        events.append(event)
        seen += isinstance(event, TokenEvent)
        if seen == 3:
            cancel.set()
    assert isinstance(events[-1], SummaryEvent) and events[-1].stop == "cancelled"
    again = list(backend.stream_chat([{"role": "user", "content": "Say yes."}], Controls(max_new_tokens=4)))
    assert isinstance(again[-1], SummaryEvent) and again[-1].tokens > 0
    backend.close()
