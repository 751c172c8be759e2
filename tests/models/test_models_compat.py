"""A draft must share the target's token ids and special tokens."""

from __future__ import annotations

import pytest

from specchat.errors import TokenizerMismatchError
from specchat.models.loading.compat import check_tokenizers_compatible
from specchat.testing.tiny_models import CHARS, make_tokenizer


def test_identical_tokenizers_pass() -> None:
    check_tokenizers_compatible(make_tokenizer(), make_tokenizer())


def test_different_vocab_size_is_named() -> None:
    with pytest.raises(TokenizerMismatchError) as err:
        check_tokenizers_compatible(
            make_tokenizer(), make_tokenizer(CHARS + "xyz@#"), draft_name="tiny-draft"
        )
    message = str(err.value)
    assert "vocabularies differ in size" in message and "tiny-draft" in message
    assert "--drafter ngram" in message and "\n" not in message


def test_same_size_different_tokens_names_the_first_difference() -> None:
    swapped = "b" + "a" + CHARS[2:]
    with pytest.raises(TokenizerMismatchError) as err:
        check_tokenizers_compatible(make_tokenizer(), make_tokenizer(swapped))
    assert "token id 3 is 'a' in the target but 'b' in the draft" in str(err.value)


def test_different_eos_is_an_error() -> None:
    draft = make_tokenizer()
    draft.eos_token = "<unk>"
    with pytest.raises(TokenizerMismatchError) as err:
        check_tokenizers_compatible(make_tokenizer(), draft)
    assert "eos tokens differ" in str(err.value)


def test_extra_special_token_is_an_error() -> None:
    target, draft = make_tokenizer(), make_tokenizer()
    # The same id for a new token in both, but special only in the draft.
    target.add_tokens(["<|tool|>"])
    draft.add_tokens(["<|tool|>"], special_tokens=True)
    with pytest.raises(TokenizerMismatchError) as err:
        check_tokenizers_compatible(target, draft)
    assert "special tokens differ" in str(err.value)
