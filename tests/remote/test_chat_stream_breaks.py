"""The chat attached to a plain OpenAI-compatible server: Pilot tests.

Such a server reports no rounds. Its tokens must show as they arrive, and when its stream
breaks (the connection closes, a chunk is malformed) what arrived stays in the conversation and
on disk, while the user's message stays where it was, not back in the box.
"""

from __future__ import annotations

import json
import time

import pytest

from specchat.ui.widgets.prompt import PromptInput
from tests.remote.server import FakeServer, Script, openai_models, openai_stream
from tests.remote.test_ui import SIZE, attached, make_app, send, wait_for, wait_idle

pytestmark = pytest.mark.anyio
PIECES = ["one", " two", " three"]


def slow_server(stream: list[str], cut_after: int | None = None, delay_s: float = 0.3) -> Script:
    return Script(
        documents={"/v1/models": (200, "application/json", openai_models())},
        stream=stream,
        delay_s=delay_s,
        cut_after=cut_after,
    )


def shown_text(app: object) -> str:
    replies = app.transcript.replies()  # type: ignore[attr-defined]
    return replies[-1].tokens.render_text().plain if replies else ""


@pytest.mark.slow
async def test_tokens_show_as_they_arrive() -> None:
    with FakeServer(slow_server(openai_stream(PIECES), delay_s=0.6)) as server:
        app = make_app(server.url)
        async with app.run_test(size=SIZE) as pilot:
            await attached(pilot, app)
            started = time.monotonic()
            await send(pilot, "hi")
            await wait_for(pilot, lambda: "one" in shown_text(app))
            # The first token is on screen while the server still has two to send.
            assert app.reply is not None and "three" not in shown_text(app)
            assert time.monotonic() - started < 0.6 * (len(PIECES) + 2)
            await wait_idle(pilot, app)
            assert "one two three" in shown_text(app)


@pytest.mark.slow
@pytest.mark.parametrize(
    "how",
    ["connection closed", "malformed chunk"],
)
async def test_a_broken_stream_keeps_and_saves_what_arrived(how: str) -> None:
    stream = openai_stream(PIECES)[:4]  # the role chunk and three tokens, no finish
    if how == "connection closed":
        script = slow_server([*stream, "unused"], cut_after=4)
    else:
        script = slow_server([*stream, json.dumps({"choices": [{"delta": {"content": 7}}]})])
    with FakeServer(script) as server:
        app = make_app(server.url)
        async with app.run_test(size=SIZE) as pilot:
            await attached(pilot, app)
            await send(pilot, "hi")
            await wait_idle(pilot, app)
            assert "one two three" in shown_text(app)
            assert app.query_one(PromptInput).text == ""  # the message was answered, not given back
            turns = app.conversation.turns
            assert [t.role for t in turns] == ["user", "assistant"]
            assert turns[-1].content == "one two three" and turns[-1].error
        saved = app.store.load(app.conversation.id)  # read back from disk
        assert saved.turns[-1].content == "one two three"
