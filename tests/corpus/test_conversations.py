"""Saved conversations that are broken, vanish or cannot be written: the app never crashes,
never overwrites a file it cannot read, and always says what happened.

A broken file is listed (last, greyed, with the reason) but cannot be opened; a folder that
cannot be written keeps the conversation on screen and says it was not saved.
"""

from __future__ import annotations

import copy
import errno
import json
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import OptionList

from specchat.store import folder as store_module
from specchat.store.conversation import ConversationError
from specchat.store.folder import ConversationStore
from specchat.testing.scripted_engines import PausingEngine
from specchat.ui.screens.conversations import ConversationsScreen
from specchat.ui.widgets.prompt import PromptInput

from .conftest import (
    SAVED_CONVERSATION,
    TERMINAL,
    AlreadySaved,
    make_app,
    record_notifications,
    send,
    wait_for,
)

pytestmark = pytest.mark.anyio


def variant(**changes: Any) -> bytes:
    data = copy.deepcopy(SAVED_CONVERSATION)
    data.update(changes)
    return json.dumps(data).encode()


def with_stats(**stats: Any) -> bytes:
    data = copy.deepcopy(SAVED_CONVERSATION)
    figures = {
        "tokens": 1, "rounds": 1, "drafted": 1, "accepted": 1, "alpha": 1.0, "tau": 1.0,
        "tokens_per_s": 10.0, "per_position": [1.0], "stop": "eos", "prefill_ms": 1.0,
        "decode_s": 0.1, "prompt_tokens": 3,
    }  # fmt: skip
    figures.update(stats)
    data["messages"][1]["stats"] = figures
    return json.dumps(data).encode()


def _message_changes(**changes: Any) -> bytes:
    data = copy.deepcopy(SAVED_CONVERSATION)
    data["messages"][0].update(changes)
    return json.dumps(data).encode()


BROKEN: dict[str, tuple[bytes, str]] = {
    "truncated JSON": (json.dumps(SAVED_CONVERSATION).encode()[:120], "not complete JSON"),
    "empty file": (b"", "not complete JSON"),
    "a JSON list": (b"[1, 2, 3]", "should be a JSON object"),
    "a JSON string": (b'"hello"', "should be a JSON object"),
    "models as text": (variant(models="qwen"), "models should be a JSON object"),
    "messages as text": (variant(messages="hi"), "messages should be a JSON list"),
    "a message as a number": (variant(messages=[1]), "a message should be a JSON object"),
    "an unknown role": (_message_changes(role="robot"), "unknown role"),
    "a message without content": (variant(messages=[{"role": "user"}]), "lacks 'content'"),
    # The reasons name the bad value; their wording is the event parser's.
    "stats.alpha as a word": (with_stats(alpha="high"), "'high'"),
    "stats.per_position as words": (with_stats(per_position=["all"]), "'all'"),
    "an unknown stop reason": (with_stats(stop="bored"), "'bored'"),
    "a newer format version": (variant(version=99), "newer specchat"),
    "a version that is not a number": (variant(version="two"), "format version"),
    "not a specchat conversation": (variant(format="something-else"), "not a specchat conversation"),
    "not UTF-8": (b'{"format": "specchat-conversation", "title": "caf\xe9"}', "not UTF-8"),
}


@pytest.mark.parametrize("name", list(BROKEN))
async def test_a_broken_file_is_listed_not_opened_and_never_touched(
    name: str, engine: PausingEngine, already_saved: AlreadySaved
) -> None:
    content, reason = BROKEN[name]
    broken = already_saved.conversation.parent / "broken.json"
    broken.write_bytes(content)
    already_saved.take()
    with pytest.raises(ConversationError, match=reason or "cannot read"):
        ConversationStore.load_path(broken)
    app = make_app(engine)
    async with app.run_test(size=TERMINAL) as pilot:
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert isinstance(app.screen, ConversationsScreen)
        options = app.screen.query_one(OptionList)
        listed = [options.get_option_at_index(i) for i in range(options.option_count)]
        assert [o.id for o in listed] == [SAVED_CONVERSATION["id"], "broken"]
        assert listed[-1].disabled and "cannot be opened" in str(listed[-1].prompt)
        await pilot.press("enter")  # the good one, highlighted first, opens
        await pilot.pause()
        assert app.conversation.id == SAVED_CONVERSATION["id"]
        await send(pilot, app, "and one more")  # the conversation that opened saves normally
    assert app.conversation.turns[-1].role == "assistant"
    assert broken.read_bytes() == content, "a file that cannot be read is never overwritten"
    assert already_saved.config.read_text() == already_saved.before_config


async def test_a_file_removed_while_the_list_is_open(
    engine: PausingEngine, already_saved: AlreadySaved
) -> None:
    app = make_app(engine)
    shown = record_notifications(app)
    async with app.run_test(size=TERMINAL) as pilot:
        await pilot.press("ctrl+o")
        await pilot.pause()
        already_saved.conversation.unlink()
        await pilot.press("enter")
        await pilot.pause()
        assert app.conversation.id != SAVED_CONVERSATION["id"] and app.conversation.turns == []
        assert any("no saved conversation" in n and "moved or deleted" in n for n in shown), shown
        await send(pilot, app, "still works")
    assert app.conversation.turns[0].content == "still works"


async def test_a_file_renamed_by_hand_opens_and_saves_to_itself(
    engine: PausingEngine, already_saved: AlreadySaved
) -> None:
    renamed = already_saved.conversation.with_name("my favourite chat.json")
    already_saved.conversation.rename(renamed)
    app = make_app(engine)
    async with app.run_test(size=TERMINAL) as pilot:
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        assert [t.content for t in app.conversation.turns] == ["hi", "hello"]
        await send(pilot, app, "more")
    files = sorted(p.name for p in renamed.parent.glob("*.json"))
    assert files == ["my favourite chat.json"]
    saved = json.loads(renamed.read_text())
    assert [m["content"] for m in saved["messages"]][:3] == ["hi", "hello", "more"]


@pytest.mark.slow
async def test_two_copies_with_the_same_conversation_open_never_overwrite_each_other(
    engine: PausingEngine, already_saved: AlreadySaved
) -> None:
    first, second = make_app(engine), make_app(engine)
    shown = record_notifications(second)
    async with first.run_test(size=TERMINAL) as one, second.run_test(size=TERMINAL) as two:
        for pilot in (one, two):
            await pilot.press("ctrl+o")
            await pilot.pause()
            await pilot.press("enter")
            await pilot.pause()
        assert first.conversation.id == second.conversation.id == SAVED_CONVERSATION["id"]
        await send(one, first, "from the first copy")
        await send(two, second, "from the second copy")
        assert second.conversation.id != SAVED_CONVERSATION["id"]
        assert any("changed by another specchat" in n for n in shown), shown
    original = json.loads(already_saved.conversation.read_text())["messages"]
    copy_ = json.loads(second.store.path_for(second.conversation.id).read_text())["messages"]
    assert [m["content"] for m in original][:3] == ["hi", "hello", "from the first copy"]
    assert [m["content"] for m in copy_][:3] == ["hi", "hello", "from the second copy"]


def _failing_write(err: OSError) -> Any:
    def write(path: Path, text: str) -> None:
        raise err

    return write


UNWRITABLE = {
    "read-only data folder": OSError(errno.EACCES, "Permission denied"),
    "full disk": OSError(errno.ENOSPC, "No space left on device"),
    "read-only file system": OSError(errno.EROFS, "Read-only file system"),
}


@pytest.mark.parametrize("name", list(UNWRITABLE))
async def test_an_unwritable_folder_keeps_the_reply_on_screen_and_says_so(
    name: str, engine: PausingEngine, already_saved: AlreadySaved, monkeypatch: pytest.MonkeyPatch
) -> None:
    err = UNWRITABLE[name]
    monkeypatch.setattr(store_module, "write_atomic", _failing_write(err))
    app = make_app(engine)
    shown = record_notifications(app)
    async with app.run_test(size=TERMINAL) as pilot:
        await send(pilot, app, "hello there")
        reply = app.conversation.turns[-1]
        assert reply.role == "assistant" and reply.content
        assert app.transcript.replies()[-1].text == reply.content, "the reply stays on screen"
        told = [n for n in shown if "NOT saved" in n]
        assert len(told) == 1 and str(err.strerror) in told[0], shown
        assert not app.store.path_for(app.conversation.id).exists()
        # Once the folder can be written again, the next message saves everything.
        monkeypatch.undo()
        await send(pilot, app, "and now?")
        assert any("saved again" in n for n in shown)
    saved = json.loads(app.store.path_for(app.conversation.id).read_text())
    assert [m["role"] for m in saved["messages"]] == ["user", "assistant", "user", "assistant"]
    already_saved.assert_untouched()


async def test_a_data_folder_that_is_a_file(
    engine: PausingEngine, already_saved: AlreadySaved, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("I am a file")
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(blocker))
    app = make_app(engine)
    shown = record_notifications(app)
    async with app.run_test(size=TERMINAL) as pilot:
        await send(pilot, app, "hello there")
        assert app.conversation.turns[-1].content
        assert any("NOT saved" in n for n in shown), shown
        await pilot.press("ctrl+o")  # listing a folder that is not one: an empty list, no crash
        await pilot.pause()
        assert isinstance(app.screen, ConversationsScreen)
    assert blocker.read_text() == "I am a file"
    already_saved.assert_untouched()


async def test_a_message_over_the_context_leaves_no_file(
    engine: PausingEngine, already_saved: AlreadySaved
) -> None:
    app = make_app(engine)
    shown = record_notifications(app)
    async with app.run_test(size=TERMINAL) as pilot:
        prompt = app.query_one("#prompt", PromptInput)
        prompt.text = "abc " * 100
        await pilot.press("enter")
        await wait_for(pilot, lambda: any("context holds" in n for n in shown))
        await pilot.pause()
        assert app.conversation.turns == []
        assert prompt.text == ("abc " * 100).strip(), "the message comes back to the box"
    assert not app.store.path_for(app.conversation.id).exists(), "no orphan file holding only the message"
    already_saved.assert_untouched()


SIZE = len(BROKEN) + len(UNWRITABLE) + 5
"""Cases this file adds to the corpus."""
