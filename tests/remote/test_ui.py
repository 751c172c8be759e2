"""Pilot tests: the chat attached to a loopback server (no models, no torch)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from itertools import groupby
from typing import Any

import pytest
from textual.pilot import Pilot

from specchat.config import Settings
from specchat.engine.events import TokenEvent
from specchat.store.markdown import fmt
from specchat.ui.app import SpecchatApp
from specchat.ui.screens.loading import LoadingScreen
from specchat.ui.widgets.panels import Legend, SidePanel, StatsBody
from specchat.ui.widgets.prompt import PromptInput
from specchat.ui.widgets.transcript import Notice
from tests.remote.server import FakeServer, Script, llama_script, openai_models, openai_stream

pytestmark = pytest.mark.anyio
SIZE = (130, 40)


def make_app(url: str, **overrides: Any) -> SpecchatApp:
    values: dict[str, Any] = {"server": url, "gamma": 2, "max_new_tokens": 40, "temperature": 0.0}
    values.update(overrides)
    return SpecchatApp(Settings(**values))


async def wait_for(pilot: Pilot[Any], condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the app")
        await pilot.pause(0.02)


async def attached(pilot: Pilot[Any], app: SpecchatApp) -> None:
    await wait_for(pilot, lambda: app.backend is not None)
    await pilot.pause()


async def send(pilot: Pilot[Any], text: str) -> None:
    prompt = pilot.app.query_one(PromptInput)
    prompt.focus()
    prompt.text = text
    await pilot.press("enter")


async def wait_idle(pilot: Pilot[Any], app: SpecchatApp, turns: int = 2) -> None:
    await wait_for(pilot, lambda: app.reply is None and len(app.conversation.turns) >= turns)
    await pilot.pause()


def runs(tokens: list[TokenEvent]) -> list[tuple[str, str]]:
    return [
        (k, "".join(t.text for t in g))
        for k, g in groupby((t for t in tokens if t.text), key=lambda t: t.kind)
    ]


def panel_text(app: SpecchatApp) -> str:
    return app.query_one(StatsBody).render().plain  # type: ignore[union-attr]


async def test_chat_with_llama_server_colours_tokens_and_labels_every_figure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPECCHAT_API_KEY", "sk-secret-key")
    with FakeServer(llama_script()) as server:
        app = make_app(server.url)
        async with app.run_test(size=SIZE) as pilot:
            await attached(pilot, app)
            assert app.sub_title.startswith("server llama-server at http://127.0.0.1")
            assert "inferred" in app.query_one(Legend).note
            await send(pilot, "Tell a very short story about a cat who learns to fly.")
            await wait_idle(pilot, app)

            turn = app.conversation.turns[-1]
            assert turn.role == "assistant" and not turn.error
            kinds = {t.kind for t in turn.tokens}
            assert {"accepted", "bonus", "correction", "target"} <= kinds
            reply = app.transcript.replies()[-1]
            assert reply.tokens.runs == runs(turn.tokens)

            shown = app.query_one(SidePanel).current
            assert shown is not None and turn.summary is not None
            assert shown.alpha == fmt(22 / 50) == fmt(turn.summary.alpha)
            assert shown.tau == fmt(turn.summary.tau)
            assert shown.sources["alpha"] == "measured" and shown.sources["tau"] == "inferred"
            assert shown.sources["trace"] == "unavailable"
            text = panel_text(app)
            assert "figures from the server" in text
            assert "measured     α, tok/s" in text and "inferred     τ, per-position acceptance" in text
            assert "not reported round timings, token probabilities" in text
            # We asked for γ = 2; the server drafted 3 a round: the panel says γ is the server's.
            assert "controls · γ fixed by the server" in text and "ignores the per-request" in text
            assert shown.gamma == "3" and shown.schedule == shown.drafter == "server's"
            assert turn.settings["drafter"] == "llama-server's" and turn.settings["gamma"] == 3

            await pilot.press("f3")  # γ + 1: refused with a line, the γ shown does not move
            await pilot.pause()
            assert app.controls is not None and app.controls.gamma == 2

            saved = app.store.path_for(app.conversation.id).read_text()
            assert "sk-secret-key" not in saved
        assert all(h.get("Authorization") == "Bearer sk-secret-key" for h in server.script.headers)


async def test_a_server_killed_mid_reply_keeps_the_partial_reply_and_the_chat_goes_on() -> None:
    script = llama_script()
    script.cut_after = 12
    with FakeServer(script) as server:
        app = make_app(server.url)
        async with app.run_test(size=SIZE) as pilot:
            await attached(pilot, app)
            await send(pilot, "Tell a very short story about a cat who learns to fly.")
            await wait_idle(pilot, app)
            turn = app.conversation.turns[-1]
            assert turn.role == "assistant" and turn.content.startswith("Once upon a time")
            assert turn.error and "closed the connection mid-reply" in turn.error
            assert "\n" not in turn.error

            script.cut_after = None  # the server is back
            await send(pilot, "Again, please.")
            await wait_idle(pilot, app, turns=4)
            assert not app.conversation.turns[-1].error
            assert len(app.conversation.turns[-1].tokens) == 40


async def test_an_error_before_any_token_puts_the_message_back() -> None:
    script = llama_script()
    script.status = 503
    script.error_body = '{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'
    with FakeServer(script) as server:
        app = make_app(server.url)
        async with app.run_test(size=SIZE) as pilot:
            await attached(pilot, app)
            await send(pilot, "hello")
            await wait_for(pilot, lambda: app.reply is None and bool(list(app.query(Notice))))
            await pilot.pause()
            notice = list(app.query(Notice))[-1]
            assert "failed (503: Loading model)" in str(notice.render())
            assert app.prompt.text == "hello" and not app.conversation.turns


async def test_escape_mid_reply_keeps_the_partial_reply() -> None:
    script = llama_script()
    script.delay_s = 0.1
    with FakeServer(script) as server:
        app = make_app(server.url)
        async with app.run_test(size=SIZE) as pilot:
            await attached(pilot, app)
            await send(pilot, "Tell a very short story about a cat who learns to fly.")
            await wait_for(pilot, lambda: app.reply is not None and len(app.reply.tokens) >= 4)
            await pilot.press("escape")
            await wait_idle(pilot, app)
            turn = app.conversation.turns[-1]
            assert turn.summary is not None and turn.summary.stop == "cancelled"
            assert 4 <= len(turn.tokens) < 40 and not turn.error


async def test_connecting_to_nothing_shows_one_line_on_the_connecting_screen() -> None:
    with FakeServer(Script()) as server:
        url = server.url
    app = make_app(url)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, LoadingScreen) and app.screen.failed is not None)
        screen = app.screen
        assert isinstance(screen, LoadingScreen) and screen.failed is not None
        assert "connection refused. Is the server running?" in screen.failed[0]
        assert app.sub_title == "could not attach to the server"


async def test_a_plain_openai_server_streams_uncoloured_and_says_what_it_cannot_report() -> None:
    script = Script(
        documents={"/v1/models": (200, "application/json", openai_models())},
        stream=openai_stream(["Hel", "lo", " there", "!"]),
        delay_s=0.02,
    )
    with FakeServer(script) as server:
        app = make_app(server.url)
        async with app.run_test(size=SIZE) as pilot:
            await attached(pilot, app)
            await send(pilot, "hi")
            await wait_idle(pilot, app)
            turn = app.conversation.turns[-1]
            assert turn.content == "Hello there!" and {t.kind for t in turn.tokens} == {"target"}
            shown = app.query_one(SidePanel).current
            assert shown is not None and shown.alpha == "–" and shown.tau == "–"
            assert shown.tokens_per_s not in ("–", "0.0")
            text = panel_text(app)
            assert "not reported by this server" in text and "controls · γ does not apply" in text
            assert (
                "not reported by this server" in app.query_one(Legend).note
                or "no provenance" in app.query_one(Legend).note
            )
            saved = json.loads(app.store.path_for(app.conversation.id).read_text())
            assert saved["messages"][1]["tokens"][0]["id"] is None
