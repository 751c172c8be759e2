"""The chat template rendered within its budget: the same text as transformers'
apply_chat_template, and one line for a template that loops, grows, raises or does not parse."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from transformers import AutoTokenizer

from specchat.engine import template_budget
from specchat.engine.template_budget import ChatTemplateError, output_limit, render_chat
from tests.hostile_gguf import FIXTURES, OSC52_BEL

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "and now?"},
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(FIXTURES), gguf_file="qwen2-Q8_0.gguf")


def with_template(tokenizer: Any, template: str) -> Any:
    other = copy.copy(tokenizer)
    other.chat_template = template
    return other


def test_the_budget_renders_what_transformers_renders(tokenizer: Any) -> None:
    assert tokenizer.chat_template
    expected = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert render_chat(tokenizer, MESSAGES, context_tokens=4096) == expected
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)["input_ids"]
    text = render_chat(tokenizer, MESSAGES, context_tokens=4096)
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids


@pytest.mark.parametrize(
    ("template", "words"),
    [
        ("{{ raise_exception('" + OSC52_BEL + "no') }}", ("failed", "TemplateError")),
        ("{% for %}", ("TemplateSyntaxError",)),
        ("{% for i in range(10**9) %}x{% endfor %}", ("Range too big",)),
        ("{{ 'x' * 3000000000 }}", ("MiB",)),
        ("{% for i in range(3000) %}{{ 'x' * 1000 }}{% endfor %}", ("3,000,000 characters", "1,048,576")),
    ],
    ids=["raise_exception", "unparsable", "range", "3 GB string", "past the context"],
)
def test_a_hostile_template_is_one_line(tokenizer: Any, template: str, words: tuple[str, ...]) -> None:
    with pytest.raises(ChatTemplateError) as refused:
        render_chat(with_template(tokenizer, template), MESSAGES, context_tokens=256)
    message = str(refused.value)
    assert "\n" not in message and "\x1b" not in message and "\x07" not in message
    for word in words:
        assert word in message, message


def test_a_template_that_loops_is_stopped_and_the_next_render_works(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(template_budget, "RENDER_SECONDS", 1.0)
    looping = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
    with pytest.raises(ChatTemplateError, match="within 1 s"):
        render_chat(with_template(tokenizer, looping), MESSAGES, context_tokens=256)
    expected = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert render_chat(tokenizer, MESSAGES, context_tokens=4096) == expected


def test_the_output_cap_follows_the_context() -> None:
    assert output_limit(None) == 8 << 20
    assert output_limit(1000) == 1 << 20
    assert output_limit(131_072) == 32 * 131_072
