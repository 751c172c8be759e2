"""The hybrid drafter: prompt lookup when the text repeats itself, the draft model otherwise.

A lookup costs no model pass at all (c ≈ 0), so whenever the last few tokens (two at least)
occurred before in the conversation (quoting a passage, editing code, a summary reusing
phrases) their continuation is the cheapest possible draft; when there is no match, the draft
model proposes as usual. Each proposal keeps its own exact p_draft (one-hot for a lookup, the
draft model's shaped distribution otherwise), so verification stays exact either way.

``name`` tells which of the two proposed the latest draft ("ngram" or "model"): the loop stamps
it on the round's RoundEvent, so statistics and the adaptive schedule (which keeps estimates per
drafter) see lookups and model drafts apart.
"""

from __future__ import annotations

import torch

from specchat.engine.drafters import DeviceDraft, Draft, LookupIndex, ModelDrafter, NgramDrafter
from specchat.engine.events import DrafterName
from specchat.engine.sampling import SamplingParams
from specchat.params import GAMMA_MAX


class HybridDrafter:
    name: DrafterName = "model"

    def __init__(
        self, ngram: NgramDrafter, model: ModelDrafter, *, min_lookup: int = 2, min_key: int = 2
    ) -> None:
        self.ngram = ngram
        self.model = model
        self.min_lookup = min_lookup
        """Shorter continuations than this are ignored in favour of the model."""
        self.min_key = min_key
        """Tokens that must match before a lookup is trusted. One token (a lone " the") recurs by
        chance in any conversation, and what followed it then is mostly rejected: a verify pass
        spent on it, where the model would have drafted. The plain n-gram drafter, which has no
        model to fall back on, still takes such matches."""
        self._index = LookupIndex(ngram.max_ngram, max(ngram.min_ngram, min_key))

    def behind(self, ids: list[int]) -> int:
        return self.model.behind(ids) if self.next_source(ids) == "model" else 0

    def next_source(self, ids: list[int]) -> DrafterName:
        return "ngram" if len(self._lookup(ids)) >= self.min_lookup else "model"

    @property
    def read_share(self) -> float | None:
        return self.model.read_share

    def propose(
        self,
        ids: list[int],
        gamma: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        *,
        window: int | None = None,
    ) -> Draft | DeviceDraft:
        # The same decision next_source announced, so γ was sized for the source that proposes.
        self.name = self.next_source(ids)
        if self.name == "ngram":
            return self.ngram.draft_of(self._lookup(ids)[:gamma])
        return self.model.propose(ids, gamma, params, generator, window=window)

    def _lookup(self, ids: list[int]) -> list[int]:
        """The longest continuation any γ could use."""
        return self._index.continuation(ids, GAMMA_MAX)
