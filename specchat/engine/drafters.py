"""Drafters propose tokens for the target to verify. All share one interface.

``propose`` returns the drafted ids and, row by row, the exact distribution each was drawn
from (``p_draft``). Verification is exact only if ``p_draft`` is that distribution, after the
same temperature / top-k / top-p shaping the target gets; a deterministic proposal (a lookup)
is a one-hot distribution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from specchat.engine.events import DrafterName
from specchat.engine.kv import PREFILL_CHUNK, CachedLM, common_prefix_length
from specchat.engine.sampling import pick_tokens, shape_probs
from specchat.engine.static import StaticLM
from specchat.params import DRAFT_STOP_BELOW, SamplingParams


@dataclass(frozen=True, slots=True)
class Draft:
    ids: list[int]
    """The drafted ids, n ≤ γ of them (may be none)."""
    tokens: torch.Tensor
    """The same ids as a tensor on the device."""
    p_draft: torch.Tensor
    """[n, V] the distributions the drafts were drawn from."""


@dataclass(frozen=True, slots=True)
class DeviceDraft:
    """γ drafts that never left the device; the draft's stop rule kept the first ``count``.

    A draft model on a static cache drafts all γ tokens without reading any back (each step's
    token feeds the next pass on the device), and applies its stop rule there: ``count`` is
    where it would have stopped. The round's one host read returns the ids with the verdict.
    """

    tokens: torch.Tensor
    """[γ] the drafted ids, on the device."""
    p_draft: torch.Tensor
    """[γ, V] the distributions they were drawn from."""
    count: torch.Tensor
    """0-dim: how many of them are proposed (1 … γ)."""
    lm: StaticLM
    """The draft model's cache, which holds the first γ − 1 drafts once drafting is done."""

    def read(self) -> Draft:
        """The same draft with its ids on the host (one read), for a target without a static cache."""
        values = torch.cat([self.tokens, self.count.reshape(1)]).tolist()
        n = int(values[-1])
        ids = [int(i) for i in values[:-1]]
        self.lm.extend_known(ids[: len(ids) - 1])
        return Draft(ids=ids[:n], tokens=self.tokens[:n], p_draft=self.p_draft[:n])


class Drafter(Protocol):
    name: DrafterName

    @property
    def read_share(self) -> float | None:
        """What reading a token costs the drafter as a share of the target's cost (None:
        nothing to read, or unknown): a catch-up's price before one was timed."""
        ...

    def next_source(self, ids: list[int]) -> DrafterName:
        """Who will propose the next draft after ``ids`` (the schedule sizes γ for that source)."""
        ...

    def behind(self, ids: list[int]) -> int:
        """Tokens of ``ids`` the drafter must still read before it can draft after them (0 for a
        lookup). A model drafter reads the prompt only when it first drafts (the schedule may
        never ask it to); after a drafted round it is 1 or 2 tokens behind, after plain rounds
        as many as they produced."""
        ...

    def propose(
        self,
        ids: list[int],
        gamma: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        *,
        window: int | None = None,
    ) -> Draft | DeviceDraft:
        """Up to γ drafts after ``ids``. ``window``: a model drafter far behind reads only the
        last this many tokens from now on (:meth:`ModelDrafter.view`); a lookup ignores it."""
        ...


RECENT_TOKENS = 64
"""How far back the drafter looks to decide whether the text needs its whole head."""
WIDEN_SHARE = 1 / 8
"""Share of those tokens past the narrow head from which the whole head is computed."""
WINDOW_CHECK = 16
"""Tokens of a window's start compared with the draft's cache to tell it still holds."""
AFTER_A_DRAFTED_ROUND = 2
"""Tokens a drafted round leaves the draft behind at most (the last draft and the bonus token)."""


class ModelDrafter:
    """A smaller causal LM sharing the target's tokenizer, run autoregressively with its cache.

    A draft on the native kernels computes only the first ids of its head by default (its
    ``narrow_head``: the most frequent ids, fewer bytes read per drafted token), which cannot
    propose any other id. English and code rarely need one (4–9 % of the tokens of the bench's
    replies), German, French or Spanish often do (15–26 %), and every such token was a certain
    rejection; so while an eighth or more of the recent tokens lie past the narrow head, the
    drafter computes the whole head. Either way ``p_draft`` is the distribution it drew from.
    """

    name: DrafterName = "model"

    def __init__(
        self,
        model: CachedLM,
        vocab_width: int,
        stop_below: float = DRAFT_STOP_BELOW,
        read_share: float | None = None,
    ) -> None:
        self.lm = model
        self.stop_below = stop_below
        self.vocab_width = vocab_width
        """Width the rows are padded to: the wider of the two models, so the rows line up."""
        self.read_share = read_share
        """What reading a token costs this draft as a share of what it costs the target (their
        layers' weights, :func:`layer_weights`): with the target's measured prefill, the price
        of a catch-up before one was ever timed (None: unknown)."""
        self.start = 0
        """Where the draft's view of the text begins (:meth:`view`): 0, or the start of a window."""

    def head_rows(self, ids: list[int]) -> int | None:
        """The head rows to compute for a draft after ``ids`` (None: the model's default)."""
        narrow = getattr(self.lm.model, "narrow_head", None)
        if narrow is None:
            return None
        recent = ids[-RECENT_TOKENS:]
        outside = sum(1 for token in recent if token >= narrow)
        return self.lm.vocab_width if recent and outside >= WIDEN_SHARE * len(recent) else None

    def next_source(self, ids: list[int]) -> DrafterName:
        return "model"

    def behind(self, ids: list[int]) -> int:
        view = self.view(ids)
        return max(len(view) - common_prefix_length(self.lm.cached_ids, view), 1) if view else 0

    def view(self, ids: list[int], window: int | None = None) -> list[int]:
        """The part of ``ids`` the draft reads: all of it, or from the start of a window.

        ``window``: if the draft is more than this many tokens behind, it reads only the last
        this many from now on. A window is kept once chosen, so the rounds after it extend the
        same cache rather than re-read a sliding one; a text whose window no longer begins as
        the cache does (a new conversation, older messages left out, a cache emptied) is read
        from its beginning again, unless a window is asked for anew.
        """
        if self.start and not self._window_holds(ids):
            self.start = 0
        if window is not None and self.behind(ids) > window:
            self.start = max(len(ids) - window, 0)
        return ids[self.start :]

    def _window_holds(self, ids: list[int]) -> bool:
        cached = self.lm.cached_ids[:WINDOW_CHECK]
        return self.start < len(ids) and bool(cached) and cached == ids[self.start : self.start + len(cached)]

    def catch_up(self, ids: list[int]) -> None:
        """Read what the cache lacks of ``ids`` but their last token, as a prefill would, unless
        the first drafting pass can read it all.

        The draft reads the prompt only when it first drafts, so how far behind it is depends on
        what its cache held before (nothing, or this very prompt when a reply is replayed or
        stepped after being streamed). Where the model's logits are not bit-identical across pass
        widths (a torch forward), drafting straight from a catch-up pass would give one reply two
        sets of ``p_draft`` (a 238-token pass in one history, a 1-token pass in the other), so all
        but the last token are read first and the pass the draft's logits come from is one token
        wide in every history, as the target's prefill does. A row-exact model (specchat's
        kernels) gives the same rows either way: there the first drafting pass reads everything
        the draft is behind on, one pass fewer per catch-up (docs/lab/2026-12-05-catch-up.md),
        unless that is more than a prefill's chunk (:data:`PREFILL_CHUNK`): chunks read a long
        text faster than one pass. A drafted round leaves at most two tokens behind, which are
        read in one pass either way.
        """
        behind = max(len(ids) - common_prefix_length(self.lm.cached_ids, ids), 1)
        long_read = not self.lm.rows_exact or behind > PREFILL_CHUNK
        if behind > AFTER_A_DRAFTED_ROUND and long_read:
            self.lm.prefill(ids)

    def propose(
        self,
        ids: list[int],
        gamma: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        *,
        window: int | None = None,
    ) -> Draft | DeviceDraft:
        head_rows = self.head_rows(ids)
        ids = self.view(ids, window)
        self.catch_up(ids)
        if isinstance(self.lm, StaticLM):
            return self.propose_on_device(ids, gamma, params, generator)
        context = list(ids)
        rows: list[torch.Tensor] = []
        drafted: list[torch.Tensor] = []
        for _ in range(gamma):
            probs = shape_probs(self.lm.logits_after(context, 1, head_rows=head_rows), params)
            token = pick_tokens(probs, params, generator)
            rows.append(probs)
            drafted.append(token)
            # One small host read per drafted token is inherent: the next pass needs its id.
            token_id, confidence = read_choice(probs, token)
            context.append(token_id)
            if confidence < self.stop_below:
                break
        if not rows:
            return empty_draft(self.vocab_width, self.lm.device)
        p_draft = _pad_columns(torch.cat(rows), self.vocab_width)  # a narrow head: zero past its ids
        return Draft(ids=context[len(ids) :], tokens=torch.cat(drafted), p_draft=p_draft)

    def propose_on_device(
        self, ids: list[int], gamma: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Draft | DeviceDraft:
        """γ drafts with no host read: each drafted token is the next pass's input on the device.

        The stop rule (end after a position whose top probability is below ``stop_below``) is
        applied on the device too: all γ positions are drafted and ``count`` says how many are
        proposed, which is the prefix the loop above would have proposed.
        """
        lm = self.lm
        assert isinstance(lm, StaticLM)
        if gamma < 1:
            return empty_draft(self.vocab_width, lm.device)
        logits = lm.logits_after(ids, 1)
        rows: list[torch.Tensor] = []
        drafted: list[torch.Tensor] = []
        tops: list[torch.Tensor] = []
        for k in range(gamma):
            probs = shape_probs(logits, params)
            token = pick_tokens(probs, params, generator)
            rows.append(probs)
            drafted.append(token)
            tops.append(probs[0].max().reshape(1))
            if k + 1 < gamma:
                logits = lm.logits_of(token, len(ids) + k)
        sure = torch.cat(tops) >= self.stop_below
        # Positions before the first unsure one, plus that one (it is still proposed), at most γ.
        count = torch.clamp(sure.long().cumprod(0).sum() + 1, max=gamma)
        p_draft = _pad_columns(torch.cat(rows), self.vocab_width)
        return DeviceDraft(tokens=torch.cat(drafted), p_draft=p_draft, count=count, lm=lm)


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the last n tokens and copy what
    followed it. Costs no model pass, shines on code edits, quotes and summaries."""

    name: DrafterName = "ngram"
    read_share: float | None = None

    def __init__(
        self, vocab_width: int, device: torch.device, max_ngram: int = 3, min_ngram: int = 1
    ) -> None:
        self.vocab_width = vocab_width
        self.device = device
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._index = LookupIndex(max_ngram, min_ngram)

    def next_source(self, ids: list[int]) -> DrafterName:
        return "ngram"

    def behind(self, ids: list[int]) -> int:
        return 0

    def propose(
        self,
        ids: list[int],
        gamma: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        *,
        window: int | None = None,
    ) -> Draft:
        return self.draft_of(self._index.continuation(ids, gamma))

    def draft_of(self, continuation: list[int]) -> Draft:
        """A looked-up continuation as a draft: one-hot rows, since nothing was sampled."""
        if not continuation:
            return empty_draft(self.vocab_width, self.device)
        tokens = torch.tensor(continuation, dtype=torch.long, device=self.device)
        p_draft = F.one_hot(tokens, self.vocab_width).float()
        return Draft(ids=continuation, tokens=tokens, p_draft=p_draft)


class LookupIndex:
    """Where each n-gram of a text last occurred, kept up to date as the text grows.

    A lookup wants the continuation of the most recent earlier occurrence of the text's longest
    suffix n-gram. Scanning the whole text for it cost every round time in proportion to the
    context, rounds that then draft nothing included (docs/lab/2026-12-05-plain-rounds.md); the
    index answers from one dictionary read per n and learns each new token once. A text that is
    not an extension of the one indexed (a new conversation, older messages left out, a probe's
    window) is indexed afresh.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._ids: list[int] = []
        self._starts: dict[int, dict[tuple[int, ...], tuple[int | None, int]]] = {
            n: {} for n in range(min_ngram, max_ngram + 1)
        }
        """n → n-gram → (its previous start or None, its latest start)."""

    def continuation(self, ids: list[int], gamma: int) -> list[int]:
        """Up to γ tokens that followed the most recent earlier match of the longest suffix n-gram."""
        self._learn(ids)
        length = len(ids)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            # The latest start of the suffix n-gram is the suffix itself; the one before is the match.
            earlier, _latest = self._starts[n][tuple(ids[length - n :])]
            if earlier is not None:
                return ids[earlier + n : earlier + n + gamma]
        return []

    def _learn(self, ids: list[int]) -> None:
        known = len(self._ids)
        if len(ids) < known or ids[:known] != self._ids:
            self._ids = []
            known = 0
            for starts in self._starts.values():
                starts.clear()
        self._ids.extend(ids[known:])
        for end in range(known + 1, len(ids) + 1):  # the n-grams ending at each new token
            for n, starts in self._starts.items():
                start = end - n
                if start >= 0:
                    key = tuple(ids[start:end])
                    latest = starts.get(key)
                    starts[key] = (latest[1] if latest is not None else None, start)


def layer_weights(config: Any) -> int | None:
    """Weights a token passes through in a model's decoder layers (attention and MLP), from its
    config; None where the config does not say. What a prefill costs per token scales with it:
    the embedding is a lookup, and a prefill computes the head for its last token only."""
    try:
        hidden = int(config.hidden_size)
        layers = int(config.num_hidden_layers)
        mlp = int(config.intermediate_size)
        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):
        return None
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q and o, k and v
    return layers * (attention + 3 * hidden * mlp) if layers > 0 and hidden > 0 else None


def read_share(draft: Any, target: Any) -> float | None:
    """A token's read (prefill) cost for the draft as a share of the target's, from their configs."""
    draft_weights, target_weights = layer_weights(draft), layer_weights(target)
    if not draft_weights or not target_weights:
        return None
    return draft_weights / target_weights


def read_choice(probs: torch.Tensor, token: torch.Tensor) -> tuple[int, float]:
    """The drafted id and the draft's top probability at that position, in one host read."""
    both = torch.stack([token[0].double(), probs[0].max().double()]).tolist()
    return int(both[0]), float(both[1])


def _pad_columns(rows: torch.Tensor, width: int) -> torch.Tensor:
    """Zero probability for ids past a model's own vocabulary (widths differ by padding rows)."""
    return F.pad(rows, (0, width - rows.shape[-1])) if rows.shape[-1] < width else rows


def empty_draft(vocab_width: int, device: torch.device) -> Draft:
    return Draft(
        ids=[],
        tokens=torch.empty(0, dtype=torch.long, device=device),
        p_draft=torch.empty(0, vocab_width, device=device),
    )
