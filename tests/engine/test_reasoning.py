"""Thinking models: reasoning marked token by token, its own α, the thinking switch."""

from __future__ import annotations

import copy

import pytest

from specchat.engine.backend import Controls
from specchat.engine.events import Event, RoundEvent, SummaryEvent, TokenEvent
from specchat.engine.metrics import StreamStats
from specchat.engine.reasoning import ReasoningMarker, answer_text, opens_reasoning, reasoning_text
from specchat.engine.session import ChatEngine
from specchat.testing.tiny_models import ANSWER_SCRIPT, REASONING_SCRIPT, ThinkingPair, make_thinking_pair
from tests.typed import decoded

ASK = [{"role": "system", "content": "be brief"}, {"role": "user", "content": " hi"}]
REASONING = "<think>" + "".join(REASONING_SCRIPT) + "</think>\n\n"
ANSWER = "".join(ANSWER_SCRIPT)


@pytest.fixture(scope="module")
def thinking() -> ThinkingPair:
    return make_thinking_pair()


@pytest.fixture
def engine(thinking: ThinkingPair) -> ChatEngine:
    return ChatEngine(thinking.target, thinking.tokenizer, thinking.draft)


def tokens_of(events: list[Event]) -> list[TokenEvent]:
    return [e for e in events if isinstance(e, TokenEvent)]


def test_marker_follows_the_tags_token_by_token() -> None:
    marker = ReasoningMarker()
    pieces = ["Sure", "<think>", "let", " me", "</think>", "\n\n", "Hi", " <", "think", ">", "x"]
    marks = [marker.mark(p) for p in pieces]
    # The tags and the blank line after </think> are reasoning; a tag split over tokens flips
    # the state at the token that completes it.
    assert marks == [False, True, True, True, True, True, False, False, False, True, True]


def test_marker_starts_inside_a_prompt_that_opened_think() -> None:
    assert opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not opens_reasoning("plain text")


def test_a_local_reply_marks_its_reasoning(engine: ChatEngine) -> None:
    events = list(engine.stream_chat(ASK, Controls(drafter="model", gamma=3)))
    tokens = tokens_of(events)
    assert reasoning_text(tokens) == REASONING
    assert answer_text(tokens) == ANSWER
    first_answer = next(i for i, t in enumerate(tokens) if not t.reasoning)
    assert all(t.reasoning for t in tokens[:first_answer]) and not any(
        t.reasoning for t in tokens[first_answer:]
    )


def test_reasoning_and_answer_get_their_own_alpha(engine: ChatEngine) -> None:
    """The draft errs only inside the reasoning: its α is below the answer's, which is 1."""
    events = list(engine.stream_chat(ASK, Controls(drafter="model", gamma=3)))
    summary = events[-1]
    assert isinstance(summary, SummaryEvent)
    tokens = tokens_of(events)
    assert summary.reasoning_tokens == sum(t.reasoning for t in tokens) == len(REASONING_SCRIPT) + 3
    assert summary.answer_alpha == 1.0
    assert summary.reasoning_alpha is not None and summary.reasoning_alpha < 1.0
    # The sections add up to the reply: every draft position is charged to one of them.
    stats = StreamStats()
    stats.extend(events[:-1])
    sections = stats.sections
    assert sections.reasoning.drafted + sections.answer.drafted == summary.drafted
    assert sections.reasoning.accepted + sections.answer.accepted == summary.accepted
    assert sections.reasoning.accepted / sections.reasoning.drafted == summary.reasoning_alpha


def test_a_section_is_charged_for_the_token_each_draft_stands_for() -> None:
    """A round straddling </think>: its accepted drafts go to their tokens' sections, the
    rejected draft and the untested one after it to the correction's."""
    stats = StreamStats()
    stats.extend(
        [
            TokenEvent("accepted", 1, "a", 0, 0, 0.9, 0.9, reasoning=True),
            TokenEvent("accepted", 2, "</think>", 0, 1, 0.9, 0.9, reasoning=True),
            TokenEvent("correction", 3, "Hi", 0, 2, 0.9, None, reasoning=False),
            RoundEvent(0, 4, 4, 2, 1.0, 1.0, "model"),
        ]
    )
    assert (stats.sections.reasoning.drafted, stats.sections.reasoning.accepted) == (2, 2)
    assert (stats.sections.answer.drafted, stats.sections.answer.accepted) == (2, 0)


def test_a_summary_without_reasoning_writes_the_same_json_as_before(engine: ChatEngine) -> None:
    events = list(engine.stream_chat(ASK, Controls(drafter="model", gamma=3, thinking=False)))
    summary = events[-1]
    assert isinstance(summary, SummaryEvent)
    assert summary.reasoning_tokens == 0
    assert not {"reasoning_tokens", "reasoning_alpha", "answer_alpha"} & set(summary.to_json())
    assert all("reasoning" not in t.to_json() for t in tokens_of(events))
    assert SummaryEvent.from_json(summary.to_json()) == summary


def test_reasoning_survives_json(engine: ChatEngine) -> None:
    events = list(engine.stream_chat(ASK, Controls(drafter="model", gamma=3)))
    token = next(t for t in tokens_of(events) if t.reasoning)
    assert token.to_json()["reasoning"] is True
    assert TokenEvent.from_json(token.to_json()) == token
    summary = events[-1]
    assert isinstance(summary, SummaryEvent)
    assert SummaryEvent.from_json(summary.to_json()) == summary


def test_thinking_off_uses_the_templates_switch(engine: ChatEngine) -> None:
    assert engine.capabilities.thinking_switch
    on = engine.prompt_ids(ASK)
    off = engine.prompt_ids(ASK, thinking=False)
    assert decoded(engine.tokenizer, off).endswith("<think>\n\n</think>\n\n")
    assert off[: len(on)] == on
    events = list(engine.stream_chat(ASK, Controls(drafter="model", gamma=3, thinking=False)))
    assert answer_text(tokens_of(events)) == ANSWER
    assert reasoning_text(tokens_of(events)) == ""


def test_a_template_that_opens_think_starts_the_reply_inside(thinking: ThinkingPair) -> None:
    """DeepSeek-R1's template ends its generation prompt with <think>: the model writes only
    the closing tag, and what came before it is reasoning all the same."""
    opened = copy.deepcopy(thinking.tokenizer)
    opened.chat_template = thinking.tokenizer.chat_template.replace(
        "{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n<think>' }}"
    )
    engine = ChatEngine(thinking.target, opened, thinking.draft)
    assert decoded(engine.tokenizer, engine.prompt_ids(ASK)).endswith("<think>")
    tokens = tokens_of(list(engine.stream_chat(ASK, Controls(drafter="model", gamma=3))))
    assert tokens[0].text == "Let" and tokens[0].reasoning
    assert answer_text(tokens) == ANSWER


def test_a_repeated_open_and_a_stray_close_belong_to_the_reasoning() -> None:
    marker = ReasoningMarker()
    pieces = ["<think>", "<think>", "x", "</think>", "</think>", "Answer", "</think>", " more"]
    marks = [marker.mark(p) for p in pieces]
    assert marks == [True, True, True, True, True, False, True, False]


@pytest.mark.parametrize(
    "pieces",
    [
        ["<th", "ink>", "hmm", "</th", "ink>", "Answer"],
        ["x<think>y", "z</th", "ink>\n\nHello"],
        ["a <", "b", "<", "/", "think", ">"],
        ["<think><think>a</think></think>answer"],
    ],
)
def test_the_aligner_moves_text_so_each_tag_is_whole_and_alone(pieces: list[str]) -> None:
    from specchat.engine.reasoning import CLOSE_TAG, OPEN_TAG, TagAligner

    aligner = TagAligner()
    out = [aligner.feed(p) for p in pieces] + aligner.flush()
    assert "".join(out) == "".join(pieces)  # nothing lost, nothing reordered
    for text in out:
        for tag in (OPEN_TAG, CLOSE_TAG):
            assert tag not in text or text == tag, out


def test_a_split_tag_leaves_no_fragment_in_the_answer() -> None:
    from specchat.engine.reasoning import TagAligner

    aligner, marker = TagAligner(), ReasoningMarker()
    pieces = ["Sure", " <", "think", ">", "let", " me", "</", "think>", "Hi"]
    shown = [aligner.feed(p) for p in pieces] + aligner.flush()
    marks = [marker.mark(t) for t in shown]
    answer = "".join(t for t, m in zip(shown, marks, strict=True) if not m)
    assert answer == "Sure Hi"
