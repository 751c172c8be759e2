"""Signals and resizes: Ctrl+C and SIGTERM while loading and mid-reply, in `generate` and the chat.

`generate`: the first Ctrl+C or SIGTERM stops the engine at the next round boundary; what was
generated is printed with its summary (where the format has one) and a final newline; exit
130 (Ctrl+C) or 143 (SIGTERM). A second signal, or one while loading, stops at once with one
line. The chat: SIGTERM, SIGINT and SIGHUP quit as Ctrl+Q does, keeping the reply (exit
128 + the signal); Ctrl+C is a key there (copy), and a resize loses nothing.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from specchat import opening
from specchat.cli import main
from specchat.engine.session import ChatEngine
from specchat.models import LoadProgress
from specchat.testing.scripted_engines import PausingEngine
from specchat.ui.app import SpecchatApp
from specchat.ui.widgets.prompt import PromptInput
from specchat.ui.workers import bridge

from .conftest import TERMINAL, AlreadySaved, make_app, wait_for

SIGNALS = {"ctrl+c": (signal.SIGINT, 130), "sigterm": (signal.SIGTERM, 143)}
LAST_LINE = {"ctrl+c": "specchat: interrupted.", "sigterm": "specchat: stopped by SIGTERM."}


def generate(folders: tuple[Path, Path], *extra: str) -> tuple[int, str, str]:
    target, draft = folders
    args = ["generate", "hello there", "--target", str(target), "--draft", str(draft), "--cpu-path", "none"]
    result = CliRunner().invoke(main, [*args, "--max-new-tokens", "200", "--gamma", "1", *extra])
    return result.exit_code, result.stdout, result.stderr


def signal_after_events(monkeypatch: pytest.MonkeyPatch, signum: int, after: int = 3) -> None:
    real = ChatEngine.stream_chat

    def stream(self: ChatEngine, *args: Any, **kwargs: Any) -> Iterator[object]:
        for index, event in enumerate(real(self, *args, **kwargs)):
            if index == after:
                os.kill(os.getpid(), signum)
            yield event

    monkeypatch.setattr(ChatEngine, "stream_chat", stream)


@pytest.mark.parametrize("how", list(SIGNALS))
def test_generate_jsonl_mid_reply_ends_with_a_cancelled_summary(
    how: str, tiny_folders: tuple[Path, Path], already_saved: AlreadySaved, monkeypatch: pytest.MonkeyPatch
) -> None:
    signum, status = SIGNALS[how]
    signal_after_events(monkeypatch, signum)
    code, out, err = generate(tiny_folders, "--format", "jsonl")
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == status and "Traceback" not in err
    assert lines[-1]["type"] == "summary" and lines[-1]["stop"] == "cancelled"
    assert 0 < lines[-1]["tokens"] == sum(1 for line in lines if line["type"] == "token") < 200
    already_saved.assert_untouched()


@pytest.mark.parametrize("how", list(SIGNALS))
def test_generate_text_mid_reply_keeps_the_text_and_its_final_newline(
    how: str, tiny_folders: tuple[Path, Path], already_saved: AlreadySaved, monkeypatch: pytest.MonkeyPatch
) -> None:
    signum, status = SIGNALS[how]
    signal_after_events(monkeypatch, signum)
    code, out, err = generate(tiny_folders, "--format", "text")
    assert code == status and "Traceback" not in err
    assert out.endswith("\n") and out.strip()
    already_saved.assert_untouched()


@pytest.mark.parametrize("how", list(SIGNALS))
def test_generate_ansi_mid_reply_prints_its_summary(
    how: str, tiny_folders: tuple[Path, Path], already_saved: AlreadySaved, monkeypatch: pytest.MonkeyPatch
) -> None:
    signum, status = SIGNALS[how]
    signal_after_events(monkeypatch, signum)
    code, out, _ = generate(tiny_folders, "--format", "ansi")
    assert code == status
    assert "stop: cancelled" in out and out.endswith("\n")
    already_saved.assert_untouched()


@pytest.mark.parametrize("how", list(SIGNALS))
def test_generate_second_signal_stops_at_once(
    how: str, tiny_folders: tuple[Path, Path], already_saved: AlreadySaved, monkeypatch: pytest.MonkeyPatch
) -> None:
    signum, status = SIGNALS[how]
    real = ChatEngine.stream_chat

    def stuck(self: ChatEngine, *args: Any, **kwargs: Any) -> Iterator[object]:
        yield from list(real(self, *args, **kwargs))[:3]
        os.kill(os.getpid(), signum)
        os.kill(os.getpid(), signum)
        time.sleep(5)  # a round that never ends: only the second signal gets out of it

    monkeypatch.setattr(ChatEngine, "stream_chat", stuck)
    started = time.monotonic()
    code, _, err = generate(tiny_folders)
    assert code == status and time.monotonic() - started < 4
    assert err.strip().splitlines()[-1] == LAST_LINE[how] and "Traceback" not in err
    already_saved.assert_untouched()


@pytest.mark.parametrize("how", list(SIGNALS))
def test_generate_signal_while_loading_is_one_line(
    how: str, tiny_folders: tuple[Path, Path], already_saved: AlreadySaved, monkeypatch: pytest.MonkeyPatch
) -> None:
    signum, status = SIGNALS[how]

    def slow_load(*args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), signum)
        time.sleep(5)

    monkeypatch.setattr(opening, "open_backend", slow_load)
    started = time.monotonic()
    code, out, err = generate(tiny_folders)
    assert code == status and time.monotonic() - started < 4
    assert out == "" and err.strip() == LAST_LINE[how]
    already_saved.assert_untouched()


TUI_SIGNALS = {"sigterm": 143, "sigint": 130, "sighup": 129}


@pytest.mark.anyio
@pytest.mark.parametrize("name", list(TUI_SIGNALS))
async def test_chat_signal_while_loading_quits_at_once(
    name: str, already_saved: AlreadySaved, monkeypatch: pytest.MonkeyPatch
) -> None:
    status = TUI_SIGNALS[name]
    steps: list[int] = []

    def slow_load(settings: Any, progress: Any) -> bridge.LoadedBackend:
        for step in range(100):
            progress(LoadProgress("tiny-target", "load", step, 100, "loading"))
            time.sleep(0.1)
            steps.append(step)
        raise AssertionError("loading should have been abandoned")

    monkeypatch.setattr(bridge, "load_backend", slow_load)
    app = SpecchatApp(make_app(None).settings)
    started = time.monotonic()
    async with app.run_test(size=TERMINAL) as pilot:
        await wait_for(pilot, lambda: len(steps) >= 2)
        app.request_quit(status)  # what the signal handler does
        await pilot.pause(0.3)
    assert app.return_code == status and time.monotonic() - started < 5
    already_saved.assert_untouched()


@pytest.mark.anyio
@pytest.mark.parametrize("name", list(TUI_SIGNALS))
async def test_chat_signal_mid_reply_keeps_the_reply(
    name: str, engine: PausingEngine, already_saved: AlreadySaved
) -> None:
    status = TUI_SIGNALS[name]
    engine.pause_after = 1
    app = make_app(engine, max_new_tokens=80)
    async with app.run_test(size=TERMINAL) as pilot:
        app.query_one("#prompt", PromptInput).text = "hello there"
        await pilot.press("enter")
        await wait_for(pilot, engine.paused.is_set)
        app.request_quit(status)
        await pilot.pause(0.5)
    assert app.return_code == status
    saved = json.loads(app.store.path_for(app.conversation.id).read_text())["messages"]
    assert [m["role"] for m in saved] == ["user", "assistant"]
    assert (
        saved[1]["content"] == "".join(t.text for t in engine.tokens)
        and saved[1]["stats"]["stop"] == "cancelled"
    )
    already_saved.assert_untouched()


@pytest.mark.anyio
async def test_chat_ctrl_c_mid_reply_is_a_key_and_loses_nothing(
    engine: PausingEngine, already_saved: AlreadySaved
) -> None:
    engine.pause_after = 1
    app = make_app(engine, max_new_tokens=40)
    async with app.run_test(size=TERMINAL) as pilot:
        app.query_one("#prompt", PromptInput).text = "hello there"
        await pilot.press("enter")
        await wait_for(pilot, engine.paused.is_set)
        await pilot.press("ctrl+c")
        engine.release()
        await wait_for(pilot, lambda: app.reply is None and len(app.conversation.turns) == 2)
        assert app.conversation.turns[-1].content == "".join(t.text for t in engine.tokens)
        summary = app.conversation.turns[-1].summary
        assert summary is not None and summary.stop != "cancelled"
    already_saved.assert_untouched()


@pytest.mark.anyio
@pytest.mark.parametrize("size", [(70, 20), (40, 10), (200, 60)])
async def test_chat_resize_mid_reply_loses_nothing(
    size: tuple[int, int], engine: PausingEngine, already_saved: AlreadySaved
) -> None:
    engine.pause_after = 1
    app = make_app(engine, max_new_tokens=40)
    async with app.run_test(size=TERMINAL) as pilot:
        app.query_one("#prompt", PromptInput).text = "hello there"
        await pilot.press("enter")
        await wait_for(pilot, engine.paused.is_set)
        await pilot.resize_terminal(*size)
        engine.release()
        await wait_for(pilot, lambda: app.reply is None and len(app.conversation.turns) == 2)
        await pilot.resize_terminal(*TERMINAL)
        await pilot.pause()
        full = "".join(t.text for t in engine.tokens)
        assert app.transcript.replies()[-1].text == full == app.conversation.turns[-1].content
    already_saved.assert_untouched()


SIZE = 2 * 5 + 2 * len(TUI_SIGNALS) + 1 + 3
"""Cases this file adds to the corpus."""
