"""Reasoning in a reply: which tokens a thinking model spent reasoning before it answered.

Thinking models (Qwen3, DeepSeek-R1 and its distillations, QwQ) write their reasoning between
``<think>`` and ``</think>``, then the answer; servers that parse it out send it apart, as
``reasoning_content``. :class:`ReasoningMarker` decides token by token, from the text each token
adds, whether it belongs to the reasoning, so the engine marks every TokenEvent once and the
chat, the exports, ``generate`` and the bench all split a reply the same way.

The tags themselves belong to the reasoning, and so does the blank space between ``</think>``
and the answer (Qwen3 writes ``</think>\\n\\n``): the answer starts at its first visible
character. A ``<think>`` inside the reasoning changes nothing, and a ``</think>`` with nothing
open (a repeated or stray one) belongs to the reasoning too, so neither leaves a fragment in
the answer. A prompt that leaves a ``<think>`` open (templates that make the model think, such
as DeepSeek-R1's) starts the reply inside the reasoning.

A tag can arrive in pieces (a tokenizer without a ``<think>`` token, a server's chunks), or
beside other text. :class:`TagAligner` moves text from one token to the next so that each tag
is whole, alone, in one token's text, before the marker sees it: ``<th`` then ``ink>`` become
nothing then ``<think>``, as an incomplete multi-byte character becomes nothing then itself.

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
        while (found := self._next_tag(scan)) is not None:
            at, tag = found
            scan = scan[at + len(tag) :]
            if tag == OPEN_TAG or self.inside:
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

    def _next_tag(self, scan: str) -> tuple[int, str] | None:
        """The next tag that means something here: inside, the close; outside, the open, or a
        close with nothing open (it is swallowed as reasoning, state unchanged)."""
        wanted = (CLOSE_TAG,) if self.inside else (OPEN_TAG, CLOSE_TAG)
        found = [(at, tag) for tag in wanted if (at := scan.find(tag)) >= 0]
        return min(found) if found else None


class TagAligner:
    """Text moved between consecutive tokens so that each reasoning tag sits whole and alone in
    one token's text (see the module docstring). What goes in comes out, in order: each call
    returns the text its token shows, :meth:`flush` what is still held at the end.

    Held back: a trailing piece that may start a tag (``<``, ``</th``), the text after a tag
    (it goes to the next token), and a tag with text before it (the text goes first). At most
    :data:`MAX_HELD` characters are held; past that everything is let through as it is. At the
    end of a reply the held text comes out as its aligned pieces, for a front end that can give
    each its own token (a server's leftover text) or join them (the local engine's last token).
    """

    def __init__(self) -> None:
        self._held = ""

    def feed(self, text: str) -> str:
        scan = self._held + text
        cut = _aligned_end(scan)
        if len(scan) - cut > MAX_HELD:
            cut = len(scan)
        self._held = scan[cut:]
        return scan[:cut]

    def flush(self) -> list[str]:
        scan, self._held = self._held, ""
        pieces: list[str] = []
        while scan:
            cut = _aligned_end(scan, final=True)
            pieces.append(scan[:cut])
            scan = scan[cut:]
        return pieces


MAX_HELD = 4096
"""Characters a :class:`TagAligner` may hold back (a text made of tags, tag after tag)."""


def _aligned_end(scan: str, final: bool = False) -> int:
    """Where the text a token may show ends (always past 0 for a non-empty ``scan``): before a
    tag with text ahead of it, after a tag that starts it, or (unless ``final``: nothing more
    comes) before a trailing piece that may start a tag."""
    tags = [(at, tag) for tag in (OPEN_TAG, CLOSE_TAG) if (at := scan.find(tag)) >= 0]
    if tags:
        at, tag = min(tags)
        return at if at > 0 else len(tag)
    if final:
        return len(scan)
    for size in range(min(_HELD, len(scan)), 0, -1):
        tail = scan[-size:]
        if OPEN_TAG.startswith(tail) or CLOSE_TAG.startswith(tail):
            return len(scan) - size
    return len(scan)


def reasoning_text(tokens: Iterable[TokenEvent]) -> str:
    return "".join(t.text for t in tokens if t.reasoning)


def answer_text(tokens: Iterable[TokenEvent]) -> str:
    return "".join(t.text for t in tokens if not t.reasoning)
