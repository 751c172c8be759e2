"""Quitting mid-reply keeps the reply: Ctrl+Q, the palette's Quit and SIGTERM save what was generated."""

from __future__ import annotations

import json

import pytest

from specchat.testing.scripted_engines import PausingEngine

from .conftest import SIZE, make_app, send, wait_paused

pytestmark = pytest.mark.anyio


def saved_messages(app) -> list[dict]:
    return json.loads(app.store.path_for(app.conversation.id).read_text())["messages"]


async def test_ctrl_q_mid_reply_saves_the_partial_reply(engine: PausingEngine) -> None:
    engine.pause_after = 1
    app = make_app(engine, max_new_tokens=80)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello there")
        await wait_paused(pilot, app, engine)
        await pilot.press("ctrl+q")
        await pilot.pause()
    assert app.return_code == 0
    partial = "".join(t.text for t in engine.tokens)
    assert partial, "the reply had started"
    messages = saved_messages(app)
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[1]["content"] == partial
    assert messages[1]["stats"]["stop"] == "cancelled"
    assert len(messages[1]["tokens"]) == len(engine.tokens)


async def test_a_terminate_signal_mid_reply_saves_and_exits_143(engine: PausingEngine) -> None:
    engine.pause_after = 0
    app = make_app(engine, max_new_tokens=80)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello there")
        await wait_paused(pilot, app, engine)
        app.request_quit(143)  # what the SIGTERM handler does
        await pilot.pause(0.5)
    assert app.return_code == 143
    messages = saved_messages(app)
    assert messages[-1]["role"] == "assistant"
    assert messages[-1]["content"] == "".join(t.text for t in engine.tokens)
    assert messages[-1]["stats"]["stop"] == "cancelled"


async def test_quitting_while_idle_changes_nothing_saved(engine: PausingEngine) -> None:
    app = make_app(engine, max_new_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello there")
        from .conftest import wait_idle

        await wait_idle(pilot, app)
        before = app.store.path_for(app.conversation.id).read_text()
        await pilot.press("ctrl+q")
    assert app.store.path_for(app.conversation.id).read_text() == before
