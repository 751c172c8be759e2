"""Reading ahead: while nobody waits, the chat has the models read the next prompt's known part.

A recording backend stands in front of the real tiny engine: replies stream from it, and each
read-ahead is recorded with its messages and its cancel event (and, when asked, runs until it is
cancelled, as a long one does).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from specchat import logs
from specchat.engine.backend import Capabilities, Reply
from specchat.engine.events import Event
from specchat.testing.scripted_engines import PausingEngine
from specchat.ui.app import SpecchatApp
from specchat.ui.controllers.read_ahead import DELAY as READ_AHEAD_DELAY
from specchat.ui.workers.bridge import capabilities_of

from .conftest import SIZE, make_app, wait_for, wait_idle, wait_paused

pytestmark = pytest.mark.anyio

DELAY = 0.3
"""The tests' read-ahead delay (the chat's is longer; what matters is that keys come faster)."""


@dataclass
class ReadAheadCall:
    messages: list[dict[str, str]]
    cancel: threading.Event


class Recording:
    """The engine, with every read-ahead recorded (and held until cancelled if ``hold``)."""

    def __init__(self, engine: PausingEngine, hold: bool = False) -> None:
        self.backend = engine
        self.hold = hold
        self.calls: list[ReadAheadCall] = []
        self.replies: list[list[dict[str, str]]] = []
        self.cancelled_at_reply: list[list[bool]] = []
        """At each reply's start: whether each read-ahead so far had been told to stop."""

    @property
    def available_drafters(self) -> list[str]:
        return self.backend.available_drafters

    @property
    def capabilities(self) -> Capabilities:
        return capabilities_of(self.backend)

    def _reply_starts(self, messages: Sequence[dict[str, str]]) -> None:
        self.cancelled_at_reply.append([call.cancel.is_set() for call in self.calls])
        self.replies.append(list(messages))

    def stream_chat(self, messages: Any, controls: Any, cancel: Any = None) -> Iterator[Event]:
        self._reply_starts(messages)
        return self.backend.stream_chat(messages, controls, cancel)

    def start_chat(self, messages: Any, controls: Any, cancel: Any = None) -> Reply:
        self._reply_starts(messages)
        return self.backend.start_chat(messages, controls, cancel)

    def read_ahead(self, messages: Any, controls: Any, cancel: threading.Event) -> None:
        self.calls.append(ReadAheadCall(list(messages), cancel))
        if self.hold:
            cancel.wait(10)
        else:
            self.backend.read_ahead(messages, controls, cancel)

    def close(self) -> None:
        self.backend.close()


def chat(recording: Recording, delay: float = DELAY, **overrides: Any) -> SpecchatApp:
    app = make_app(recording, **overrides)
    app.reading_ahead.delay = delay
    return app


def log_text() -> str:
    path = logs.log_path()
    return path.read_text() if path.exists() else ""


async def type_text(pilot: Any, text: str) -> None:
    await pilot.press(*("space" if c == " " else c for c in text))


async def test_the_typed_message_is_read_ahead_once_the_keys_stop(engine: PausingEngine) -> None:
    recording = Recording(engine)
    app = chat(recording, delay=READ_AHEAD_DELAY, max_new_tokens=4)  # the chat's: keys come faster
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(recording.calls) == 1, timeout=10)
        assert recording.calls[0].messages == app.conversation.chat_messages(), "the models loaded"
        await type_text(pilot, "hello there")
        assert len(recording.calls) == 1, "nothing read while the keys come"
        await wait_for(pilot, lambda: len(recording.calls) == 2, timeout=10)
        await pilot.pause(READ_AHEAD_DELAY * 2)
        assert len(recording.calls) == 2, "one read-ahead for the burst of keys, not one per key"
        assert recording.calls[1].messages == [
            *app.conversation.chat_messages(),
            {"role": "user", "content": "hello there"},
        ]


async def test_sending_cancels_the_read_ahead_before_the_reply_starts(engine: PausingEngine) -> None:
    recording = Recording(engine, hold=True)
    app = chat(recording, max_new_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(recording.calls) == 1, timeout=10)
        await type_text(pilot, "hello there")
        await wait_for(pilot, lambda: len(recording.calls) == 2, timeout=10)
        reading = recording.calls[1]
        assert recording.calls[0].cancel.is_set(), "a new read-ahead cancels the one before"
        assert not reading.cancel.is_set(), "still reading when Enter comes"

        told_before: list[bool] = []
        start = app.replies.start

        def recording_start(*args: Any) -> None:
            told_before.append(reading.cancel.is_set())
            start(*args)

        app.replies.start = recording_start  # type: ignore[method-assign,assignment]
        await pilot.press("enter")
        await wait_idle(pilot, app)
        assert told_before == [True], "cancelled before the reply was started"
        assert recording.cancelled_at_reply == [[True, True]]
        assert recording.replies == [reading.messages], "the read-ahead read the reply's own prompt"


async def test_nothing_is_read_ahead_while_a_reply_streams(engine: PausingEngine) -> None:
    engine.pause_after = 0
    recording = Recording(engine)
    app = chat(recording, max_new_tokens=12)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(recording.calls) == 1, timeout=10)
        await type_text(pilot, "first")
        await pilot.press("enter")
        await wait_paused(pilot, app, engine)
        read_before = len(recording.calls)
        await type_text(pilot, "second")
        await pilot.pause(DELAY * 3)
        assert len(recording.calls) == read_before, "typed while the reply streams: nothing read"

        engine.release()
        await wait_idle(pilot, app)
        await wait_for(pilot, lambda: len(recording.calls) == read_before + 1, timeout=10)
        messages = recording.calls[-1].messages
        assert [m["role"] for m in messages[-3:]] == ["user", "assistant", "user"]
        assert messages[-1]["content"] == "second", "after the reply: the conversation and the box"


async def test_a_talk_job_stops_the_read_ahead_and_none_starts_meanwhile(engine: PausingEngine) -> None:
    recording = Recording(engine, hold=True)
    app = chat(recording)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(recording.calls) == 1, timeout=10)
        assert app.lease.claim("the race")
        assert recording.calls[0].cancel.is_set()
        await type_text(pilot, "hi")
        await pilot.pause(DELAY * 3)
        assert len(recording.calls) == 1
        app.lease.release()
        await wait_for(pilot, lambda: len(recording.calls) == 2, timeout=10)
        assert recording.calls[1].messages[-1] == {"role": "user", "content": "hi"}


async def test_quitting_cancels_the_read_ahead_before_exiting(engine: PausingEngine) -> None:
    recording = Recording(engine, hold=True)
    app = chat(recording)
    told_at_exit: list[bool] = []
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(recording.calls) == 1, timeout=10)
        exit_app = app.exit

        def recording_exit(*args: Any, **kwargs: Any) -> None:
            told_at_exit.append(recording.calls[0].cancel.is_set())
            exit_app(*args, **kwargs)

        app.exit = recording_exit  # type: ignore[method-assign]
        app.reading_ahead.delay = 1.0  # longer than the keys below take, on a busy machine too
        await type_text(pilot, "bye")  # a read-ahead waits for its delay: quitting drops it too
        await pilot.press("ctrl+q")
        await pilot.pause(DELAY * 2)
    assert told_at_exit == [True]
    assert len(recording.calls) == 1, "nothing read after quitting"


async def test_a_read_ahead_that_fails_goes_to_the_log_only(engine: PausingEngine) -> None:
    class Failing(Recording):
        def read_ahead(self, messages: Any, controls: Any, cancel: threading.Event) -> None:
            super().read_ahead(messages, controls, cancel)
            raise RuntimeError("a cache went missing")

    recording = Failing(engine)
    app = chat(recording)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(recording.calls) == 1, timeout=10)
        await wait_for(pilot, lambda: "a cache went missing" in log_text(), timeout=10)
        assert not any("cache" in n.message for n in app._notifications), "silent on screen"
    assert "reading ahead failed" in log_text() and "Traceback" in log_text()
