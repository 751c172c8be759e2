"""Pilot tests: the real app driving the real engine over tiny seeded models."""

from __future__ import annotations

import json
from itertools import groupby
from typing import cast

import pytest
from textual.widgets import TextArea

from specchat.engine.backend import Backend
from specchat.engine.events import SummaryEvent
from specchat.engine.metrics import RollingAlpha, StreamStats
from specchat.store.markdown import fmt
from specchat.testing.scripted_engines import PausingEngine
from specchat.ui.widgets.panels import SidePanel
from specchat.ui.widgets.prompt import PromptInput
from specchat.ui.widgets.reply_text import ReplyText
from specchat.ui.widgets.transcript import AssistantMessage, Notice

from .conftest import SIZE, controls_of, make_app, send, shown, span_style, wait_idle, wait_paused

pytestmark = pytest.mark.anyio


def merged_runs(tokens: list) -> list[tuple[str, str]]:
    """Consecutive tokens of one kind merged, as the transcript draws them."""
    runs = []
    for kind, group in groupby((t for t in tokens if t.text), key=lambda t: t.kind):
        runs.append((kind, "".join(t.text for t in group)))
    return runs


async def test_reply_shows_coloured_tokens_and_panels_match_the_events(engine: PausingEngine) -> None:
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello there")
        await wait_idle(pilot, app)

        summary = engine.events[-1]
        assert isinstance(summary, SummaryEvent)
        tokens = engine.tokens
        assert tokens, "the tiny model should say something"

        # The transcript holds every token, coloured by its kind in the theme's style.
        reply = app.transcript.replies()[-1]
        assert reply.tokens.runs == merged_runs(tokens)
        # The reply's own text (rejected drafts are hidden by default; F12 has its own tests).
        rendered = reply.tokens.render_text()
        assert rendered.plain == "".join(t.text for t in tokens)
        styles = app.token_styles
        # Each token's style is its kind's, plus the token's index as metadata (for clicks).
        kinds_on_screen = {styles[k] for k, _ in reply.tokens.runs}
        assert {span_style(span).clear_meta_and_links() for span in rendered.spans} == kinds_on_screen

        # Panel figures are the engine's figures.
        stats = StreamStats()
        stats.extend(engine.events[:-1])
        rolling = RollingAlpha(16)
        for r in engine.rounds:
            rolling.add(r)
        shown = app.query_one(SidePanel).current
        assert shown is not None
        assert shown.alpha == fmt(summary.alpha) == fmt(stats.alpha)
        assert shown.tau == fmt(summary.tau)
        assert shown.alpha_rolling == fmt(rolling.value)
        assert shown.tokens_per_s == f"{summary.tokens_per_s:.1f}"
        assert shown.drafted == str(summary.drafted)
        assert shown.accepted == str(summary.accepted)
        assert [rate for _, rate in shown.per_position] == list(summary.per_position)
        assert shown.gamma == "4" and shown.drafter == "model" and shown.schedule == "fixed"

        # The history keeps every token's kind, and the saved file too.
        turn = app.conversation.turns[-1]
        assert turn.role == "assistant" and turn.tokens == tokens and turn.summary == summary
        saved = json.loads(app.store.path_for(app.conversation.id).read_text())
        assert [t["kind"] for t in saved["messages"][1]["tokens"]] == [t.kind for t in tokens]
        assert saved["messages"][1]["stats"]["alpha"] == summary.alpha
        assert saved["messages"][1]["stats"]["tokens_per_s"] == summary.tokens_per_s


async def test_gamma_change_mid_reply_applies_to_the_next_round(engine: PausingEngine) -> None:
    engine.pause_after = 2
    app = make_app(engine, gamma=2, max_new_tokens=80)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello there")
        await wait_paused(pilot, app, engine)
        await pilot.press("f3", "f3")
        # The panel shows the change at once, before any new round.
        assert shown(app.query_one(SidePanel)).gamma == "4"
        assert len(engine.rounds) == 3
        engine.release()
        await wait_idle(pilot, app)

    gammas = [r.gamma for r in engine.rounds]
    assert gammas[:3] == [2, 2, 2]
    assert len(gammas) > 3, "the reply should run past the pause"
    assert gammas[3] == 4
    # Every later round asks for 4, clipped only by the token budget (80) near the end.
    for r in engine.rounds[3:]:
        generated = sum(1 for t in engine.tokens if t.round < r.round)
        assert r.gamma == max(0, min(4, 80 - generated - 1)), str(gammas)


async def test_escape_mid_reply_keeps_the_partial_reply(engine: PausingEngine) -> None:
    engine.pause_after = 1
    app = make_app(engine, max_new_tokens=80)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello there")
        await wait_paused(pilot, app, engine)
        await pilot.press("escape")
        engine.release()
        await wait_idle(pilot, app)

        summary = engine.events[-1]
        assert isinstance(summary, SummaryEvent) and summary.stop == "cancelled"
        assert len(engine.rounds) == 2, "the engine stops before the next round"
        partial = "".join(t.text for t in engine.tokens)
        turn = app.conversation.turns[-1]
        assert turn.role == "assistant" and turn.content == partial
        assert turn.summary is not None and turn.summary.stop == "cancelled"
        assert app.transcript.replies()[-1].text == partial
        assert "stopped" in str(app.transcript.replies()[-1].figures.content)

        # The partial reply is part of the history the next reply sees.
        engine.pause_after = None
        await send(pilot, "go on")
        await wait_idle(pilot, app)
        assert [t.role for t in app.conversation.turns] == ["user", "assistant", "user", "assistant"]
        assert app.conversation.chat_messages()[2] == {"role": "assistant", "content": partial}


async def test_resize_mid_reply_loses_nothing(engine: PausingEngine) -> None:
    engine.pause_after = 1
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello there")
        await wait_paused(pilot, app, engine)
        await pilot.resize_terminal(70, 20)
        await pilot.pause()
        assert not app.query_one(SidePanel).display, "narrow: the transcript takes the width"
        assert app.query_one("#compact-figures").display
        engine.release()
        await wait_idle(pilot, app)
        await pilot.resize_terminal(*SIZE)
        await pilot.pause()
        assert app.query_one(SidePanel).display
        full = "".join(t.text for t in engine.tokens)
        assert app.transcript.replies()[-1].text == full
        assert app.conversation.turns[-1].content == full
        summary = engine.events[-1]
        assert isinstance(summary, SummaryEvent)
        assert shown(app.query_one(SidePanel)).tokens_per_s == f"{summary.tokens_per_s:.1f}"


async def test_controls_cycle_and_show_at_once(engine: PausingEngine) -> None:
    app = make_app(engine, gamma=16, temperature=1.95)
    async with app.run_test(size=SIZE) as pilot:
        panel = app.query_one(SidePanel)
        await pilot.press("f3")
        assert shown(panel).gamma == "16", "γ stops at the engine's maximum"
        await pilot.press("f2")
        assert shown(panel).gamma == "15"
        await pilot.press("f4")
        assert shown(panel).schedule == "heuristic" and controls_of(app).schedule == "heuristic"
        await pilot.press("f5")
        assert shown(panel).drafter == "hybrid"
        await pilot.press("f5")
        assert shown(panel).drafter == "ngram"
        await pilot.press("f5")
        assert shown(panel).drafter == "none"
        await pilot.press("f5")
        assert shown(panel).drafter == "model"
        await pilot.press("f7")
        assert controls_of(app).temperature == 2.0 and shown(panel).temperature == "2.0"
        await pilot.press("f6", "f6")
        assert controls_of(app).temperature == 1.8


async def test_enter_sends_and_ctrl_j_adds_a_line(engine: PausingEngine) -> None:
    app = make_app(engine, max_new_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.click("#prompt")
        await pilot.press("h", "i", "ctrl+j", "y", "o")
        assert app.query_one(PromptInput).text == "hi\nyo"
        await pilot.press("enter")
        await wait_idle(pilot, app)
        assert app.conversation.turns[0].content == "hi\nyo"
        assert app.query_one(PromptInput).text == ""


async def test_regenerate_replaces_the_last_reply_and_clear_starts_over(engine: PausingEngine) -> None:
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello there")
        await wait_idle(pilot, app)
        first = app.conversation.turns[-1].content
        first_id = app.conversation.id
        await pilot.press("ctrl+r")
        await wait_idle(pilot, app)
        assert [t.role for t in app.conversation.turns] == ["user", "assistant"]
        assert app.conversation.turns[-1].content == first  # temperature 0
        assert len(app.transcript.replies()) == 1
        assert app.live.conversation.tokens == len(app.conversation.turns[-1].tokens)

        await pilot.press("ctrl+l")
        await pilot.pause()
        assert app.conversation.turns == [] and app.conversation.id != first_id
        assert app.transcript.replies() == []
        assert shown(app.query_one(SidePanel)).alpha == "–"
        assert app.store.path_for(first_id).exists()


async def test_markdown_view_and_copy(engine: PausingEngine) -> None:
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello there")
        await wait_idle(pilot, app)
        reply = app.transcript.replies()[-1]
        await pilot.press("f8")
        await pilot.pause()
        assert reply.has_class("-markdown") and not reply.tokens.display
        await pilot.press("f8")
        await pilot.pause()
        assert not reply.has_class("-markdown") and reply.tokens.display

        await pilot.press("ctrl+b")
        assert app.clipboard == app.conversation.turns[-1].content


async def test_reopen_a_saved_conversation_and_export_it(engine: PausingEngine) -> None:
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello there")
        await wait_idle(pilot, app)
        before = app.figures
        tokens = app.conversation.turns[-1].tokens
        saved_id = app.conversation.id

    again = make_app(engine)
    async with again.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        assert again.conversation.id == saved_id
        assert again.conversation.turns[-1].tokens == tokens
        reply = again.transcript.replies()[-1]
        assert isinstance(reply, AssistantMessage) and reply.tokens.runs == merged_runs(tokens)
        now = again.figures
        assert (now.alpha, now.tau, now.drafted, now.accepted, now.tokens_per_s) == (
            before.alpha,
            before.tau,
            before.drafted,
            before.accepted,
            before.tokens_per_s,
        )

        await pilot.press("ctrl+s")
        await pilot.pause()
        exported = again.store.exports / f"{saved_id}.md"
        text = exported.read_text()
        assert "## You" in text and "hello there" in text and f"α {before.alpha}" in text


async def test_help_lists_every_key_and_keys_remap(engine: PausingEngine) -> None:
    from specchat.ui.screens.help import HelpScreen
    from specchat.ui.settings.keys import ALL_KEYS

    app = make_app(engine, keys={"gamma_up": "ctrl+up"})
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f3")
        assert controls_of(app).gamma == 4, "F3 no longer raises γ"
        await pilot.press("ctrl+up")
        assert controls_of(app).gamma == 5
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        body = app.screen.plain_text(width=200)
        for spec in ALL_KEYS:
            assert spec.description in body and spec.id in body
        assert "Ctrl+↑" in body
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)


@pytest.mark.slow
async def test_command_palette_runs_actions(engine: PausingEngine) -> None:
    from specchat.ui.settings.keys import APP_KEYS

    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        titles = [command.title for command in app.get_system_commands(app.screen)]
        for spec in APP_KEYS:
            assert spec.description in titles
        assert "Send the message" in titles
        assert "Theme: specchat-colorblind" in titles
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"one token more")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert controls_of(app).gamma == 5


async def test_theme_switch_recolours_and_persists(engine: PausingEngine) -> None:
    from specchat.config import config_path, load_settings

    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        assert app.theme == "specchat-dark"
        dark = dict(app.token_styles)
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert app.theme == "specchat-light"
        assert app.token_styles != dark
    assert 'theme = "specchat-light"' in config_path().read_text()
    assert load_settings().theme == "specchat-light"


async def test_an_engine_error_is_one_line_and_the_message_comes_back(tiny_pair) -> None:
    from specchat.errors import ContextTooLongError

    class Failing:
        available_drafters = ("model", "ngram", "none")

        def stream_chat(self, messages, controls, cancel=None):
            raise ContextTooLongError("the conversation is too long: clear it.")

        def read_ahead(self, messages, controls, cancel):
            pass

    app = make_app(Failing())
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello there")
        await wait_for_turns(pilot, app)
        notices = [str(n.content) for n in app.transcript.query(Notice)]
        assert notices == ["error: the conversation is too long: clear it."]
        assert app.conversation.turns == []
        assert app.query_one(PromptInput).text == "hello there"


async def wait_for_turns(pilot, app) -> None:
    from .conftest import wait_for

    await wait_for(pilot, lambda: app.reply is None and bool(app.transcript.query("Notice")))


async def test_system_prompt_edited_in_the_app_reaches_the_engine(engine: PausingEngine) -> None:
    from specchat.config import config_path
    from specchat.ui.screens.system_prompt import SystemPromptScreen

    seen: list[list[dict[str, str]]] = []
    inner = engine.backend

    class Recording:
        available_drafters = inner.available_drafters

        def stream_chat(self, messages, controls, cancel=None):
            seen.append(list(messages))
            return inner.stream_chat(messages, controls, cancel)

        def read_ahead(self, messages, controls, cancel):
            inner.read_ahead(messages, controls, cancel)

    engine.backend = cast(Backend, Recording())  # the chat calls only these three
    app = make_app(engine, system_prompt="Be terse.")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f9")
        await pilot.pause()
        assert isinstance(app.screen, SystemPromptScreen)
        area = app.screen.query_one("#system-text", TextArea)
        area.text = "Answer in French."
        await pilot.click("#system-default")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert not isinstance(app.screen, SystemPromptScreen)
        await send(pilot, "hello there")
        await wait_idle(pilot, app)
    assert seen[-1][0] == {"role": "system", "content": "Answer in French."}
    assert app.conversation.system_prompt == "Answer in French."
    assert 'system_prompt = "Answer in French."' in config_path().read_text()


async def test_escape_when_idle_and_keys_before_a_reply_do_no_harm(engine: PausingEngine) -> None:
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("escape", "ctrl+r", "ctrl+b", "ctrl+s", "ctrl+l")
        await pilot.pause()
        assert app.reply is None and app.conversation.turns == []
        assert not app.store.folder.exists() or not list(app.store.folder.glob("*.json"))


@pytest.mark.slow
async def test_long_replies_stream_in_blocks_that_stop_re_rendering(engine: PausingEngine) -> None:
    from specchat.engine.events import TokenEvent, TokenKind

    lines = [f"line {i} " + "x" * 50 for i in range(30)]
    text = "\n".join(lines) + "\n\nthe end"
    kinds: tuple[TokenKind, ...] = ("accepted", "correction", "bonus", "target")
    tokens = [TokenEvent(kinds[i % 4], i, ch, i // 5, i % 5, 0.5, None) for i, ch in enumerate(text)]
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        reply = ReplyText(streaming=True)
        await app.transcript.mount(reply)
        for start in range(0, len(tokens), 37):
            reply.append(tokens[start : start + 37])
            await pilot.pause()
        blocks = reply.blocks
        assert len(blocks) > 3
        assert [b.streaming for b in blocks] == [False] * (len(blocks) - 1) + [True]
        assert all(b.chars >= ReplyText.BLOCK_CHARS for b in blocks[:-1])
        assert reply.plain == text and reply.render_text().plain.rstrip("▌") == text
        assert reply.runs == merged_runs(tokens)
        reply.set_streaming(False)
        await pilot.pause()
        assert not blocks[-1].streaming and reply.render_text().plain == text
        assert sum(b.size.height for b in blocks) == text.count("\n") + 1


async def test_a_reply_can_finish_under_an_open_screen(engine: PausingEngine) -> None:
    from specchat.ui.screens.help import HelpScreen

    engine.pause_after = 1
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello there")
        await wait_paused(pilot, app, engine)
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        engine.release()
        await wait_idle(pilot, app)
        await pilot.press("escape")
        await pilot.pause()
        assert app.transcript.replies()[-1].text == "".join(t.text for t in engine.tokens)
