"""Start-up: the loading screen shows progress, then the chat; a failure is one readable line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.widgets import ProgressBar, Static

from specchat.errors import ModelNotFoundError
from specchat.models import LoadProgress
from specchat.testing.tiny_models import TinyPair, save_tiny_pair
from specchat.ui.app import SpecchatApp
from specchat.ui.screens.loading import LoadingScreen
from specchat.ui.widgets.panels import SidePanel
from specchat.ui.workers import bridge

from .conftest import SIZE, send, settings, shown, wait_for, wait_idle

pytestmark = pytest.mark.anyio


async def test_models_load_behind_a_loading_screen_then_chat(
    tiny_pair: TinyPair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real loader (specchat.models.load_pair) on tiny model folders, as `specchat` does it."""
    target, draft = save_tiny_pair(tiny_pair, tmp_path)
    seen: list[LoadProgress] = []
    real = bridge.load_backend

    def recording(s: Any, progress: Any) -> bridge.LoadedBackend:
        def record(p: LoadProgress) -> None:
            seen.append(p)
            progress(p)

        return real(s, record)

    monkeypatch.setattr(bridge, "load_backend", recording)
    app = SpecchatApp(settings(target=str(target), draft=str(draft), device="cpu", dtype="float32"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.backend is not None, timeout=60)
        await pilot.pause()
        assert not isinstance(app.screen, LoadingScreen)
        assert "tiny-target" in app.sub_title and "tiny-draft" in app.sub_title
        assert shown(app.query_one(SidePanel)).drafter == "model"
        await send(pilot, "hello there")
        await wait_idle(pilot, app)
        assert app.conversation.turns[-1].role == "assistant"
    assert seen, "the loader reported progress"


async def test_progress_is_shown_while_loading(monkeypatch: pytest.MonkeyPatch, engine: Any) -> None:
    import threading

    go = threading.Event()

    def slow_load(s: Any, progress: Any) -> bridge.LoadedBackend:
        progress(LoadProgress("tiny-target", "assemble", 3, 10, "assembling tiny-target chunk 3/10"))
        go.wait(10)
        return bridge.LoadedBackend(engine, "tiny-target", "tiny-draft", "cpu")

    monkeypatch.setattr(bridge, "load_backend", slow_load)
    app = SpecchatApp(settings())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(
            pilot, lambda: "chunk 3/10" in str(app.screen.query_one("#loading-status", Static).content)
        )
        screen = app.screen
        assert isinstance(screen, LoadingScreen)
        assert screen.query_one(ProgressBar).percentage == pytest.approx(0.3)
        await pilot.press("f3")  # the UI stays responsive; keys do no harm before the engine exists
        go.set()
        await wait_for(pilot, lambda: app.backend is not None)
        await pilot.pause()
        assert not isinstance(app.screen, LoadingScreen)


async def test_a_loading_notice_stays_readable_after_the_chat_opens(
    monkeypatch: pytest.MonkeyPatch, engine: Any
) -> None:
    """A repacked cache says so while loading; the chat opening must not swallow the line."""
    line = "removed the copy of tiny-target packed by an earlier specchat (1.3 GB)"

    def load(s: Any, progress: Any) -> bridge.LoadedBackend:
        progress(LoadProgress("tiny-target", "notice", 0, None, line))
        progress(LoadProgress("tiny-target", "load", 1, 1, "loading tiny-target: done"))
        return bridge.LoadedBackend(engine, "tiny-target", "tiny-draft", "cpu")

    monkeypatch.setattr(bridge, "load_backend", load)
    app = SpecchatApp(settings())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.backend is not None)
        await pilot.pause()
        assert not isinstance(app.screen, LoadingScreen)
        assert [n.message for n in app._notifications] == [line]


async def test_a_load_failure_is_a_readable_message_and_a_clean_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(s: Any, progress: Any) -> bridge.LoadedBackend:
        raise ModelNotFoundError("unknown model 'nope': run `specchat models` to see what is installed.")

    monkeypatch.setattr(bridge, "load_backend", missing)
    app = SpecchatApp(settings(target="nope"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, LoadingScreen) and app.screen.failed is not None)
        status = str(app.screen.query_one("#loading-what", Static).content)
        assert status == "unknown model 'nope': run `specchat models` to see what is installed."
        assert "Traceback" not in status
        await pilot.press("q")
    assert app.return_code == ModelNotFoundError.exit_code


FBGEMM_PATH = "int8/dyn8+head32768"
"""Packed at every start (fbgemm), job by job: the path whose packing a quit must interrupt."""


def test_packing_cpu_kernels_stops_between_jobs_when_loading_is_abandoned(
    tiny_pair: TinyPair, tmp_path: Path
) -> None:
    """Quitting while the CPU kernels are packed must not wait for every remaining job."""
    from specchat.models import load_for_decoding
    from specchat.ui.workers.model_loading import LoadCancelled

    target, draft = save_tiny_pair(tiny_pair, tmp_path)
    seen: list[str] = []

    def progress(event: LoadProgress) -> None:
        seen.append(event.message)
        if event.message == "packing CPU kernels":
            raise LoadCancelled

    with pytest.raises(LoadCancelled):
        load_for_decoding(str(target), str(draft), device="cpu", cpu_path=FBGEMM_PATH, progress=progress)
    assert seen.count("packing CPU kernels") >= 1


async def test_quitting_while_loading_is_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import time

    jobs_done: list[int] = []
    stop = threading.Event()

    def slow_packing(s: Any, progress: Any) -> bridge.LoadedBackend:
        for job in range(200):  # 20 s of packing unless the progress callback gives up
            progress(LoadProgress("CPU kernels", "kernels", job, 200, "packing CPU kernels"))
            time.sleep(0.1)
            jobs_done.append(job)
        stop.set()
        raise AssertionError("loading should have been abandoned")

    monkeypatch.setattr(bridge, "load_backend", slow_packing)
    app = SpecchatApp(settings())
    started = time.monotonic()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(jobs_done) >= 2)
        await pilot.press("ctrl+q")
    await wait_until_thread_ends(jobs_done)
    assert time.monotonic() - started < 5 and not stop.is_set()


async def wait_until_thread_ends(jobs_done: list[int]) -> None:
    import asyncio

    count = -1
    while count != len(jobs_done):
        count = len(jobs_done)
        await asyncio.sleep(0.25)


async def test_a_message_typed_while_loading_waits_in_the_box(
    monkeypatch: pytest.MonkeyPatch, engine: Any
) -> None:
    """Typing and Enter on the loading screen used to be dropped."""
    import threading

    go = threading.Event()

    def slow_load(s: Any, progress: Any) -> bridge.LoadedBackend:
        go.wait(10)
        return bridge.LoadedBackend(engine, "tiny-target", "tiny-draft", "cpu")

    monkeypatch.setattr(bridge, "load_backend", slow_load)
    app = SpecchatApp(settings())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, LoadingScreen))
        await pilot.press(*"quick question", "enter")
        await pilot.pause()
        assert "waits in the box" in str(app.screen.query_one("#loading-note", Static).content)
        go.set()
        await wait_for(pilot, lambda: app.backend is not None)
        await pilot.pause()
        assert app.prompt.text == "quick question"  # waiting, not sent and not lost
        assert app.conversation.turns == [] and app.reply is None
