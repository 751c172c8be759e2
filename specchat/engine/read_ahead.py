"""Reading ahead: the models read what is already known of the next prompt while nobody waits.

Between replies the chat knows most of the next prompt: the conversation so far, and whatever
the user has typed or pasted. The target's prefill of it and the draft's catch-up on it cost
the same whether they run before Enter or after, so the chat has them read it while the user
types or reads (:meth:`specchat.engine.session.ChatEngine.read_ahead`). At Enter each model
reuses the longest prefix its cache holds (:class:`~specchat.engine.kv.CachedLM`), so what was
read ahead is never read again, and what turned out different (an edited word, the end of the
message) is cropped and read as usual.

Two rules keep it safe:

- **It stops at once.** It reads in chunks of :data:`CHUNK` tokens and asks ``stop``
  between them, so a reply (or quitting) waits for one chunk at most.
- **It never changes a reply.** Only models whose rows are the same bits at any pass width
  (specchat's kernels, :attr:`CachedLM.rows_exact`) read ahead: their caches hold the same
  bits whether the prompt was read in one pass at Enter or in chunks before it, so the reply
  is the one it would have been. A torch forward's rows depend on the pass's width, and a
  draft's drafts would then depend on when the user pressed Enter.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from specchat.engine.kv import CachedLM, common_prefix_length

CHUNK = 32
"""Tokens per read: small enough that stopping waits little (a 1.5B target reads 32 tokens in
0.2–0.7 s on two cores), wide enough to keep the kernels' batched speed
(docs/lab/2026-12-07-never-slower.md)."""
UNSETTLED = 16
"""Tokens at the end of what is known that are left unread: the last words of a message still
being typed tokenize differently once it goes on, and the template's closing of the message
and its opening of the reply follow them."""


@dataclass(frozen=True, slots=True)
class ReadAhead:
    """What one read-ahead did, for the log and the tests."""

    read: dict[str, int]
    """Model ("target", "draft") → tokens it read."""
    ms: float
    stopped: bool
    """Whether ``stop`` ended it before it read all it could."""


def settled(ids: list[int]) -> list[int]:
    """The part of a prompt's ids that will not change as its last message goes on."""
    return ids[: max(len(ids) - UNSETTLED, 0)]


def read_ahead(models: dict[str, CachedLM], ids: list[int], stop: Callable[[], bool]) -> ReadAhead:
    """Have each row-exact model read ``ids`` into its cache, chunk by chunk, in the order given
    (the target first: its prefill is what the first token waits for)."""
    start = time.perf_counter()
    read = {name: 0 for name in models}
    for name, lm in models.items():
        if not lm.rows_exact:
            continue
        held = common_prefix_length(lm.cached_ids, ids)
        while held < len(ids):
            if stop():
                return ReadAhead(read, (time.perf_counter() - start) * 1000.0, True)
            end = min(held + CHUNK, len(ids))
            lm.logits_after(ids[:end], 1)  # caches ids[:end]; one head row, as a prefill computes
            read[name] += end - held
            held = end
    return ReadAhead(read, (time.perf_counter() - start) * 1000.0, False)
