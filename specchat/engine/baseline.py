"""Target-only decoding that yields the same events as the speculative loop.

Deliberately written without the speculative machinery (one token, one forward pass), so
that comparing the two in tests checks the speculative path against an independent reference.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import torch

from specchat.engine.detokenize import IncrementalDetokenizer
from specchat.engine.events import Event, RoundEvent, StopReason, TokenEvent
from specchat.engine.kv import CachedLM
from specchat.engine.metrics import StreamStats
from specchat.engine.sampling import SamplingParams, pick_tokens, shape_probs
from specchat.engine.speculative import check_prompt, new_generator


def plain_decode(
    target: CachedLM,
    detok: IncrementalDetokenizer,
    prompt_ids: list[int],
    *,
    sampling: SamplingParams,
    max_new_tokens: int,
    stop_ids: frozenset[int],
    max_context: int | None,
    seed: int | None = None,
    cancel: threading.Event | None = None,
) -> Iterator[Event]:
    check_prompt(prompt_ids, max_context)
    generator = new_generator(target.device, seed)
    prefill_ms = target.prefill(prompt_ids)
    ids = list(prompt_ids)
    stats = StreamStats()
    start = time.perf_counter()
    stop: StopReason = "max_tokens"
    for step in range(max_new_tokens):
        if cancel is not None and cancel.is_set():
            stop = "cancelled"
            break
        if max_context is not None and len(ids) >= max_context:
            stop = "context"
            break
        t0 = time.perf_counter()
        probs = shape_probs(target.logits_after(ids, 1), sampling)
        token_t = pick_tokens(probs, sampling, generator)
        # One host read for the token and its probability (each .item() would wait for the device).
        read = torch.cat([token_t.double(), probs[0, token_t].double()]).tolist()
        token, p_token = int(read[0]), float(read[1])
        step_ms = (time.perf_counter() - t0) * 1000.0
        if token in stop_ids:
            stop = "eos"
            events: list[Event] = []
        else:
            text = detok.add(token)
            reasoning = detok.reasoning.mark(text)  # as the speculative loop: before any flush
            ids.append(token)
            if _ends_reply(step, len(ids), max_new_tokens, max_context, cancel):
                text += detok.flush()  # a reply cut inside a character keeps its last bytes
            events = [TokenEvent("target", token, text, step, 0, p_token, None, reasoning=reasoning)]
        events.append(RoundEvent(step, 0, 0, 0, 0.0, step_ms, "none"))
        for event in events:
            stats.add(event)
            yield event
        if stop == "eos":
            break
    decode_s = time.perf_counter() - start
    yield stats.summary(stop, prefill_ms=prefill_ms, decode_s=decode_s, prompt_tokens=len(prompt_ids))


def _ends_reply(
    step: int, length: int, max_new_tokens: int, max_context: int | None, cancel: threading.Event | None
) -> bool:
    """Whether the token just made is the reply's last (so the detokenizer must be flushed)."""
    return (
        step + 1 >= max_new_tokens
        or (max_context is not None and length >= max_context)
        or (cancel is not None and cancel.is_set())
    )
