"""What the CPU and the CUDA tests of quantized targets both measure."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specchat.engine.events import TokenEvent
from specchat.engine.kv import CachedLM
from specchat.engine.sampling import SamplingParams, shape_probs

if TYPE_CHECKING:
    from specchat.engine.kv import EngineModel

WIDTHS = range(1, 10)  # a verify pass scores γ+1 positions; γ up to 8 here
CONTEXT = [1, *[3 + (i * 7) % 40 for i in range(40)]]


def row_mismatch(model: EngineModel, ids: list[int], width: int) -> float:
    """Largest difference between a verify pass over ``width`` positions and one-token passes."""
    lm = CachedLM(model)
    context, tail = ids[:-width], ids[-width:]
    lm.logits_after(context, 1)
    together = lm.logits_after(ids, width).clone()
    singles = torch.stack([lm.logits_after(context + tail[: i + 1], 1)[0].clone() for i in range(width)])
    return float((together - singles).abs().max())


def token_ids(events: object) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenEvent)]  # type: ignore[attr-defined]


def exact_by_one_token_passes(model: EngineModel, prompt: list[int], params: SamplingParams) -> torch.Tensor:
    """The target's exact two-token distribution, computed as plain decoding computes it."""
    lm = CachedLM(model)
    lm.prefill(prompt)
    first = shape_probs(lm.logits_after(prompt, 1), params)[0]
    second = torch.stack(
        [shape_probs(lm.logits_after([*prompt, t], 1), params)[0] for t in range(first.shape[0])]
    )
    return (first[:, None] * second).cpu()
