"""A server's reasoning: ``reasoning_content`` or ``<think>`` in the content, marked as the local
engine marks it; the thinking switch sent as chat_template_kwargs; raw mode refused."""

from __future__ import annotations

import pytest

from specchat.engine.backend import Controls
from specchat.engine.events import SummaryEvent, TokenEvent
from specchat.engine.reasoning import answer_text, reasoning_text
from specchat.errors import InvalidSettingError
from specchat.remote import connect
from tests.remote.server import (
    THINKING_ROUNDS,
    FakeServer,
    Script,
    llama_script,
    llama_thinking_stream,
    openai_models,
    openai_stream,
)

MESSAGES = [{"role": "user", "content": "hi"}]


def thinking_server() -> Script:
    script = llama_script()
    script.stream = llama_thinking_stream(THINKING_ROUNDS)
    return script


def test_reasoning_content_is_marked_and_gets_its_own_alpha() -> None:
    with FakeServer(thinking_server()) as server:
        backend = connect(server.url)
        events = list(backend.stream_chat(MESSAGES, Controls(gamma=3)))
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert reasoning_text(tokens) == "The user says hi, so greet back."
    assert answer_text(tokens) == "Hello! How are you?"
    summary = events[-1]
    assert isinstance(summary, SummaryEvent)
    assert summary.reasoning_tokens == 9
    assert summary.reasoning_alpha == pytest.approx(5 / 9)
    assert summary.answer_alpha == pytest.approx(4 / 6)
    assert summary.alpha == pytest.approx(9 / 15)


def test_think_tags_in_the_content_are_marked_too() -> None:
    script = Script(
        documents={"/v1/models": (200, "application/json", openai_models())},
        stream=openai_stream(["<think>", "hmm", " ok", "</think>", "\n\n", "Hi", "!"]),
    )
    with FakeServer(script) as server:
        backend = connect(server.url)
        tokens = [e for e in backend.stream_chat(MESSAGES, Controls()) if isinstance(e, TokenEvent)]
    assert [t.reasoning for t in tokens] == [True] * 5 + [False] * 2
    assert answer_text(tokens) == "Hi!"


def test_thinking_off_asks_the_template_through_chat_template_kwargs() -> None:
    with FakeServer(thinking_server()) as server:
        backend = connect(server.url)
        assert backend.capabilities.thinking_switch
        list(backend.stream_chat(MESSAGES, Controls(thinking=False)))
        off = server.script.requests[-1]
        list(backend.stream_chat(MESSAGES, Controls()))
        on = server.script.requests[-1]
    assert off["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in on


def test_a_plain_server_has_no_thinking_switch_and_raw_is_refused() -> None:
    script = Script(
        documents={"/v1/models": (200, "application/json", openai_models())},
        stream=openai_stream(["Hi"]),
    )
    with FakeServer(script) as server:
        backend = connect(server.url)
        assert not backend.capabilities.thinking_switch and not backend.capabilities.raw
        list(backend.stream_chat(MESSAGES, Controls(thinking=False)))
        assert "chat_template_kwargs" not in server.script.requests[-1]
        with pytest.raises(InvalidSettingError, match="local engine only"):
            backend.stream_chat(MESSAGES, Controls(raw=True))
