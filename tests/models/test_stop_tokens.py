"""A GGUF records one eos; a reply also ends on the turn-ending tokens llama.cpp stops on."""

from __future__ import annotations

import pytest

from specchat.models.gguf.convert import sync_eos_ids
from specchat.testing.tiny_models import make_model, make_tokenizer


@pytest.mark.parametrize("turn_end", ["<end_of_turn>", "<|eot_id|>", "<|end|>", "<|im_end|>"])
def test_a_chat_models_turn_end_stops_a_reply(turn_end: str) -> None:
    tokenizer = make_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [turn_end]})
    model = make_model(len(tokenizer), seed=0)
    sync_eos_ids(model, tokenizer, from_gguf=True)
    stops = model.generation_config.eos_token_id
    assert tokenizer.convert_tokens_to_ids(turn_end) in (stops if isinstance(stops, list) else [stops])


def test_a_plain_text_token_of_the_same_spelling_is_not_a_stop() -> None:
    tokenizer = make_tokenizer()
    model = make_model(len(tokenizer), seed=0)
    sync_eos_ids(model, tokenizer, from_gguf=True)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
