"""A causal LM paired with its KV cache and the token ids that cache holds.

Callers never manage the cache by hand: they ask for logits after a token sequence, and the
model reuses the longest cached prefix of that sequence, crops what diverged (a rejected
draft, an edited conversation), and runs only the new tail. Rollback after a rejection,
catching the draft up after a bonus token, prefix reuse across chat turns and switching
drafters mid-reply are all this one operation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

if TYPE_CHECKING:
    from typing import TypeAlias

    from transformers import PreTrainedModel

    from specchat.kernels.lm import DecodingLM, LeanCache

    EngineModel: TypeAlias = PreTrainedModel | DecodingLM
    """What the engine decodes with: a transformers model, or one of specchat's fast forwards
    (the native kernels, the lean forward), of which it calls only what DecodingLM names."""


PREFILL_CHUNK = 64
"""Tokens a row-exact model reads per pass in a prefill: 800 prompt tokens took 0.76 of one
pass's time in chunks of 64 on two AVX-512 cores (docs/lab/2026-12-07-never-slower.md)."""


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case, checked at C speed
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


def device_sync(device: torch.device) -> None:
    """Wait for queued kernels so that wall-clock timings mean something on a GPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class CachedLM:
    model: EngineModel
    cached_ids: list[int] = field(default_factory=list)
    cache: DynamicCache | LeanCache | None = None
    forward_calls: int = 0
    """How many forward passes ran (tests use it to check that rounds batch their work)."""

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def vocab_width(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def input_rows(self) -> int | None:
        """Rows of the model's embedding (None where it does not say): ids past them have none."""
        rows = getattr(self.model, "input_rows", None)
        if rows is None:
            embeddings = getattr(self.model, "get_input_embeddings", None)
            rows = getattr(embeddings(), "num_embeddings", None) if callable(embeddings) else None
        return int(rows) if isinstance(rows, int) else None

    @property
    def rows_exact(self) -> bool:
        """Whether the model's logits for a position are the same bits in a pass of any width
        (specchat's kernels say so; a torch forward's are not: its reductions depend on the shape)."""
        return bool(getattr(self.model, "rows_exact", False))

    @property
    def max_positions(self) -> int | None:
        value = getattr(self.model.config, "max_position_embeddings", None)
        return int(value) if value else None

    def reset(self) -> None:
        self.cached_ids = []
        self.cache = None

    @torch.inference_mode()
    def logits_after(
        self, ids: list[int], n_logits: int = 1, *, head_rows: int | None = None
    ) -> torch.Tensor:
        """Logits [n_logits, V] predicting the token after each of the last n_logits of ids.

        Afterwards the cache holds all of ``ids``. ``head_rows`` asks a model that can narrow its
        head (the native kernels' drafts) for that many ids' logits; others are never passed it.
        """
        if n_logits < 1 or n_logits > len(ids):
            raise ValueError(f"cannot score {n_logits} positions of a {len(ids)}-token sequence")
        reuse = min(common_prefix_length(self.cached_ids, ids), len(ids) - n_logits)
        self._crop(reuse)
        if self.cache is None:
            self.cache = DynamicCache(config=self.model.config)
        new = torch.tensor([ids[reuse:]], dtype=torch.long, device=self.device)
        options = {"head_rows": head_rows} if head_rows is not None else {}
        out = self.model(input_ids=new, cache=self.cache, use_cache=True, logits_to_keep=n_logits, **options)
        self.forward_calls += 1
        self.cache = out.cache
        self.cached_ids = list(ids)
        return out.logits[0, -n_logits:]

    @torch.inference_mode()
    def prefill(self, ids: list[int]) -> float:
        """Cache every token but the last (the first round scores it); returns milliseconds.

        Nothing runs when the cache already holds them (the same prompt sampled again, as the
        self-test does hundreds of times): the first round crops whatever follows. A row-exact
        model reads a long prompt :data:`PREFILL_CHUNK` tokens a pass, which is faster than one
        pass over all of it and caches the same bits; a torch forward reads it in one pass (its
        rows depend on the pass's width, and plain decoding reads it so).
        """
        start = time.perf_counter()
        held = common_prefix_length(self.cached_ids, ids)
        if len(ids) > 1 and held < len(ids) - 1:
            step = PREFILL_CHUNK if self.rows_exact else len(ids)
            for end in range(min(held, len(ids) - 2) + step, len(ids) - 1 + step, step):
                self.logits_after(ids[: min(end, len(ids) - 1)], 1)
        device_sync(self.device)
        return (time.perf_counter() - start) * 1000.0

    def _crop(self, length: int) -> None:
        if length == 0:
            self.reset()
            return
        if length < len(self.cached_ids) and self.cache is not None:
            self.cache.crop(length - len(self.cached_ids))  # transformers 5.24+: negative = tokens to drop
            self.cached_ids = self.cached_ids[:length]
