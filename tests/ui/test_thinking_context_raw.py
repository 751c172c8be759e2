"""Pilot tests: a thinking model's reasoning folded to one line, unfolded by its key, inspected
and stepped through; saved and exported as reasoning. A chat that outgrows
the context (item 3), and how the chat says the prompt is rendered: raw, or without a template
(item 5)."""

from __future__ import annotations

import json
import threading

import pytest

from specchat.engine.backend import Controls
from specchat.engine.events import SummaryEvent, TokenEvent
from specchat.engine.session import ChatEngine, LocalReply
from specchat.store.folder import ConversationStore
from specchat.store.markdown import to_markdown
from specchat.testing.scripted_engines import FixedTimings, PausingEngine
from specchat.testing.tiny_models import ANSWER_SCRIPT, REASONING_SCRIPT, TinyPair, make_thinking_pair
from specchat.ui.widgets.inspector import InspectorPanel
from specchat.ui.widgets.reply_text import ReasoningFold
from specchat.ui.widgets.steps import StepPanel
from specchat.ui.widgets.transcript import Notice, SystemNote

from .conftest import SIZE, make_app, send, span_style, wait_for, wait_idle, wait_paused
from .test_inspector_greedy import plain

pytestmark = pytest.mark.anyio
ANSWER = "".join(ANSWER_SCRIPT)
REASONING = "<think>" + "".join(REASONING_SCRIPT) + "</think>\n\n"


@pytest.fixture
def thinking() -> PausingEngine:
    pair = make_thinking_pair()
    return PausingEngine(FixedTimings(ChatEngine(pair.target, pair.tokenizer, pair.draft)))


def summary_of(engine: PausingEngine) -> SummaryEvent:
    summary = engine.events[-1]
    assert isinstance(summary, SummaryEvent)
    return summary


async def test_reasoning_is_folded_to_one_line_and_the_key_unfolds_it(thinking: PausingEngine) -> None:
    app = make_app(thinking, gamma=3)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, " hi")
        await wait_idle(pilot, app)
        reply = app.transcript.replies()[-1]
        fold = reply.query_one(ReasoningFold)
        summary = summary_of(thinking)
        line = str(fold.line.render())
        assert line.startswith("▸ reasoning · ")
        assert f"{summary.reasoning_tokens} tokens · α {summary.reasoning_alpha:.2f}" in line
        assert "Ctrl+D shows it" in line
        assert summary.reasoning_alpha is not None and summary.answer_alpha is not None
        assert summary.reasoning_alpha < summary.answer_alpha == 1.0
        # Folded: the reasoning's blocks take no room; the answer shows as usual.
        assert fold.body is not None, "composed"
        assert not fold.body.display or fold.body.region.height == 0
        assert reply.text == ANSWER
        assert [b for b in reply.tokens.blocks if b.region.height > 0] == [reply.tokens.blocks[-1]]

        await pilot.press("ctrl+d")
        await pilot.pause()
        assert fold.is_open and str(fold.line.render()).startswith("▾ reasoning")
        shown = [b for b in reply.tokens.blocks if b.region.height > 0]
        assert len(shown) == 2
        rendered = shown[0].render()
        assert rendered.plain == REASONING.rstrip("\n"), "the blank line before the answer is not drawn"
        # Provenance colours inside the reasoning: each token in its kind's style.
        styles = app.token_styles
        kinds = {t.kind for t in thinking.tokens if t.reasoning and t.text}
        drawn = {span_style(span).clear_meta_and_links() for span in rendered.spans}
        assert drawn == {styles[k] for k in kinds}
        assert {"accepted", "correction"} <= kinds

        await pilot.press("ctrl+d")
        await pilot.pause()
        assert not fold.is_open and fold.body.region.height == 0


async def test_the_conversation_keeps_reasoning_apart_and_exports_it_as_such(thinking: PausingEngine) -> None:
    app = make_app(thinking, gamma=3)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, " hi")
        await wait_idle(pilot, app)
        turn = app.conversation.turns[-1]
        path = app.store.path_for(app.conversation.id)
    assert (turn.content, turn.reasoning) == (ANSWER, REASONING)
    saved = json.loads(path.read_text(encoding="utf-8"))["messages"][-1]
    assert saved["content"] == ANSWER and saved["reasoning"] == REASONING
    marked = [t["text"] for t in saved["tokens"] if t.get("reasoning")]
    assert "".join(marked) == REASONING
    reopened = ConversationStore.load_path(path)
    assert reopened.turns[-1].tokens == thinking.tokens
    markdown = to_markdown(reopened)
    summary = summary_of(thinking)
    assert (
        f"<summary>Reasoning · {summary.reasoning_tokens} tokens · α {summary.reasoning_alpha:.2f}"
        in markdown
    )
    assert "Let me think about it" in markdown and ANSWER in markdown
    assert markdown.index("Let me think") < markdown.index("</details>") < markdown.index(ANSWER)
    # The next prompt carries the answer alone (the template drops past reasoning anyway).
    assert reopened.chat_messages()[-1]["content"] == ANSWER


async def test_a_replay_folds_the_reasoning_as_the_chat_did(thinking: PausingEngine) -> None:
    from specchat.ui.app import SpecchatApp
    from specchat.ui.talk.replay import ReplayScreen

    from .conftest import settings

    app = make_app(thinking, gamma=3)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, " hi")
        await wait_idle(pilot, app)
        saved = ConversationStore.load_path(app.store.path_for(app.conversation.id))
        live_line = str(app.transcript.replies()[-1].query_one(ReasoningFold).line.render())
    replaying = SpecchatApp(settings(), replay=saved, replay_speed=4.0)
    async with replaying.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(replaying.screen, ReplayScreen))
        screen = replaying.screen
        assert isinstance(screen, ReplayScreen)
        await wait_for(pilot, lambda: screen.finished, timeout=30)
        await pilot.pause()
        shown = screen.transcript.replies()[-1]
        assert str(shown.query_one(ReasoningFold).line.render()) == live_line
        assert shown.tokens.tokens == saved.turns[-1].tokens and shown.text == ANSWER


async def test_reopened_reasoning_folds_the_same(thinking: PausingEngine) -> None:
    app = make_app(thinking, gamma=3)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, " hi")
        await wait_idle(pilot, app)
        live_line = str(app.transcript.replies()[-1].query_one(ReasoningFold).line.render())
        await app.main_screen.show_conversation(app.conversation, markdown=False)
        await pilot.pause()
        reopened = app.transcript.replies()[-1].query_one(ReasoningFold)
        assert str(reopened.line.render()) == live_line


async def test_the_inspector_skips_folded_reasoning_and_walks_into_unfolded(thinking: PausingEngine) -> None:
    app = make_app(thinking, gamma=3)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, " hi")
        await wait_idle(pilot, app)
        tokens = app.transcript.replies()[-1].tokens.tokens
        first_answer = next(i for i, t in enumerate(tokens) if not t.reasoning)
        await pilot.press("f10")
        await pilot.press("home")
        await pilot.pause()
        assert app.main_screen.inspector.cursor == (0, first_answer)
        await pilot.press("left")  # nowhere to go: the reasoning is folded
        await pilot.pause()
        assert app.main_screen.inspector.cursor == (0, first_answer)

        await pilot.press("ctrl+d")
        await pilot.press("left")
        await pilot.pause()
        cursor = app.main_screen.inspector.cursor
        assert cursor is not None and tokens[cursor[1]].reasoning
        inspected = app.live.inspected
        assert inspected is not None and inspected.token.reasoning
        panel = app.query_one(InspectorPanel)
        assert "· reasoning" in plain(panel.describe(inspected)).splitlines()[0]

        await pilot.press("ctrl+d")  # folding it away moves the cursor back to the answer
        await pilot.pause()
        assert app.main_screen.inspector.cursor == (0, first_answer)


async def test_step_mode_pauses_inside_the_reasoning(thinking: PausingEngine) -> None:
    thinking.pause_after = 1
    app = make_app(thinking, gamma=3)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, " hi")
        await wait_paused(pilot, app, thinking)
        reply = app.transcript.replies()[-1]
        fold = reply.query_one(ReasoningFold)
        assert str(fold.line.render()).startswith("▸ thinking… ")
        await pilot.press("ctrl+g")  # step mode: the table of the round it stopped after
        thinking.release()
        await wait_for_step(pilot, app)
        panel = app.query_one(StepPanel)
        title = plain(panel.describe(app.live.step, app.live)).splitlines()[0]
        assert title.startswith("round 3 ·") and title.rstrip().endswith("· reasoning")
        await pilot.press("ctrl+g")
        await wait_idle(pilot, app)
        assert str(fold.line.render()).startswith("▸ reasoning · ")


async def wait_for_step(pilot, app) -> None:
    await wait_for(pilot, lambda: app.live.step.paused)
    await pilot.pause()


def test_reasoning_tokens_are_what_the_engine_marked(thinking: PausingEngine) -> None:
    """The fixture itself: the target writes its script, reasoning first (a check on the test)."""
    events = list(thinking.stream_chat([{"role": "user", "content": " hi"}], _controls()))
    text = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert text == REASONING + ANSWER


def _controls():
    from specchat.engine.backend import Controls

    return Controls(drafter="model", gamma=3)


@pytest.mark.slow
async def test_a_chat_past_the_context_keeps_answering_and_saves_every_turn(engine: PausingEngine) -> None:
    """The tiny model's context holds 256 tokens (one a character); four long
    messages outgrow it, and every reply still comes, after a notice of what was left out."""
    app = make_app(engine, max_new_tokens=24)
    long = "the quick brown fox jumps over the lazy dog. " * 2
    async with app.run_test(size=SIZE) as pilot:
        for turn in range(4):
            await send(pilot, f"{turn} {long}")

            def answered(turn: int = turn) -> bool:
                return app.reply is None and len(app.conversation.turns) == 2 * turn + 2

            await wait_for(pilot, answered)
        notices = [str(n.render()) for n in app.transcript.query(Notice)]
        assert notices and all("left out of the prompt" in n for n in notices)
        assert "The saved conversation keeps every message" in notices[-1]
        replies = [t for t in app.conversation.turns if t.role == "assistant"]
        assert len(replies) == 4 and all(t.tokens for t in replies)
        assert replies[-1].settings["left_out"] >= 2 and "left_out" not in replies[0].settings
        figures = str(app.transcript.replies()[-1].figures.render())
        assert "oldest messages left out of the prompt" in figures
        path = app.store.path_for(app.conversation.id)
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert [m["role"] for m in saved["messages"]] == ["user", "assistant"] * 4
    assert saved["messages"][0]["content"].startswith("0 the quick brown fox")


async def test_a_model_without_a_template_says_how_turns_are_joined(tiny_pair: TinyPair) -> None:
    """The chat says which rendering it uses, under the system prompt."""
    bare = tiny_pair.tokenizer.__class__(tokenizer_object=tiny_pair.tokenizer.backend_tokenizer)
    app = make_app(ChatEngine(tiny_pair.target, bare, tiny_pair.draft))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.backend is not None)
        await pilot.pause()
        note = str(app.transcript.query_one(SystemNote).render())
        assert "prompt  no chat template in this model: the turns are joined by blank lines" in note
        await pilot.press("ctrl+l")  # a new conversation keeps saying so
        await pilot.pause()
        assert "no chat template" in str(app.transcript.query_one(SystemNote).render())


async def test_raw_mode_sends_the_text_exactly_and_says_so(tiny_pair: TinyPair) -> None:
    seen: list[list[int]] = []
    engine = ChatEngine(tiny_pair.target, tiny_pair.tokenizer, tiny_pair.draft)
    start_ids = engine.start_ids

    def record(ids: list[int], controls: Controls, cancel: threading.Event | None = None) -> LocalReply:
        seen.append(ids)
        return start_ids(ids, controls, cancel)

    engine.start_ids = record  # type: ignore[method-assign,assignment]
    app = make_app(engine, raw=True, max_new_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.backend is not None)
        assert "prompt  raw: your text exactly" in str(app.transcript.query_one(SystemNote).render())
        await send(pilot, "abc abc")
        await wait_idle(pilot, app)
    assert seen == [tiny_pair.tokenizer("abc abc")["input_ids"]], "no template, no system prompt"
