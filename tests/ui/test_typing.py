"""Typed text is never lost: keys arriving in one burst are taken in order.

A terminal delivers a paste (without bracketed paste), a `tmux send-keys` line or a fast
typist over ssh as one read: Textual turns it into many Key events at once. These tests post
them to the app all at once, as the driver does, so the app sees keys faster than it
processes them.
"""

from __future__ import annotations

from typing import Any

import pytest
from textual import events

from specchat.testing.scripted_engines import PausingEngine
from specchat.ui.widgets.prompt import PromptInput

from .conftest import SIZE, make_app, wait_for, wait_idle

pytestmark = pytest.mark.anyio


def key_events(keys: list[str]) -> list[events.Key]:
    """Key events as the terminal driver makes them (a character key carries its character)."""
    made = []
    for key in keys:
        if len(key) == 1:
            made.append(events.Key(_key_name(key), key))
        else:
            made.append(events.Key(key, "\r" if key == "enter" else None))
    return made


def _key_name(character: str) -> str:
    from textual.keys import _character_to_key

    return _character_to_key(character)


def burst(app: Any, keys: list[str]) -> None:
    """Post every key at once, before the app has handled any of them."""
    for event in key_events(keys):
        event.set_sender(app)
        app._driver.send_message(event)


def typed(text: str) -> list[str]:
    return list(text)


async def test_a_sentence_and_enter_in_one_burst_sends_the_whole_sentence(engine: PausingEngine) -> None:
    sentence = "What is a hash table? Answer in two sentences."
    app = make_app(engine, max_new_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        for round_no in range(3):
            burst(app, [*typed(sentence), "enter"])

            def answered(n: int = round_no) -> bool:
                return len(app.conversation.turns) >= 2 * (n + 1)

            await wait_for(pilot, answered, timeout=10)
            await wait_idle(pilot, app)
            assert app.conversation.turns[2 * round_no].content == sentence
            assert app.query_one(PromptInput).text == ""


async def test_a_burst_after_text_already_in_the_box_sends_both_in_order(engine: PausingEngine) -> None:
    app = make_app(engine, max_new_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.query_one(PromptInput)
        await pilot.press(*"old text")
        assert prompt.text == "old text"
        burst(app, [*typed(" and the new text."), "enter"])
        await wait_for(pilot, lambda: bool(app.conversation.turns), timeout=10)
        await wait_idle(pilot, app)
        assert app.conversation.turns[0].content == "old text and the new text."
        assert prompt.text == ""


async def test_keys_after_enter_in_a_later_burst_go_to_the_next_message(engine: PausingEngine) -> None:
    app = make_app(engine, max_new_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        burst(app, [*typed("first question"), "enter"])
        await wait_for(pilot, lambda: bool(app.conversation.turns), timeout=10)
        burst(app, typed("draft of the next"))
        await wait_idle(pilot, app)
        await pilot.pause()
        assert app.conversation.turns[0].content == "first question"
        assert app.query_one(PromptInput).text == "draft of the next"


async def test_a_paste_without_bracketed_paste_keeps_every_line(engine: PausingEngine) -> None:
    """Lines of a paste arrive as text, Enter, text, …: they stay lines of one message."""
    app = make_app(engine, max_new_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.query_one(PromptInput)
        burst(app, [*typed("line one"), "enter", *typed("line two"), "enter", *typed("line three")])
        await wait_for(pilot, lambda: prompt.text == "line one\nline two\nline three", timeout=10)
        await pilot.pause(0.2)
        assert app.conversation.turns == [], "a paste is not sent line by line"
        assert prompt.text == "line one\nline two\nline three"
        await pilot.press("enter")
        await wait_for(pilot, lambda: bool(app.conversation.turns), timeout=10)
        await wait_idle(pilot, app)
        assert app.conversation.turns[0].content == "line one\nline two\nline three"


async def test_a_pasted_block_ending_in_enter_is_sent_as_one_message(engine: PausingEngine) -> None:
    app = make_app(engine, max_new_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        burst(app, [*typed("alpha"), "enter", *typed("beta"), "enter", *typed("gamma"), "enter"])
        await wait_for(pilot, lambda: bool(app.conversation.turns), timeout=10)
        await wait_idle(pilot, app)
        assert app.conversation.turns[0].content == "alpha\nbeta\ngamma"
        assert [t.role for t in app.conversation.turns] == ["user", "assistant"]


async def test_ctrl_j_in_a_burst_lands_where_it_was_typed(engine: PausingEngine) -> None:
    app = make_app(engine, max_new_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.query_one(PromptInput)
        burst(app, [*typed("hi"), "ctrl+j", *typed("yo")])
        await wait_for(pilot, lambda: len(prompt.text) >= 5, timeout=10)
        assert prompt.text == "hi\nyo"


async def test_enter_while_a_reply_streams_keeps_the_text(engine: PausingEngine) -> None:
    engine.pause_after = 0
    app = make_app(engine, max_new_tokens=40)
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.query_one(PromptInput)
        burst(app, [*typed("first"), "enter"])
        await wait_for(pilot, engine.paused.is_set, timeout=10)
        burst(app, [*typed("second"), "enter"])
        await pilot.pause(0.3)
        assert prompt.text == "second", "refused while streaming, and nothing lost"
        engine.release()
        await wait_idle(pilot, app)
        engine.pause_after = None
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.conversation.turns) == 4, timeout=10)
        await wait_idle(pilot, app)
        assert [t.content for t in app.conversation.turns if t.role == "user"] == ["first", "second"]


async def test_enter_then_escape_in_one_burst_still_sends(engine: PausingEngine) -> None:
    """Only text continues a paste: a key like Esc right after Enter leaves the Enter a send."""
    app = make_app(engine, max_new_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        burst(app, [*typed("quick one"), "enter", "escape"])
        await wait_for(pilot, lambda: bool(app.conversation.turns), timeout=10)
        await wait_idle(pilot, app)
        assert app.conversation.turns[0].content == "quick one"
        assert app.query_one(PromptInput).text == ""
