"""The real `specchat chat` in a pseudo-terminal, driven as a person (or tmux) drives it.

Keys are written to the terminal in single bursts, exactly as `tmux send-keys "…" Enter` or a
paste without bracketed paste delivers them, and signals go to the process itself. Tiny
models saved as Hugging Face folders load through the real loader in a few seconds.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from specchat.testing.tiny_models import TinyPair, make_model, make_tokenizer, perturbed_copy, save_tiny_pair

pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal"),
    pytest.mark.spawns,
]

ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])")


def never_ends(model: LlamaForCausalLM, eos: int) -> None:
    """Greedy decoding of ``model`` never picks ``eos``: that token's logit is 0, while one token's
    head row is another's negated, so the largest logit is |h·w| > 0 for every hidden state h."""
    with torch.no_grad():
        head: torch.Tensor = model.lm_head.weight
        head[eos] = 0
        head[-1] = -head[-2]


@pytest.fixture(scope="module")
def long_context_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Tiny models whose greedy replies run to their token limit, so that they can be interrupted
    however fast they stream (one that ended first made the quitting tests fail)."""
    tokenizer = make_tokenizer()
    target = make_model(len(tokenizer), 0, max_positions=4096, logit_scale=8.0)
    never_ends(target, tokenizer.eos_token_id)
    pair = TinyPair(target, perturbed_copy(target, 0.3, 1), tokenizer)
    return save_tiny_pair(pair, tmp_path_factory.mktemp("long-context"))


STREAMING = re.compile(r"reply\s+[1-9]\d*\s+tokens in")
"""The side panel counting a token of the reply: it reads "reply 0 tokens in 0 rounds" before any,
so "tokens in" alone does not say the reply streams."""


def streaming(terminal: Terminal) -> bool:
    return STREAMING.search(terminal.text) is not None


class Terminal:
    """A process on a pseudo-terminal of a fixed size; everything it writes is kept."""

    def __init__(self, args: list[str], env: dict[str, str], size: tuple[int, int] = (160, 45)) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
        self.process = subprocess.Popen(
            args, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
        )
        os.close(slave)
        self.output = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.output.extend(chunk)

    @property
    def text(self) -> str:
        return ANSI.sub("", self.output.decode("utf-8", "replace"))

    def write(self, data: str) -> None:
        """One write: the app reads it as one burst of keys."""
        os.write(self.master, data.encode())

    def wait_for(self, condition: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.process.poll() is not None and not condition():
                raise AssertionError(f"specchat exited ({self.process.returncode}) waiting for {what}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}:\n{self.text[-2000:]}")
            time.sleep(0.05)

    def wait_exit(self, timeout: float = 30.0) -> int:
        code = self.process.wait(timeout)
        self._reader.join(5)
        return code

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        os.close(self.master)


@pytest.fixture
def chat(long_context_pair: tuple[Path, Path], tmp_path: Path) -> Iterator[Callable[..., Terminal]]:
    started: list[Terminal] = []
    target, draft = long_context_pair

    def start(*extra: str) -> Terminal:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECCHAT_")}
        env.update(
            TERM="xterm-256color",
            SPECCHAT_DATA_DIR=str(tmp_path / "data"),
            SPECCHAT_CONFIG=str(tmp_path / "config.toml"),
            SPECCHAT_CACHE_DIR=str(tmp_path / "cache"),
            HF_HUB_OFFLINE="1",
            OMP_NUM_THREADS="1",
        )
        args = [sys.executable, "-m", "specchat", "chat", "--target", str(target), "--draft", str(draft)]
        args += ["--cpu-path", "none", "--device", "cpu", "--drafter", "model", "--gamma-schedule", "fixed"]
        terminal = Terminal([*args, *extra], env)
        started.append(terminal)
        terminal.wait_for(lambda: "draft tiny-draft" in terminal.text, what="the models to load")
        return terminal

    yield start
    for terminal in started:
        terminal.close()


def conversations(tmp_path: Path) -> list[list[dict]]:
    folder = tmp_path / "data" / "conversations"
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    return [json.loads(path.read_text())["messages"] for path in files]


def sent(tmp_path: Path) -> list[str]:
    return [m["content"] for messages in conversations(tmp_path) for m in messages if m["role"] == "user"]


def replies_done(tmp_path: Path, count: int) -> bool:
    messages = [m for c in conversations(tmp_path) for m in c]
    return sum(1 for m in messages if m["role"] == "assistant") >= count


def test_a_whole_sentence_and_enter_in_one_burst(chat: Callable[..., Terminal], tmp_path: Path) -> None:
    terminal = chat("--max-new-tokens", "8")
    sentence = "What is a hash table? Answer in two sentences."
    for count in (1, 2, 3):
        terminal.write(sentence + "\r")
        terminal.wait_for(functools.partial(replies_done, tmp_path, count), what=f"reply {count}")
    assert sent(tmp_path) == [sentence] * 3

    terminal.write("old text")
    time.sleep(0.3)
    terminal.write(" and new text.\r")
    terminal.wait_for(lambda: replies_done(tmp_path, 4), what="reply 4")
    terminal.write("pasted one\rpasted two\rpasted three")  # a paste without bracketed paste
    time.sleep(0.5)
    terminal.write("\r")
    terminal.wait_for(lambda: replies_done(tmp_path, 5), what="reply 5")
    assert sent(tmp_path)[3:] == ["old text and new text.", "pasted one\npasted two\npasted three"]


@pytest.mark.parametrize(("how", "status"), [("sigterm", 143), ("ctrl+q", 0)])
def test_quitting_mid_reply_keeps_it_and_restores_the_terminal(
    chat: Callable[..., Terminal], tmp_path: Path, how: str, status: int
) -> None:
    terminal = chat("--max-new-tokens", "3000")
    terminal.write("hello there")
    time.sleep(0.5)
    terminal.write("\r")
    terminal.wait_for(lambda: bool(sent(tmp_path)), what="the message to be saved")
    terminal.wait_for(lambda: streaming(terminal), what="the reply to stream")
    time.sleep(0.5)
    mark = len(terminal.output)
    if how == "sigterm":
        terminal.process.send_signal(signal.SIGTERM)
    else:
        terminal.write("\x11")
    assert terminal.wait_exit() == status
    messages = conversations(tmp_path)[0]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    reply = messages[1]
    assert reply["content"] and reply["stats"]["stop"] == "cancelled"
    assert reply["content"] == "".join(t["text"] for t in reply["tokens"])
    after = bytes(terminal.output[mark:])
    for restore in (b"\x1b[?1049l", b"\x1b[?25h", b"\x1b[?1000l", b"\x1b[?1003l"):
        assert restore in after, f"{restore!r} (terminal restore) was not written"
