"""Incremental text never shows half a multi-byte character and adds up to the full decode."""

from __future__ import annotations

from tokenizers import ByteLevelBPETokenizer
from transformers import PreTrainedTokenizerFast

from specchat.engine.detokenize import REPLACEMENT, IncrementalDetokenizer

TEXT = "héllo wörld, 日本語のテキスト 🙂 and spaces  kept"


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    backend = ByteLevelBPETokenizer()
    backend.train_from_iterator(["hello world"], vocab_size=300, min_frequency=1)  # few merges:
    return PreTrainedTokenizerFast(tokenizer_object=backend)  # CJK and emoji span several tokens


def test_pieces_add_up_and_never_split_a_character() -> None:
    tokenizer = byte_level_tokenizer()
    ids = tokenizer(TEXT)["input_ids"]
    assert len(ids) > len(TEXT)  # multi-byte characters really are split across tokens
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.add(i) for i in ids]
    assert all(REPLACEMENT not in piece for piece in pieces)
    assert "".join(pieces) + detok.flush() == tokenizer.decode(ids)


def test_flush_returns_a_truncated_character() -> None:
    tokenizer = byte_level_tokenizer()
    ids = tokenizer("🙂")["input_ids"]
    detok = IncrementalDetokenizer(tokenizer)
    assert "".join(detok.add(i) for i in ids[:-1]) == ""
    assert detok.flush() == REPLACEMENT
