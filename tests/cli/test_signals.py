"""`specchat generate` under Ctrl+C and SIGTERM: what was generated is printed, then the status."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from specchat.engine.session import ChatEngine

from .test_generate import generate

SIGNALS = {"ctrl+c": (signal.SIGINT, 130), "sigterm": (signal.SIGTERM, 143)}
LAST_LINE = {"ctrl+c": "specchat: interrupted.", "sigterm": "specchat: stopped by SIGTERM."}


def signal_after_tokens(monkeypatch: pytest.MonkeyPatch, signum: int, after: int = 3, times: int = 1) -> None:
    real = ChatEngine.stream_chat

    def stream(self: ChatEngine, *args: object, **kwargs: object) -> Iterator[object]:
        for index, event in enumerate(real(self, *args, **kwargs)):  # type: ignore[arg-type]
            if after <= index < after + times:
                os.kill(os.getpid(), signum)
            yield event

    monkeypatch.setattr(ChatEngine, "stream_chat", stream)


@pytest.mark.parametrize("how", list(SIGNALS))
def test_jsonl_ends_with_a_cancelled_summary(
    tiny_folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    signum, status = SIGNALS[how]
    signal_after_tokens(monkeypatch, signum)
    code, out, _ = generate(tiny_folders, "--format", "jsonl", "--max-new-tokens", "200", "--gamma", "1")
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == status
    assert lines[-1]["type"] == "summary" and lines[-1]["stop"] == "cancelled"
    assert 0 < lines[-1]["tokens"] < 200
    assert lines[-1]["tokens"] == sum(1 for line in lines if line["type"] == "token")


@pytest.mark.parametrize("how", list(SIGNALS))
def test_text_keeps_the_partial_reply_and_its_final_newline(
    tiny_folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    signum, status = SIGNALS[how]
    signal_after_tokens(monkeypatch, signum)
    code, out, err = generate(tiny_folders, "--format", "text", "--max-new-tokens", "200", "--gamma", "1")
    assert code == status
    assert out.endswith("\n") and len(out.strip()) > 0
    assert "Traceback" not in err


@pytest.mark.parametrize("how", list(SIGNALS))
def test_ansi_prints_its_summary(
    tiny_folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    signum, status = SIGNALS[how]
    signal_after_tokens(monkeypatch, signum)
    code, out, _ = generate(tiny_folders, "--format", "ansi", "--max-new-tokens", "200", "--gamma", "1")
    assert code == status
    assert "stop: cancelled" in out and out.endswith("\n")


@pytest.mark.parametrize("how", list(SIGNALS))
def test_a_second_signal_stops_at_once(
    tiny_folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    signum, status = SIGNALS[how]
    real = ChatEngine.stream_chat

    def stuck(self: ChatEngine, *args: object, **kwargs: object) -> Iterator[object]:
        yield from list(real(self, *args, **kwargs))[:3]
        os.kill(os.getpid(), signum)
        os.kill(os.getpid(), signum)
        time.sleep(5)  # a round that would never end: only the second signal gets out

    monkeypatch.setattr(ChatEngine, "stream_chat", stuck)
    started = time.monotonic()
    code, _, err = generate(tiny_folders, "--format", "text", "--max-new-tokens", "200")
    assert code == status and time.monotonic() - started < 4
    assert err.strip().splitlines()[-1] == LAST_LINE[how] and "Traceback" not in err


@pytest.mark.parametrize("how", list(SIGNALS))
def test_a_signal_while_loading_is_one_line(
    tiny_folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    signum, status = SIGNALS[how]
    from specchat import cli

    def slow_load(settings: object) -> None:
        os.kill(os.getpid(), signum)
        time.sleep(5)

    monkeypatch.setattr(cli, "load_engine", slow_load)
    started = time.monotonic()
    code, out, err = generate(tiny_folders)
    assert code == status and time.monotonic() - started < 4
    assert out == "" and err.strip() == LAST_LINE[how]
