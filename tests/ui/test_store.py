"""Saved conversations: JSON round trip, atomic writes, listing and Markdown export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specchat.engine.events import RoundEvent, SummaryEvent, TokenEvent
from specchat.store.conversation import Conversation, ConversationError, Turn
from specchat.store.folder import ConversationStore
from specchat.store.markdown import to_markdown
from specchat.ui.state.live import LiveStats


def reply() -> Turn:
    tokens = [
        TokenEvent("accepted", 10, "He", 0, 0, 0.9, 0.8),
        TokenEvent("correction", 11, "llo", 0, 1, 0.5, None),
        TokenEvent("bonus", 12, "!", 1, 0, 0.7, None),
    ]
    rounds = [RoundEvent(0, 2, 2, 1, 1.0, 10.0, "model"), RoundEvent(1, 2, 0, 0, 0.0, 8.0, "none")]
    summary = SummaryEvent(3, 2, 2, 1, 0.5, 1.5, 120.0, (1.0, 0.0), "eos", 5.0, 0.025, 12)
    settings = {"gamma": 2, "schedule": "fixed", "drafter": "model", "temperature": 0.0}
    return Turn("assistant", "Hello!", tokens, rounds, summary, settings)


def conversation() -> Conversation:
    conv = Conversation.new("Be brief.", "tiny-target", "tiny-draft")
    conv.turns = [Turn("user", "hi"), reply()]
    return conv


def test_round_trip_keeps_every_token_kind_and_the_figures(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    conv = conversation()
    path = store.save(conv)
    data = json.loads(path.read_text())
    assert data["format"] == "specchat-conversation" and data["version"] == 1
    assert [t["kind"] for t in data["messages"][1]["tokens"]] == ["accepted", "correction", "bonus"]
    assert data["messages"][1]["stats"]["alpha"] == 0.5
    assert data["messages"][1]["stats"]["tau"] == 1.5
    assert data["messages"][1]["stats"]["tokens_per_s"] == 120.0
    again = store.load(conv.id)
    assert again.turns == conv.turns and again.system_prompt == "Be brief."
    assert again.chat_messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello!"},
    ]


def test_saving_is_atomic_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    conv = conversation()
    store.save(conv)
    conv.turns.append(Turn("user", "more"))
    store.save(conv)
    assert [p.name for p in store.folder.iterdir()] == [f"{conv.id}.json"]


def test_listing_shows_unreadable_files_last_and_reports_alpha(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    conv = conversation()
    store.save(conv)
    (store.folder / "junk.json").write_text("{not json")
    rows = store.saved()
    assert [r.id for r in rows] == [conv.id, "junk"]
    assert rows[0].alpha == 0.5 and rows[0].turns == 2 and rows[0].title == "hi"
    assert rows[0].problem is None and "not complete JSON" in str(rows[1].problem)
    with pytest.raises(ConversationError, match="cannot read"):
        store.load("junk")


def test_markdown_export(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    conv = conversation()
    text = to_markdown(conv)
    assert "**System:** Be brief." in text
    assert "## You\n\nhi" in text and "## Assistant\n\nHello!" in text
    assert "α 0.50 · τ 1.50 · 120.0 tok/s · 3 tokens · 2 rounds · drafter model · γ 2 fixed · done" in text
    assert store.export_markdown(conv).read_text() == text


def test_live_stats_rebuilt_from_saved_turns_match_the_stream() -> None:
    turn = reply()
    assert turn.summary is not None
    streamed = LiveStats()
    streamed.extend(
        [turn.tokens[0], turn.tokens[1], turn.rounds[0], turn.tokens[2], turn.rounds[1], turn.summary]
    )
    rebuilt = LiveStats()
    rebuilt.load([Turn("user", "hi"), turn])
    assert rebuilt.conversation == streamed.conversation
    assert list(rebuilt.rates) == list(streamed.rates)
    assert rebuilt.tokens_per_s == streamed.tokens_per_s == 120.0
    assert rebuilt.rolling.value == streamed.rolling.value == 0.5


def test_markdown_export_shows_control_characters_instead_of_keeping_them() -> None:
    conv = conversation()
    conv.turns[0].content = "a\x1b]0;owned\x07 title"  # the title is the first message
    conv.target = "model\x1b[31m"
    conv.turns[-1].content = "ok\x1b[2J then \x9b31m red\n\tcode"
    text = to_markdown(conv)
    assert not any(ch in text for ch in "\x1b\x07\x9b")
    assert "\n\tcode" in text  # newlines and tabs are text, kept as they are


def test_a_replys_notes_round_trip_and_are_shown_visibly(tmp_path: Path) -> None:
    """What a server did to a reply (a stall, an overrun, a dropped figure) is saved with it; a
    shared file's notes and settings can hold anything, so the footer shows them visibly."""
    from dataclasses import replace

    from specchat.store.markdown import reply_figures

    conv = conversation()
    turn = conv.turns[-1]
    assert turn.summary is not None
    turn.summary = replace(turn.summary, notes=("the server went on past max_tokens (5)",))
    store = ConversationStore(tmp_path)
    loaded = ConversationStore.load_path(store.save(conv))
    summary = loaded.turns[-1].summary
    assert summary is not None and summary.notes == ("the server went on past max_tokens (5)",)
    assert reply_figures(summary).endswith("the server went on past max_tokens (5)")
    hostile = replace(summary, notes=("\x1b]0;pwned\x07\u202eevil",))
    shown = reply_figures(hostile, {"drafter": "x\x1b[2J"})
    assert "^[]0;pwned^G⟨U+202E⟩evil" in shown and "x^[[2J" in shown
    plain = replace(summary, notes=())
    assert "notes" not in plain.to_json()
