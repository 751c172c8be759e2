"""Start-up: the loading screen shows progress, then the chat; a failure is one readable line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specchat.errors import ModelNotFoundError
from specchat.models import LoadProgress
from specchat.testing import TinyPair, save_tiny_pair
from specchat.ui import bridge
from specchat.ui.app import SpecchatApp
from specchat.ui.screens.loading import LoadingScreen
from specchat.ui.widgets.panels import SidePanel

from .conftest import SIZE, send, settings, wait_for, wait_idle

pytestmark = pytest.mark.anyio


async def test_models_load_behind_a_loading_screen_then_chat(
    tiny_pair: TinyPair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real loader (specchat.models.load_pair) on tiny model folders, as `specchat` does it."""
    target, draft = save_tiny_pair(tiny_pair, tmp_path)
    seen: list[LoadProgress] = []
    real = bridge.load_engine

    def recording(s: Any, progress: Any) -> bridge.LoadedEngine:
        return real(s, lambda p: (seen.append(p), progress(p)))

    monkeypatch.setattr(bridge, "load_engine", recording)
    app = SpecchatApp(settings(target=str(target), draft=str(draft), device="cpu", dtype="float32"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.engine is not None, timeout=60)
        await pilot.pause()
        assert not isinstance(app.screen, LoadingScreen)
        assert "tiny-target" in app.sub_title and "tiny-draft" in app.sub_title
        assert app.query_one(SidePanel).current.drafter == "model"
        await send(pilot, "hello there")
        await wait_idle(pilot, app)
        assert app.conversation.turns[-1].role == "assistant"
    assert seen, "the loader reported progress"


async def test_progress_is_shown_while_loading(monkeypatch: pytest.MonkeyPatch, engine: Any) -> None:
    import threading

    go = threading.Event()

    def slow_load(s: Any, progress: Any) -> bridge.LoadedEngine:
        progress(LoadProgress("tiny-target", "assemble", 3, 10, "assembling tiny-target chunk 3/10"))
        go.wait(10)
        return bridge.LoadedEngine(engine, "tiny-target", "tiny-draft", "cpu")

    monkeypatch.setattr(bridge, "load_engine", slow_load)
    app = SpecchatApp(settings())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "chunk 3/10" in str(app.screen.query_one("#loading-status").content))
        screen = app.screen
        assert isinstance(screen, LoadingScreen)
        assert screen.query_one("ProgressBar").percentage == pytest.approx(0.3)
        await pilot.press("f3")  # the UI stays responsive; keys do no harm before the engine exists
        go.set()
        await wait_for(pilot, lambda: app.engine is not None)
        await pilot.pause()
        assert not isinstance(app.screen, LoadingScreen)


async def test_a_load_failure_is_a_readable_message_and_a_clean_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(s: Any, progress: Any) -> bridge.LoadedEngine:
        raise ModelNotFoundError("unknown model 'nope': run `specchat models` to see what is installed.")

    monkeypatch.setattr(bridge, "load_engine", missing)
    app = SpecchatApp(settings(target="nope"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, LoadingScreen) and app.screen.failed is not None)
        status = str(app.screen.query_one("#loading-what").content)
        assert status == "unknown model 'nope': run `specchat models` to see what is installed."
        assert "Traceback" not in status
        await pilot.press("q")
    assert app.return_code == ModelNotFoundError.exit_code
