"""The chat and the replay with hostile text: Pilot tests.

A server's reply, error and model id, and a shared conversation file, are shown with their
control characters visible (``^[``), the API key masked and long strings clipped; what the
conversation saves is still exactly what arrived.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from specchat.config import Settings
from specchat.engine.events import TokenEvent
from specchat.store.folder import ConversationStore
from specchat.ui.app import SpecchatApp
from specchat.ui.talk.replay import ReplayScreen
from specchat.ui.widgets.inspector import InspectorPanel
from specchat.ui.widgets.transcript import AssistantMessage, Notice, UserMessage
from tests.remote.server import FakeServer, Script, openai_stream
from tests.remote.test_hostile_server import HOSTILE_PIECES, KEY, RAW_KEY, HostileServer
from tests.remote.test_ui import SIZE, attached, make_app, send, wait_for, wait_idle

pytestmark = pytest.mark.anyio
RAW = ("\x1b", "\x07", "\x9b")
"""What must never reach a widget's rendered text from outside."""


def server_with(pieces: list[str], model: str = "gpt-test") -> Script:
    models = json.dumps({"object": "list", "data": [{"id": model, "object": "model", "owned_by": "x"}]})
    return Script(documents={"/v1/models": (200, "application/json", models)}, stream=openai_stream(pieces))


def assert_neutral(text: str) -> None:
    for char in RAW:
        assert char not in text, repr(text)


def notifications(app: SpecchatApp) -> list[str]:
    return [n.message for n in app._notifications]


async def test_a_reply_with_escape_sequences_is_shown_visibly_in_both_views() -> None:
    with FakeServer(server_with(HOSTILE_PIECES, model="m\x1b]0;title\x07")) as server:
        app = make_app(server.url)
        async with app.run_test(size=SIZE) as pilot:
            await attached(pilot, app)
            assert_neutral(app.sub_title)
            assert "m^[]0;title^G" in app.sub_title
            await send(pilot, "hi")
            await wait_idle(pilot, app)
            reply = app.transcript.replies()[-1]
            shown = reply.tokens.render_text().plain
            assert_neutral(shown)
            assert "^[]52;c;cHduZWQ=^G" in shown and "^[[2J" in shown and "\\x9b31m" in shown
            app.chat.toggle_view()  # the Markdown view of the finished reply
            await pilot.pause()
            markdown = reply._markdown
            assert markdown is not None and markdown.display
            assert_neutral(markdown.source)
            assert "^[]0;pwned^G" in markdown.source
            # The inspector quotes the token it is on: visibly too.
            app.main_screen.inspector.inspect_token(0, 1)
            await pilot.pause()
            inspector = app.query_one(InspectorPanel)
            assert inspector.inspected is not None
            assert_neutral(inspector.inspected.token.text)
            assert inspector.inspected.token.text == "^[]52;c;cHduZWQ=^G"
        # Nothing lost: the conversation keeps the text exactly as it arrived.
        saved = app.conversation.turns[-1]
        assert saved.content == "".join(HOSTILE_PIECES)


async def test_a_server_error_mid_reply_is_masked_and_visible_in_the_notices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPECCHAT_API_KEY", KEY)
    script = server_with(["one", " two"])
    script.stream.insert(3, json.dumps({"error": {"message": f"bad key {RAW_KEY}\x1b]52;c;eA==\x07"}}))
    with HostileServer(script) as server:
        app = make_app(server.url)
        async with app.run_test(size=SIZE) as pilot:
            await attached(pilot, app)
            await send(pilot, "hi")
            # Kept or taken back (another fix decides), the error is shown once the reply closes.
            await wait_for(
                pilot, lambda: app.reply is None and any("bad key" in n for n in notifications(app))
            )
            await pilot.pause()
            lines = notifications(app)
            lines += [str(n.render()) for n in app.query(Notice)]
            lines += [str(r.figures.render()) for r in app.query(AssistantMessage)]
            errors = [line for line in lines if "bad key" in line]
            assert errors, lines
            for line in errors:
                assert KEY not in line
                assert_neutral(line)
                assert "bad key ***" in line


async def test_a_server_error_with_markup_is_shown_as_text() -> None:
    """Textual reads a notice as markup by default: '[/]' from a server raises MarkupError when the
    toast draws, and '[@click=app.quit]' would make the server's words a button."""
    script = server_with(["one", " two"])
    message = "closing [/] and [@click=app.quit]loud[/]"
    script.stream.insert(3, json.dumps({"error": {"message": message}}))
    with HostileServer(script) as server:
        app = make_app(server.url)
        async with app.run_test(size=SIZE) as pilot:
            await attached(pilot, app)
            await send(pilot, "hi")
            await wait_for(
                pilot, lambda: app.reply is None and any("closing" in n for n in notifications(app))
            )
            await pilot.pause()
            shown = [n for n in app._notifications if "closing" in n.message]
            assert shown and all(message in n.message and not n.markup for n in shown)
            assert app.is_running


async def test_the_replay_of_a_shared_file_shows_its_escapes_visibly(tmp_path: Any) -> None:
    path = tmp_path / "shared.json"
    tokens = [
        TokenEvent("target", -1, piece, i, 0, float("nan"), None).to_json()
        for i, piece in enumerate(HOSTILE_PIECES)
    ]
    path.write_text(
        json.dumps(
            {
                "format": "specchat-conversation",
                "version": 1,
                "id": "x",
                "title": "look \x1b]0;pwned\x07",
                "models": {"target": "t", "draft": None},
                "system_prompt": "be \x1b[2J nice",
                "messages": [
                    {"role": "user", "content": "hi \x1b]52;c;eA==\x07"},
                    {"role": "assistant", "content": "".join(HOSTILE_PIECES), "tokens": tokens},
                ],
            }
        )
    )
    conversation = ConversationStore.load_path(path)
    app = SpecchatApp(Settings(), replay=conversation, replay_speed=4.0)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ReplayScreen))
        screen = app.screen
        assert isinstance(screen, ReplayScreen)
        await wait_for(pilot, lambda: screen.finished, timeout=30)
        await pilot.pause()
        assert screen.sub_title is not None
        assert_neutral(screen.sub_title)
        assert "^[]" in screen.sub_title  # the title, taken from the file or its first message
        user = str(screen.query_one(UserMessage).render())
        assert_neutral(user)
        assert "^[]52;c;eA==^G" in user
        shown = screen.transcript.replies()[-1].tokens.render_text().plain
        assert_neutral(shown)
        assert "^[]0;pwned^G" in shown
        system = str(screen.query_one("SystemNote").render())
        assert_neutral(system)
        assert "^[[2J" in system


# ------------------------------------------------------------------ a stalling or overrunning server


async def test_a_stall_in_the_chat_is_a_notice_and_esc_stops_the_reply_keeping_it() -> None:
    from tests.corpus.hostile_server import HostileServer, keepalive, models

    with HostileServer() as server:
        server.routes["case"] = {
            "GET /v1/models": models(),
            "POST /v1/chat/completions": keepalive(["Hi", " there"], b": ping\n\n", 0.1),
        }
        app = make_app(server.url("case"), server_timeout=1.0)
        async with app.run_test(size=SIZE) as pilot:
            await attached(pilot, app)
            await send(pilot, "hello")
            await wait_for(pilot, lambda: any("no new token" in n for n in notifications(app)), timeout=15)
            stall = next(n for n in notifications(app) if "no new token" in n)
            assert (
                "has sent no new token for 1 s (server_timeout). Still waiting: Esc stops the reply." in stall
            )
            assert app.reply is not None, "a stall alone does not end the reply: the user decides"
            await pilot.press("escape")
            await wait_idle(pilot, app)
        turn = app.conversation.turns[-1]
        assert turn.content == "Hi there" and turn.summary is not None and turn.summary.stop == "cancelled"
        assert turn.summary.notes == (stall.split(" Still waiting")[0],)


async def test_bidi_and_zero_width_characters_are_shown_in_the_chat_and_kept_exactly() -> None:
    pieces = ["safe ", "\u202eevil", "\u200bx"]
    with FakeServer(server_with(pieces, model="m\u2066id")) as server:
        app = make_app(server.url)
        async with app.run_test(size=SIZE) as pilot:
            await attached(pilot, app)
            assert "m⟨U+2066⟩id" in app.sub_title
            await send(pilot, "hi")
            await wait_idle(pilot, app)
            shown = app.transcript.replies()[-1].tokens.render_text().plain
            assert "safe ⟨U+202E⟩evil⟨U+200B⟩x" in shown
            assert "\u202e" not in shown and "\u200b" not in shown
            path = app.store.export_markdown(app.conversation)
        exported = path.read_text(encoding="utf-8")
        assert "⟨U+202E⟩evil" in exported and "\u202e" not in exported
        saved = app.store.path_for(app.conversation.id).read_text(encoding="utf-8")
        assert "\u202e" not in saved and "\\u202e" in saved  # escaped in the file, exact when read
        assert app.conversation.turns[-1].content == "".join(pieces)
