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


def test_a_reply_cut_inside_a_character_keeps_its_last_bytes() -> None:
    """Every stop reason flushes the detokenizer: the texts add up to the full decode."""
    from specchat.engine.backend import Controls
    from specchat.engine.events import TokenEvent
    from specchat.engine.session import ChatEngine
    from specchat.testing.tiny_models import make_model

    tokenizer = byte_level_tokenizer()
    tokenizer.chat_template = None
    target = make_model(len(tokenizer), seed=5, logit_scale=1.0)
    draft = make_model(len(tokenizer), seed=6, logit_scale=1.0)
    engine = ChatEngine(target, tokenizer, draft)
    cut_inside = 0
    for budget in range(1, 13):
        for drafter in ("model", "none", "plain"):  # plain: the independent reference decoder
            controls = Controls(
                gamma=3,
                drafter="none" if drafter == "plain" else drafter,
                temperature=1.0,
                max_new_tokens=budget,
                seed=budget,
            )
            prompt = tokenizer("héllo")["input_ids"]
            stream = engine.stream_plain if drafter == "plain" else engine.stream_ids
            events = list(stream(prompt, controls))
            tokens = [e for e in events if isinstance(e, TokenEvent)]
            text = "".join(t.text for t in tokens)
            assert text == tokenizer.decode([t.token_id for t in tokens])
            cut_inside += text.endswith(REPLACEMENT)
    assert cut_inside, "no reply ended inside a character: the test did not exercise the flush"
