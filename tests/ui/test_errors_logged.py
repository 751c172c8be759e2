"""In the chat, an unexpected error is one line naming the log file, which holds its traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Static

from specchat import logs
from specchat.testing.scripted_engines import PausingEngine
from specchat.ui.app import SpecchatApp
from specchat.ui.screens.loading import LoadingScreen
from specchat.ui.widgets.transcript import Notice
from specchat.ui.workers import bridge

from .conftest import SIZE, make_app, send, settings, wait_for, wait_paused

pytestmark = pytest.mark.anyio


def log_text() -> str:
    return logs.log_path().read_text()


async def test_a_reply_that_fails_unexpectedly(tiny_pair: Any) -> None:
    class Failing:
        available_drafters = ("model", "ngram", "none")

        def stream_chat(self, messages: Any, controls: Any, cancel: Any = None) -> Any:
            raise RuntimeError("a tensor went missing")

        def read_ahead(self, messages: Any, controls: Any, cancel: Any) -> None:
            pass

    app = make_app(Failing())
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello there")
        await wait_for(pilot, lambda: bool(app.transcript.query("Notice")))
        notice = str(app.transcript.query(Notice).first().content)
    assert notice == (
        f"error: the reply failed: RuntimeError: a tensor went missing (details in {logs.log_path()}; "
        "--debug prints them)."
    )
    assert "Traceback (most recent call last)" in log_text() and "a tensor went missing" in log_text()


async def test_loading_that_fails_unexpectedly(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(s: Any, progress: Any) -> bridge.LoadedBackend:
        raise KeyError("lm_head.weight")

    monkeypatch.setattr(bridge, "load_backend", broken)
    app = SpecchatApp(settings())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, LoadingScreen) and app.screen.failed is not None)
        line = str(app.screen.query_one("#loading-what", Static).content)
        await pilot.press("q")
    assert line.startswith("could not load the models: KeyError: 'lm_head.weight' (details in ")
    assert "Traceback" in log_text() and app.return_code == 1


async def test_a_crash_saves_the_conversation_and_logs_the_traceback(engine: PausingEngine) -> None:
    engine.pause_after = 1
    app = make_app(engine, max_new_tokens=60)
    with pytest.raises(ZeroDivisionError):
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, "hello there")
            await wait_paused(pilot, app, engine)
            app.call_later(lambda: 1 / 0)  # a bug in some handler
            await pilot.pause(0.5)
    assert "ZeroDivisionError" in log_text()
    saved = json.loads(Path(app.store.path_for(app.conversation.id)).read_text())["messages"]
    assert [m["role"] for m in saved] == ["user", "assistant"]
    assert saved[1]["content"] == "".join(t.text for t in engine.tokens)
    assert "unexpected error" in saved[1]["error"]
