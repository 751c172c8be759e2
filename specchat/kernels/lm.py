"""What the two fast forwards share (the lean PyTorch forward, :mod:`specchat.models.compute.lean`, and the
native one on specchat's kernels, :mod:`specchat.kernels.native`): their K/V cache, their output,
and :class:`DecodingLM`, the calls :class:`specchat.engine.kv.CachedLM` makes of either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


class LeanCache:
    """K/V for every layer in buffers that grow by doubling; crop moves the length."""

    def __init__(
        self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, capacity: int = 256
    ) -> None:
        self.layers, self.kv_heads, self.head_dim, self.dtype = layers, kv_heads, head_dim, dtype
        self.length = 0
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.reserve(capacity)

    def reserve(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        capacity = max(needed, 2 * self.capacity, 256)
        shape = (self.kv_heads, capacity, self.head_dim)
        keys = [torch.empty(shape, dtype=self.dtype) for _ in range(self.layers)]
        values = [torch.empty(shape, dtype=self.dtype) for _ in range(self.layers)]
        for old, new in zip(self.keys + self.values, keys + values, strict=False):
            new[:, : self.length].copy_(old[:, : self.length])
        self.keys, self.values, self.capacity = keys, values, capacity

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        """Keep ``max_length`` tokens, or drop ``-max_length`` when negative (as DynamicCache.crop)."""
        self.length = max(self.length + max_length, 0) if max_length < 0 else min(max_length, self.length)


@dataclass
class LeanOutput:
    logits: torch.Tensor
    cache: LeanCache


class DecodingLM(Protocol):
    """A model the engine decodes with: ``model(input_ids=…, cache=…, logits_to_keep=n)`` returns
    the last ``n`` positions' logits and the cache, which grows by the pass and crops back."""

    @property
    def config(self) -> Any: ...

    @property
    def generation_config(self) -> Any: ...

    @property
    def device(self) -> torch.device: ...

    def new_cache(self) -> LeanCache: ...

    def get_output_embeddings(self) -> Any: ...

    def __call__(
        self,
        input_ids: torch.Tensor,
        cache: Any = None,
        use_cache: bool = True,
        logits_to_keep: int = 1,
        **kwargs: Any,
    ) -> LeanOutput: ...
