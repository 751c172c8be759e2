"""A conversation longer than the context leaves its oldest exchanges out of the prompt and says
so; raw mode feeds text exactly as written."""

from __future__ import annotations

import pytest

from specchat.engine.backend import Capabilities, Controls, rendering
from specchat.engine.events import ContextEvent, SummaryEvent, TokenEvent
from specchat.engine.session import ChatEngine
from specchat.errors import ContextTooLongError
from specchat.testing.tiny_models import TinyPair
from tests.typed import decoded

SYSTEM = {"role": "system", "content": "be kind"}


def conversation(exchanges: int, words: str = "abc abc abc abc ") -> list[dict[str, str]]:
    """``exchanges`` user/assistant pairs and a last user message (character tokens: ~1 a char)."""
    messages = [SYSTEM]
    for i in range(exchanges):
        messages += [{"role": "user", "content": f"{i} {words}"}, {"role": "assistant", "content": words}]
    messages.append({"role": "user", "content": "last one"})
    return messages


def test_a_conversation_that_fits_is_sent_whole(engine: ChatEngine) -> None:
    messages = conversation(2)
    ids, left_out = engine.fit(messages, Controls(max_new_tokens=16))
    assert left_out is None and ids == engine.prompt_ids(messages)


def test_the_oldest_exchanges_are_left_out_and_the_system_prompt_kept(engine: ChatEngine) -> None:
    assert engine.max_context == 256
    messages = conversation(12)  # ~40 tokens an exchange: ~500 in all
    controls = Controls(max_new_tokens=16)
    ids, left_out = engine.fit(messages, controls)
    assert isinstance(left_out, ContextEvent)
    assert left_out.left_out % 2 == 0 and left_out.left_out > 0, "whole exchanges go"
    assert left_out.kept == len(messages) - 1 - left_out.left_out
    kept = [SYSTEM, *messages[1 + left_out.left_out :]]
    assert ids == engine.prompt_ids(kept)
    assert left_out.prompt_tokens == len(ids) <= 256 - 16
    # As many as fit: one exchange more would not.
    one_more = [SYSTEM, *messages[1 + left_out.left_out - 2 :]]
    assert len(engine.prompt_ids(one_more)) > 256 - 16
    assert decoded(engine.tokenizer, ids).startswith("<s>s:be kind")


def test_the_reply_goes_on_and_says_first_what_was_left_out(engine: ChatEngine) -> None:
    messages = conversation(12)
    controls = Controls(drafter="model", gamma=3, max_new_tokens=16, seed=1)
    events = list(engine.stream_chat(messages, controls))
    assert isinstance(events[0], ContextEvent) and isinstance(events[-1], SummaryEvent)
    assert any(isinstance(e, TokenEvent) for e in events)
    reply = engine.start_chat(messages, controls)
    stepped = []
    while not reply.done:
        stepped += reply.step()
    assert stepped[0] == events[0]
    assert [e for e in stepped if isinstance(e, TokenEvent)] == [
        e for e in events if isinstance(e, TokenEvent)
    ]


def test_a_long_reply_budget_keeps_a_quarter_of_the_context_for_the_prompt(engine: ChatEngine) -> None:
    """A token budget beyond the context does not leave the whole conversation out."""
    _, left_out = engine.fit(conversation(12), Controls(max_new_tokens=10_000))
    assert left_out is not None and left_out.prompt_tokens <= 256 - 256 // 4
    assert left_out.kept >= 1


def test_a_single_message_too_long_is_refused_in_one_line(engine: ChatEngine) -> None:
    with pytest.raises(ContextTooLongError, match="shorten the message"):
        engine.stream_chat([SYSTEM, {"role": "user", "content": "x" * 300}], Controls())


def test_raw_feeds_the_text_exactly(engine: ChatEngine, pair: TinyPair) -> None:
    messages = [SYSTEM, {"role": "user", "content": "abc <s> d"}]
    ids = engine.prompt_ids(messages, raw=True)
    assert ids == pair.tokenizer("abc <s> d")["input_ids"], "no template, no system prompt"
    assert pair.tokenizer.convert_ids_to_tokens(ids)[4] == "<s>", "special tokens in the text are parsed"
    assert engine.capabilities.raw and engine.capabilities.chat_template
    assert rendering(engine.capabilities, Controls(raw=True)) is not None
    assert rendering(engine.capabilities, Controls()) is None


def test_a_model_without_a_template_says_how_turns_are_joined(pair: TinyPair) -> None:
    tokenizer = pair.tokenizer.__class__(tokenizer_object=pair.tokenizer.backend_tokenizer)
    engine = ChatEngine(pair.target, tokenizer, pair.draft)
    assert not engine.capabilities.chat_template
    said = rendering(engine.capabilities, Controls())
    assert said is not None and "blank lines" in said
    ids = engine.prompt_ids([SYSTEM, {"role": "user", "content": "hi"}])
    assert tokenizer.decode(ids) == "be kind\n\nhi"
    assert rendering(Capabilities("x", "none", frozenset()), None) is None


def test_a_conversation_longer_than_the_template_budget_is_trimmed_not_refused(engine: ChatEngine) -> None:
    """The whole conversation rendered is over the template's output cap (1 Mi characters here):
    the oldest exchanges are left out as for any conversation that outgrew the context."""
    from specchat.engine.template_budget import output_limit

    messages = conversation(12, words="ab " * 40_000)  # ~240,000 characters an exchange
    assert sum(len(m["content"]) for m in messages) > output_limit(engine.max_context)
    ids, left_out = engine.fit(messages, Controls(max_new_tokens=16))
    assert isinstance(left_out, ContextEvent) and left_out.left_out == 24
    assert ids == engine.prompt_ids([SYSTEM, messages[-1]])
