"""The bad-input corpus: shared fixtures.

Every case runs with its own config file, data folder and model cache under a temporary
folder, next to things a user already has: a saved conversation and a hand-written config
file. After the case, those are checked byte for byte (``already_saved.assert_untouched()``):
bad input may be refused, never allowed to damage what was there.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from textual.pilot import Pilot

from specchat.config import load_settings
from specchat.engine.session import ChatEngine
from specchat.testing.scripted_engines import FixedTimings, PausingEngine
from specchat.testing.tiny_models import TinyPair, make_tiny_pair, save_tiny_pair
from specchat.ui.app import SpecchatApp
from specchat.ui.widgets.prompt import PromptInput

HAND_WRITTEN_CONFIG = """\
# written by hand: these comments must survive
max_new_tokens = 16   # short replies
"""

SAVED_CONVERSATION: dict[str, Any] = {
    "format": "specchat-conversation",
    "version": 1,
    "id": "20260101-000000-abcdef",
    "title": "an older chat",
    "created": "2026-01-01T00:00:00+00:00",
    "updated": "2026-01-01T00:00:00+00:00",
    "models": {"target": "tiny-target", "draft": "tiny-draft"},
    "system_prompt": "Be brief.",
    "messages": [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "hello",
            "tokens": [],
            "rounds": [],
            "stats": None,
            "settings": {"gamma": 4, "schedule": "fixed", "drafter": "model", "temperature": 0.0},
        },
    ],
}


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> None:
    torch.set_num_threads(1)


@dataclass
class AlreadySaved:
    """What a user had before the case ran: a config file and a saved conversation."""

    config: Path
    conversation: Path

    def snapshot(self) -> dict[str, str]:
        files = [self.config, *sorted(self.conversation.parent.glob("*"))]
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files if p.is_file()}

    def __post_init__(self) -> None:
        self.before: dict[str, str] = {}

    def take(self) -> None:
        self.before = self.snapshot()
        self.before_config = self.config.read_text(encoding="utf-8", errors="replace")

    def assert_untouched(self) -> None:
        """Every file that was there before is still there, byte for byte (new ones may appear)."""
        after = self.snapshot()
        changed = sorted(k for k in self.before if self.before[k] != after.get(k))
        assert not changed, f"bad input changed or removed saved files: {changed}"


@pytest.fixture
def already_saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AlreadySaved]:
    for name in list(os.environ):
        if name.startswith("SPECCHAT_"):
            monkeypatch.delenv(name)
    config = tmp_path / "config" / "config.toml"
    data = tmp_path / "data"
    monkeypatch.setenv("SPECCHAT_CONFIG", str(config))
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(data))
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config.parent.mkdir(parents=True)
    config.write_text(HAND_WRITTEN_CONFIG, encoding="utf-8")
    conversation = data / "conversations" / f"{SAVED_CONVERSATION['id']}.json"
    conversation.parent.mkdir(parents=True)
    conversation.write_text(json.dumps(SAVED_CONVERSATION, indent=1), encoding="utf-8")
    saved = AlreadySaved(config, conversation)
    saved.take()
    yield saved


@pytest.fixture(scope="session")
def tiny_pair() -> TinyPair:
    return make_tiny_pair(0)


@pytest.fixture
def engine(tiny_pair: TinyPair) -> PausingEngine:
    """A real engine over the tiny pair (fresh caches), with fixed timings and an optional pause."""
    return PausingEngine(FixedTimings(ChatEngine(tiny_pair.target, tiny_pair.tokenizer, tiny_pair.draft)))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def tiny_folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Tiny models as Hugging Face folders (a 256-token context), for the real loader."""
    return save_tiny_pair(make_tiny_pair(0), tmp_path_factory.mktemp("models"))


def assert_one_clear_line(err: str, *words: str) -> str:
    """The error is the last line of stderr, starts with 'specchat:', holds ``words``; no
    traceback anywhere. Lines before it may only be loading progress."""
    assert "Traceback" not in err and 'File "' not in err, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert lines, "no message at all"
    last = lines[-1]
    assert last.startswith("specchat: "), last
    for word in words:
        assert word in last, f"{word!r} not in {last!r}"
    for line in lines[:-1]:
        assert line.startswith("specchat: ") and not any(w in line for w in ("error", "invalid")), line
    return last


TERMINAL = (120, 36)


def make_app(engine: object, **overrides: object) -> SpecchatApp:
    """The app over a ready engine, with settings from the config file and environment
    (so a case's config and variables apply) and the test's overrides on top."""
    values: dict[str, object] = {"max_new_tokens": 12, "seed": 1, "drafter": "model", "schedule": "fixed"}
    values.update(overrides)
    settings = load_settings(values)
    return SpecchatApp(settings, backend=engine, target_name="tiny-target", draft_name="tiny-draft")  # type: ignore[arg-type]


def record_notifications(app: SpecchatApp) -> list[str]:
    """Every notification the app shows, as text."""
    shown: list[str] = []
    notify = app.notify

    def recording(message: str, *args: object, **kwargs: object) -> None:
        shown.append(str(message))
        notify(message, *args, **kwargs)  # type: ignore[arg-type]

    app.notify = recording  # type: ignore[method-assign]
    return shown


async def wait_for(pilot: Pilot[Any], condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the app")
        await pilot.pause(0.02)


async def send(pilot: Pilot[Any], app: SpecchatApp, text: str) -> None:
    """Type a message and press Enter; wait until its reply is done."""
    turns = len(app.conversation.turns)
    prompt = app.query_one(PromptInput)
    prompt.focus()
    prompt.text = text
    await pilot.press("enter")
    await wait_for(pilot, lambda: app.reply is None and len(app.conversation.turns) > turns)
    await pilot.pause()
