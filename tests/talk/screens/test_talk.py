"""Talk mode: rejected drafts in place, the token inspector, step mode, replay, screenshots.

The real app drives the real engine over the tiny seeded pair; the trace it shows is checked
against the models' own probabilities computed here, independently of the engine.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from specchat.engine.display import REJECTED
from specchat.engine.events import RoundEvent, SummaryEvent, TokenEvent
from specchat.presenters.kind_labels import KIND_LABELS
from specchat.store.folder import ConversationStore
from specchat.testing.scripted_engines import PausingEngine
from specchat.ui.state.lease import local_backend
from specchat.ui.talk.replay import ReplayScreen
from specchat.ui.widgets.inspector import InspectorPanel, prob
from specchat.ui.widgets.steps import StepPanel
from tests.ui.conftest import SIZE, make_app, send, settings, span_style, wait_for, wait_idle

pytestmark = pytest.mark.anyio


def plain(renderable: object, width: int = 140) -> str:
    from rich.console import Console

    console = Console(width=width, record=True, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


async def test_rejected_drafts_show_struck_through_before_their_correction(engine: PausingEngine) -> None:
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello there")
        await wait_idle(pilot, app)
        rounds = engine.rounds
        rejected_rounds = [r for r in rounds if r.rejected]
        assert rejected_rounds, "the tiny pair should reject some drafts"

        # Expected drawing: per round, its accepted tokens, its rejected drafts, its closing token.
        expected: list[tuple[str, str]] = []
        by_round: dict[int, list[TokenEvent]] = {}
        for token in engine.tokens:
            by_round.setdefault(token.round, []).append(token)
        for r in rounds:
            tokens = by_round.get(r.round, [])
            accepted = [t for t in tokens if t.kind == "accepted"]
            closing = [t for t in tokens if t.kind != "accepted"]
            expected += [(t.kind, t.text) for t in accepted if t.text]
            expected += [(REJECTED, d.text.replace("\n", "↵")) for d in r.rejected if d.text]
            expected += [(t.kind, t.text) for t in closing if t.text]
        reply = app.transcript.replies()[-1]
        # Off by default for chatting: the reply reads as its own text, and the legend says so.
        assert reply.tokens.render_text().plain == "".join(t.text for t in engine.tokens)
        assert "rejected drafts hidden" in str(app.main_screen.query_one("#legend").render())
        await pilot.press("f12")  # one key shows them (everywhere)
        await pilot.pause()
        drawn = [(p.kind, p.text) for b in reply.tokens.blocks for p in b.pieces]
        assert _merge(drawn) == _merge(expected)

        # Rejected pieces are struck through and dimmed; the reply's own text is not.
        styles = app.token_styles
        rejected_style = styles[REJECTED]
        assert rejected_style.strike and rejected_style.dim
        text = reply.tokens.render_text()
        struck = "".join(text.plain[s.start : s.end] for s in text.spans if span_style(s).strike)
        assert struck == reply.tokens.rejected_text() != ""
        assert "rejected draft" in str(app.main_screen.query_one("#legend").render())

        # The same key hides them again, and the legend says so.
        await pilot.press("f12")
        await pilot.pause()
        assert reply.tokens.render_text().plain == "".join(t.text for t in engine.tokens)
        assert "rejected drafts hidden" in str(app.main_screen.query_one("#legend").render())


def _merge(pieces: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    merged: list[list[str]] = []
    for kind, text in pieces:
        if merged and merged[-1][0] == kind:
            merged[-1][1] += text
        else:
            merged.append([kind, text])
    return [(k, t) for k, t in merged]


async def test_inspector_follows_keys_and_clicks_and_shows_the_round_s_figures(engine: PausingEngine) -> None:
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello there")
        await wait_idle(pilot, app)
        tokens = [t for t in engine.tokens if t.text]
        rounds = {r.round: r for r in engine.rounds}
        inspector = app.main_screen.query_one(InspectorPanel)
        assert not inspector.display

        await pilot.press("f10")
        await pilot.pause()
        assert inspector.display and app.focused is inspector
        assert app.live.inspected is not None and app.live.inspected.token == tokens[-1]

        # Left walks back token by token; Up goes to the previous round's first token.
        await pilot.press("left")
        await pilot.pause()
        assert app.live.inspected.token == tokens[-2]
        await pilot.press("home")
        await pilot.pause()
        assert app.live.inspected.token == tokens[0]
        await pilot.press("down")
        await pilot.pause()
        here = app.live.inspected.token
        assert here.round == min(t.round for t in tokens if t.round > tokens[0].round)
        assert here == next(t for t in tokens if t.round == here.round)

        # An accepted draft: p, q, min(1, p/q) and the verdict of its own draft trace.
        accepted = next(i for i, t in enumerate(engine.tokens) if t.kind == "accepted" and t.text)
        await _inspect_index(pilot, app, accepted)
        token = engine.tokens[accepted]
        draft = rounds[token.round].drafts[token.position]
        text = plain(inspector.content)
        assert "accepted draft" in text and f"round {token.round + 1}" in text
        for figure in (draft.p_target, draft.p_draft, draft.accept_prob):
            assert prob(figure) in text
        assert "accepted" in text and "(T = 0)" in text  # greedy: the test is argmax equality
        # The cursor is drawn on the token (reversed) in the transcript.
        reply = app.transcript.replies()[-1]
        cursor_spans = [s for s in reply.tokens.block_of(accepted).render().spans if s.style.reverse]
        assert cursor_spans

        # A correction: the draft it replaced, and the top 5 it was drawn from, as bars.
        correction = next(i for i, t in enumerate(engine.tokens) if t.kind == "correction" and t.text)
        await _inspect_index(pilot, app, correction)
        token = engine.tokens[correction]
        replaced = rounds[token.round].drafts[token.position]
        text = plain(inspector.content)
        assert "correction" in text and "it replaced the draft" in text
        assert f"“{replaced.text}”" in text and "rejected" in text
        assert "top 5" in text and "█" in text and "◀ drawn" in text
        for candidate in token.top:
            assert prob(candidate.p) in text

        # A click on a token inspects it.
        block = reply.tokens.blocks[0]
        index, offset = _clickable(block)
        app.transcript.scroll_to_widget(block, animate=False)
        await pilot.pause()
        await pilot.click(block, offset=offset)
        await pilot.pause()
        assert app.live.inspected.index == index
        assert KIND_LABELS[engine.tokens[index].kind] in plain(inspector.content)

        await pilot.press("escape")
        await pilot.pause()
        assert not inspector.display and app.live.inspected is None
        assert app.focused is app.prompt


async def _inspect_index(pilot, app, index: int) -> None:
    app.main_screen.inspector.inspect_token(len(app.transcript.replies()) - 1, index)
    await pilot.pause()


def _clickable(block) -> tuple[int, tuple[int, int]]:
    """A token on the block's first line that no wrapping can move, and where it is drawn
    (a closing token if there is one: the inspector then shows a top 5)."""
    column = 0
    found: list[tuple[int, tuple[int, int], str]] = []
    shown_rejected = block.palette.show_rejected
    for piece in block.pieces:
        if piece.kind == REJECTED and not shown_rejected:
            continue  # not drawn: takes no columns
        if "\n" in piece.text:
            break
        if piece.token is not None and piece.kind != REJECTED and column + len(piece.text) < block.size.width:
            found.append((piece.token, (column, 0), piece.kind))
        column += len(piece.text)
    assert found, "no token on the first line"
    index, offset, _ = next((f for f in found if f[2] != "accepted"), found[0])
    return index, offset


async def test_trace_matches_the_models_own_probabilities(engine: PausingEngine, tiny_pair) -> None:
    """At T = 1 every figure the inspector shows is recomputed here from the two models."""
    # A seed whose reply lasts enough rounds to check (the tiny target may end one at once).
    app = make_app(engine, temperature=1.0, seed=4, max_new_tokens=40)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello there")
        await wait_idle(pilot, app)
        messages = app.conversation.chat_messages()[:-1]
    local = local_backend(engine)
    assert local is not None
    prompt = local.prompt_ids(messages)
    ids = list(prompt)
    events = engine.events
    checked_drafts = checked_top = 0
    position = 0
    while position < len(events) and not isinstance(events[position], SummaryEvent):
        round_tokens: list[TokenEvent] = []
        while isinstance(token_event := events[position], TokenEvent):
            round_tokens.append(token_event)
            position += 1
        round_event = events[position]
        assert isinstance(round_event, RoundEvent)
        position += 1
        drafted = [d.token_id for d in round_event.drafts]
        p = _probs(tiny_pair.target, ids + drafted, len(drafted) + 1)
        q = _probs(tiny_pair.draft, ids + drafted, len(drafted) + 1)
        for i, draft in enumerate(round_event.drafts):
            assert draft.p_target == pytest.approx(p[i, draft.token_id].item(), abs=1e-4)
            assert draft.p_draft == pytest.approx(q[i, draft.token_id].item(), abs=1e-4)
            assert draft.accept_prob == pytest.approx(min(1.0, draft.p_target / draft.p_draft), abs=1e-6)
            assert draft.u is not None or draft.verdict == "untested"
            if draft.verdict == "accepted":
                assert draft.u is not None and draft.u < draft.accept_prob
            elif draft.verdict == "rejected":
                assert draft.u is not None and draft.u >= draft.accept_prob
            checked_drafts += 1
        closing = [t for t in round_tokens if t.kind != "accepted"]
        if closing and closing[0].top:
            token = closing[0]
            k = round_event.accepted
            if token.drawn_from == "residual":
                residual = torch.clamp(p[k] - q[k], min=0)
                dist = residual / residual.sum()
            else:
                dist = p[k]
            top = torch.topk(dist, len(token.top))
            assert [c.token_id for c in token.top] == top.indices.tolist()
            for candidate, value in zip(token.top, top.values.tolist(), strict=True):
                assert candidate.p == pytest.approx(value, abs=1e-4)
            assert token.p_target == pytest.approx(p[k, token.token_id].item(), abs=1e-4)
            checked_top += 1
        ids += [t.token_id for t in round_tokens]
    assert checked_drafts > 10 and checked_top > 3


def _probs(model, ids: list[int], last: int) -> torch.Tensor:
    """The model's softmax at T = 1 over the last ``last`` positions' next tokens."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -last:].float()
    return torch.softmax(logits, dim=-1)


async def test_step_mode_pauses_after_every_round_and_controls_apply_from_the_next_step(
    engine: PausingEngine,
) -> None:
    # The same reply without step mode, for comparison (greedy: stepping changes nothing).
    app = make_app(engine, max_new_tokens=30)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello there")
        await wait_idle(pilot, app)
        unstepped = app.conversation.turns[-1].content

    app = make_app(engine, max_new_tokens=30)
    async with app.run_test(size=SIZE) as pilot:
        steps = app.main_screen.query_one(StepPanel)
        await pilot.press("ctrl+g")
        await send(pilot, "hello there")
        await wait_for(pilot, lambda: app.live.step.paused)
        await pilot.pause()
        assert len(engine.rounds) == 1 and app.reply is not None and len(app.reply.rounds) == 1
        assert steps.display
        first = engine.rounds[0]
        table = plain(steps.content)
        assert "round 1 · γ 4" in table and "q = p_draft" in table and "min(1, p/q)" in table
        for draft in first.drafts:
            assert f"“{draft.text}”" in table and draft.verdict in table
        # Nothing more happens while paused.
        await pilot.pause(0.3)
        assert len(engine.rounds) == 1

        # γ + 1 while paused applies to the next step.
        await pilot.press("f3")
        await pilot.press("ctrl+n")
        await wait_for(
            pilot, lambda: app.live.step.paused and app.reply is not None and len(app.reply.rounds) == 2
        )
        assert engine.rounds[1].gamma == 5
        assert "round 2 · γ 5" in plain(steps.content)

        # Ctrl+G again: streams to the end.
        await pilot.press("ctrl+g")
        await wait_idle(pilot, app)
        assert not steps.display
        assert all(r.gamma <= 5 for r in engine.rounds[1:])
        assert app.conversation.turns[-1].content == unstepped


async def test_escape_while_paused_stops_the_reply_and_keeps_it(engine: PausingEngine) -> None:
    app = make_app(engine, max_new_tokens=40)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+g")
        await send(pilot, "hello there")
        await wait_for(pilot, lambda: app.live.step.paused)
        await pilot.press("escape")
        await wait_idle(pilot, app)
        turn = app.conversation.turns[-1]
        assert turn.summary is not None and turn.summary.stop == "cancelled"
        assert len(turn.rounds) == 1


async def _saved_conversation(engine: PausingEngine, **overrides) -> Path:
    app = make_app(engine, **overrides)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello there")
        await wait_idle(pilot, app)
        return app.store.path_for(app.conversation.id)


@pytest.mark.slow
async def test_replay_shows_the_saved_rounds_at_their_pace_and_steps(engine: PausingEngine) -> None:
    path = await _saved_conversation(engine, max_new_tokens=40)
    saved = ConversationStore.load_path(path)
    reply = saved.turns[-1]
    assert reply.rounds and any(r.drafts for r in reply.rounds), "saved with the full trace"
    assert any(t.top for t in reply.tokens)

    from specchat.ui.app import SpecchatApp

    app = SpecchatApp(settings(), replay=saved, replay_speed=4.0)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ReplayScreen))
        screen = app.screen
        assert isinstance(screen, ReplayScreen)
        assert app.backend is None, "no model is loaded"
        # Pacing: the replay is not instantaneous (each round waits its recorded time / 4).
        await pilot.pause(0.05)
        assert not screen.finished
        await wait_for(pilot, lambda: screen.finished, timeout=30)
        await pilot.pause()
        shown = screen.transcript.replies()[-1]
        assert shown.tokens.tokens == reply.tokens
        assert shown.tokens.rejected_text() != ""
        assert reply.summary is not None
        assert screen.live.conversation.alpha == pytest.approx(reply.summary.alpha)
        # Restart, pause, then step one round at a time.
        await pilot.press("r")
        await pilot.press("space")
        await pilot.pause()
        assert not screen.playing
        before = sum(1 for s in screen.steps[: screen.position] if s.what == "round")
        await pilot.press("n")
        await pilot.pause()
        after = sum(1 for s in screen.steps[: screen.position] if s.what == "round")
        assert after == before + 1
        steps = screen.query_one(StepPanel)
        assert steps.display and f"round {after}" in plain(steps.content)
        await pilot.press("plus", "plus", "plus")
        assert screen.speed == 4.0
        await pilot.press("minus")
        assert screen.speed == 2.0
        # The inspector works in a replay too.
        await pilot.press("f10")
        await pilot.pause()
        assert screen.live.inspected is not None
        await pilot.press("escape", "escape")
        await pilot.pause()
    assert app.return_code == 0


@pytest.mark.slow
async def test_replay_of_an_old_file_without_trace(engine: PausingEngine, tmp_path: Path) -> None:
    path = await _saved_conversation(engine, max_new_tokens=30)
    data = json.loads(path.read_text())
    for message in data["messages"]:
        for token in message.get("tokens", []):
            token.pop("top", None)
            token.pop("drawn_from", None)
        for round_event in message.get("rounds", []):
            round_event.pop("drafts", None)
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    conversation = ConversationStore.load_path(old)
    from specchat.ui.app import SpecchatApp

    app = SpecchatApp(settings(), replay=conversation, replay_speed=4.0)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ReplayScreen) and app.screen.finished, 30)
        screen = app.screen
        assert isinstance(screen, ReplayScreen)
        shown = screen.transcript.replies()[-1]
        assert shown.tokens.plain == conversation.turns[-1].content
        assert shown.tokens.rejected_text() == ""
        correction = next(i for i, t in enumerate(shown.tokens.tokens) if t.kind == "correction" and t.text)
        screen.inspector.inspect_token(0, correction)
        await pilot.pause()
        assert "no trace recorded" in plain(screen.query_one(InspectorPanel).content)


@pytest.mark.slow
async def test_replay_from_the_conversations_screen(engine: PausingEngine) -> None:
    await _saved_conversation(engine, max_new_tokens=20)
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ReplayScreen))
        await wait_for(pilot, lambda: isinstance(app.screen, ReplayScreen) and app.screen.finished, 30)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ReplayScreen)
        assert app.conversation.turns == [], "replaying leaves the chat as it was"


async def test_screenshot_key_saves_an_svg_and_says_where(engine: PausingEngine) -> None:
    from specchat.config import data_dir

    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+f")
        await pilot.pause()
        shots = list((data_dir() / "screenshots").glob("*.svg"))
        assert len(shots) == 1 and shots[0].read_text().lstrip().startswith("<svg")
        assert any(str(shots[0]) in n.message for n in app._notifications)


async def test_a_replay_lists_its_own_keys_before_the_chats_and_steps_itself() -> None:
    """The replay's footer: its own keys first, then the chat's (which it binds, being a chat
    screen); step mode's keys pause and step the replay."""
    from specchat.store.conversation import Conversation, Turn
    from specchat.ui.app import SpecchatApp

    conversation = Conversation.new("be brief", "tiny-target", None)
    conversation.turns += [Turn("user", "hi"), Turn("assistant", "hello")]
    app = SpecchatApp(settings(), replay=conversation)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ReplayScreen))
        screen = app.screen
        assert isinstance(screen, ReplayScreen)
        shown = [key for key, active in screen.active_bindings.items() if active.binding.show]
        assert shown[:8] == ["space", "n", "plus", "equals_sign", "minus", "r", "escape", "q"]
        assert shown[8:11] == ["f1", "f2", "f3"]
        playing = screen.playing
        await pilot.press("ctrl+g")
        assert screen.playing is not playing
