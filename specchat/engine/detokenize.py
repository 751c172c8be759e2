"""Incremental detokenization: the exact text each new token adds.

Decoding tokens one at a time breaks multi-byte characters and drops the spaces some
tokenizers attach to the following token. We decode a short window of recent tokens and
emit only the text beyond what that window produced before, holding back a trailing
replacement character until the bytes that complete it arrive.

It also marks each token's text as reasoning or answer (:mod:`specchat.engine.reasoning`),
starting inside the reasoning when the prompt's end leaves a ``<think>`` open, and aligns the
text with the reasoning tags first: a tokenizer that spells ``<think>`` in pieces has the pieces
held back until the tag is whole, so no fragment of a tag lands in the answer.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from specchat.engine.reasoning import ReasoningMarker, TagAligner, opens_reasoning

REPLACEMENT = "\ufffd"
PROMPT_TAIL_READ = 16
"""Prompt tokens read for an open ``<think>`` (a template's generation prompt ends with it)."""


class IncrementalDetokenizer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_tail: list[int] | None = None) -> None:
        self._tokenizer = tokenizer
        # Seed with a little prompt context so the first token's leading space is right.
        self._ids: list[int] = list(prompt_tail or [])[-4:]
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        tail = self._decode(list(prompt_tail or [])[-PROMPT_TAIL_READ:]) if prompt_tail else ""
        self.reasoning = ReasoningMarker(inside=opens_reasoning(tail))
        """Whether each token's text is reasoning: call ``reasoning.mark(text)`` in order."""
        self._tags = TagAligner()

    def _decode(self, ids: list[int]) -> str:
        text = self._tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return text if isinstance(text, str) else "".join(text)

    def add(self, token_id: int) -> str:
        self._ids.append(token_id)
        before = self._decode(self._ids[self._prefix_offset : self._read_offset])
        after = self._decode(self._ids[self._prefix_offset :])
        if len(after) <= len(before) or after.endswith(REPLACEMENT):
            return ""  # an incomplete character: wait for the rest of its bytes
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return self._tags.feed(after[len(before) :])

    def flush(self) -> str:
        """Whatever is still held back (a truncated character, a tag's start at the end of a reply)."""
        before = self._decode(self._ids[self._prefix_offset : self._read_offset])
        after = self._decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        rest = after[len(before) :] if len(after) > len(before) else ""
        return "".join(self._tags.flush()) + rest
