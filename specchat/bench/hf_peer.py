"""The peer: Hugging Face ``generate``, plain and with ``assistant_model`` (assisted decoding).

It runs on the very model objects specchat uses, with the same stop tokens and sampling
settings, so the only difference measured is the decoding loop. transformers reads the number
of drafted tokens from the *assistant's* generation config, so γ is set there (constant
schedule, no confidence threshold) for the call and restored afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.generation.streamers import BaseStreamer

from specchat.engine.kv import device_sync
from specchat.engine.sampling import SamplingParams

_ASSISTANT_FIELDS = (
    "num_assistant_tokens",
    "num_assistant_tokens_schedule",
    "assistant_confidence_threshold",
)


@dataclass(frozen=True, slots=True)
class PeerResult:
    token_ids: list[int]
    wall_s: float
    first_s: float | None = None
    """Seconds from the start of ``generate`` to its first streamed tokens (prefill and first
    step: transformers does not separate them). None when nothing was streamed."""
    first_tokens: int = 0
    """How many tokens came with that first chunk (an assisted round may bring several)."""


class FirstChunkClock(BaseStreamer):
    """A streamer that only notes when ``generate`` hands over its first generated tokens.

    ``generate`` first streams the prompt itself; the chunk after it is the first output.
    """

    def __init__(self, start: float) -> None:
        self.start = start
        self.puts = 0
        self.first_s: float | None = None
        self.first_tokens = 0

    def put(self, value: torch.Tensor) -> None:
        self.puts += 1
        if self.puts == 2:
            self.first_s = time.perf_counter() - self.start
            self.first_tokens = int(value.numel())

    def end(self) -> None:
        pass


@contextmanager
def assistant_settings(draft: PreTrainedModel, gamma: int | None) -> Iterator[None]:
    """γ drafted tokens per round, constant; ``None`` leaves transformers' defaults in place."""
    config = draft.generation_config
    saved = {name: getattr(config, name, None) for name in _ASSISTANT_FIELDS}
    try:
        if gamma is not None:
            config.num_assistant_tokens = gamma
            config.num_assistant_tokens_schedule = "constant"
            config.assistant_confidence_threshold = 0.0
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


def hf_generate(
    target: PreTrainedModel,
    prompt_ids: list[int],
    *,
    sampling: SamplingParams,
    max_new_tokens: int,
    stop_ids: frozenset[int],
    draft: PreTrainedModel | None = None,
    gamma: int | None = None,
    seed: int | None = None,
) -> PeerResult:
    """One reply from ``target.generate`` (assisted by ``draft`` when given), timed end to end and
    to its first streamed tokens."""
    device = target.device
    input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    stops = sorted(stop_ids)
    kwargs: dict[str, Any] = {
        "attention_mask": torch.ones_like(input_ids),
        "max_new_tokens": max_new_tokens,
        "eos_token_id": stops or None,
        "pad_token_id": stops[0] if stops else None,
        "repetition_penalty": 1.0,
        "do_sample": not sampling.greedy,
    }
    if not sampling.greedy:
        kwargs.update(temperature=sampling.temperature, top_k=sampling.top_k or 0, top_p=sampling.top_p)
    if draft is not None:
        kwargs["assistant_model"] = draft
    if seed is not None:
        torch.manual_seed(seed)
    with assistant_settings(draft, gamma) if draft is not None else _nothing(), torch.inference_mode():
        device_sync(device)
        start = time.perf_counter()
        clock = FirstChunkClock(start)
        generate: Any = target.generate  # transformers' stubs type it as a tensor attribute
        out = generate(input_ids, streamer=clock, **kwargs)
        device_sync(device)
        wall = time.perf_counter() - start
    new = out[0, len(prompt_ids) :].tolist()
    for i, token in enumerate(new):
        if token in stop_ids:
            new = new[:i]
            break
    return PeerResult(new, wall, clock.first_s, clock.first_tokens)


@contextmanager
def _nothing() -> Iterator[None]:
    yield
