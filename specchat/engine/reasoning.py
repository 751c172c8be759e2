"""Reasoning in a reply: which tokens a thinking model spent reasoning before it answered.

Thinking models (Qwen3, DeepSeek-R1 and its distillations, QwQ) write their reasoning between
``<think>`` and ``</think>``, then the answer; servers that parse it out send it apart, as
``reasoning_content``. :class:`ReasoningMarker` decides token by token, from the text each token
adds, whether it belongs to the reasoning, so the engine marks every TokenEvent once and the
chat, the exports, ``generate`` and the bench all split a reply the same way.

The tags themselves belong to the reasoning, and so does the blank space between ``</think>``
and the answer (Qwen3 writes ``</think>\\n\\n``): the answer starts at its first visible
character. A tag split over several tokens flips the state at the token that completes it (the
models above spell each tag as one token, so there it is exact). A prompt that leaves a
``<think>`` open (templates that make the model think, such as DeepSeek-R1's) starts the reply
inside the reasoning.

Pure Python: the UI and the remote backend use it without torch.
"""

from __future__ import annotations

from collections.abc import Iterable

from specchat.engine.events import TokenEvent

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"
_HELD = max(len(OPEN_TAG), len(CLOSE_TAG)) - 1
"""Characters kept from one token to the next: a tag's start, waiting for the rest of it."""


def opens_reasoning(prompt_text: str) -> bool:
    """Whether ``prompt_text`` (the prompt's end, as text) leaves a ``<think>`` open."""
    return prompt_text.rfind(OPEN_TAG) > prompt_text.rfind(CLOSE_TAG)


class ReasoningMarker:
    """Token by token: is this token reasoning? (see the module's docstring)."""

    def __init__(self, inside: bool = False) -> None:
        self.inside = inside
        self._held = ""
        self._after_close = False
        """Just past ``</think>``: blank tokens still belong to the reasoning."""

    def mark(self, text: str) -> bool:
        """Whether the token that adds ``text`` belongs to the reasoning."""
        if not text:  # an incomplete character: it goes with the tokens around it
            return self.inside or self._after_close
        scan = self._held + text
        tagged = False
        while (at := scan.find(CLOSE_TAG if self.inside else OPEN_TAG)) >= 0:
            scan = scan[at + len(CLOSE_TAG if self.inside else OPEN_TAG) :]
            self.inside = not self.inside
            self._after_close = not self.inside
            tagged = True
        self._held = scan[-_HELD:]
        if tagged or self.inside:
            return True
        if self._after_close and text.isspace():
            return True
        self._after_close = False
        return False


def reasoning_text(tokens: Iterable[TokenEvent]) -> str:
    return "".join(t.text for t in tokens if t.reasoning)


def answer_text(tokens: Iterable[TokenEvent]) -> str:
    return "".join(t.text for t in tokens if not t.reasoning)
