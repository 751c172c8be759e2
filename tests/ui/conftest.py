"""Fixtures for the TUI tests: a real engine over tiny seeded models, and isolated folders."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from rich.style import Style
from rich.text import Span
from textual.pilot import Pilot

from specchat.config import Settings
from specchat.engine.backend import Controls
from specchat.engine.session import ChatEngine
from specchat.testing.scripted_engines import FixedTimings, PausingEngine
from specchat.testing.tiny_models import TinyPair, make_tiny_pair
from specchat.ui.app import SpecchatApp
from specchat.ui.widgets.panels import Figures, SidePanel
from specchat.ui.widgets.prompt import PromptInput

SIZE = (120, 36)


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> None:
    # Tiny models on 2 shared cores: more threads only contend (a reply got 50x slower).
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def isolated_folders(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Config and saved conversations go to a temporary folder, never the user's."""
    for name in list(os.environ):
        if name.startswith("SPECCHAT_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SPECCHAT_CONFIG", str(tmp_path / "config" / "config.toml"))
    yield


@pytest.fixture(scope="session")
def tiny_pair() -> TinyPair:
    return make_tiny_pair(0)


@pytest.fixture
def engine(tiny_pair: TinyPair) -> PausingEngine:
    """A fresh real engine (fresh caches), with fixed timings and an optional pause."""
    engine = ChatEngine(tiny_pair.target, tiny_pair.tokenizer, tiny_pair.draft)
    return PausingEngine(FixedTimings(whole_chains(engine)))


def whole_chains(engine: ChatEngine) -> ChatEngine:
    """The tiny draft is unsure of nearly every token, so by default it would draft one token a
    round; the screens under test are about rounds of several drafts (rejected, untested)."""
    drafter = engine.drafter("model")
    drafter.stop_below = 0.0  # type: ignore[union-attr]
    return engine


def settings(**overrides: Any) -> Settings:
    # Fixed γ and the model drafter: the figures the tests check do not depend on the defaults.
    values: dict[str, Any] = {
        "temperature": 0.0, "seed": 1, "max_new_tokens": 48, "gamma": 4,
        "schedule": "fixed", "drafter": "model",
    }  # fmt: skip
    values.update(overrides)
    return Settings(**values)


def make_app(engine: Any, **overrides: Any) -> SpecchatApp:
    return SpecchatApp(
        settings(**overrides), backend=engine, target_name="tiny-target", draft_name="tiny-draft"
    )


async def wait_for(pilot: Pilot[Any], condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the app")
        await pilot.pause(0.02)


async def wait_idle(pilot: Pilot[Any], app: SpecchatApp) -> None:
    """Until the reply has closed and the last events are on screen."""
    await wait_for(pilot, lambda: app.reply is None and bool(app.conversation.turns))
    await pilot.pause()


async def send(pilot: Pilot[Any], text: str) -> None:
    prompt = pilot.app.query_one(PromptInput)
    prompt.focus()
    prompt.text = text
    await pilot.press("enter")


async def wait_paused(pilot: Pilot[Any], app: SpecchatApp, engine: PausingEngine) -> None:
    """Until the engine pauses and the UI has drained every event up to the pause."""
    await wait_for(pilot, engine.paused.is_set)
    await wait_for(pilot, lambda: app.reply is not None and len(app.reply.rounds) == len(engine.rounds))
    await pilot.pause()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def shown(panel: SidePanel) -> Figures:
    """The figures the side panel shows (it has drawn them once the app is up)."""
    assert panel.current is not None
    return panel.current


def controls_of(app: SpecchatApp) -> Controls:
    """The controls of the loaded engine (tests read them once a model is loaded)."""
    assert app.controls is not None
    return app.controls


def span_style(span: Span) -> Style:
    """A drawn span's style: the transcript styles its text with Style objects, not names."""
    assert isinstance(span.style, Style)
    return span.style
