"""The speculative loop: draft → verify → accept → roll back, yielding events.

Each round: the drafter proposes up to γ tokens; the target scores the pending token plus all
drafts in one forward pass (γ+1 positions); a prefix of the drafts is accepted by the
rejection test; the round closes with a residual correction, a bonus token, or (when nothing
was drafted) a plain target token. Caches roll back implicitly: the next round asks each model
for logits after the new history, and :class:`CachedLM` crops whatever diverged.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specchat.engine.detokenize import IncrementalDetokenizer
from specchat.engine.drafters import Draft, Drafter, empty_draft
from specchat.engine.events import Event, RoundEvent, StopReason, TokenEvent, TokenKind
from specchat.engine.gamma import GammaSchedule
from specchat.engine.kv import CachedLM, device_sync
from specchat.engine.metrics import StreamStats
from specchat.engine.sampling import SamplingParams, shape_probs, verify
from specchat.errors import ContextTooLongError, InvalidSettingError


@dataclass(frozen=True, slots=True)
class RoundPlan:
    """What the next round uses. Read once at the start of every round."""

    drafter: Drafter | None
    schedule: GammaSchedule
    sampling: SamplingParams


def check_prompt(prompt_ids: list[int], max_context: int | None) -> None:
    if not prompt_ids:
        raise InvalidSettingError("the prompt is empty: type something to send.")
    if max_context is not None and len(prompt_ids) >= max_context:
        raise ContextTooLongError(
            f"the prompt is {len(prompt_ids)} tokens but the model's context holds {max_context}: "
            "shorten it or clear the conversation."
        )


def new_generator(device: torch.device, seed: int | None) -> torch.Generator:
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def _closing_kind(drafted: int, accepted: int) -> TokenKind:
    if drafted == 0:
        return "target"
    return "bonus" if accepted == drafted else "correction"


class SpeculativeDecoder:
    def __init__(
        self,
        target: CachedLM,
        detokenizer: Callable[[list[int]], IncrementalDetokenizer],
        stop_ids: frozenset[int],
        max_context: int | None,
        vocab_width: int,
    ) -> None:
        self.target = target
        self.new_detokenizer = detokenizer
        self.stop_ids = stop_ids
        self.max_context = max_context
        self.vocab_width = vocab_width

    def stream(
        self,
        prompt_ids: list[int],
        *,
        plan: Callable[[], RoundPlan],
        max_new_tokens: int,
        seed: int | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        check_prompt(prompt_ids, self.max_context)
        generator = new_generator(self.target.device, seed)
        detok = self.new_detokenizer(prompt_ids)
        first = plan()
        prefill_ms = self.target.prefill(prompt_ids)
        if first.drafter is not None:
            first.drafter.prefill(prompt_ids)
        ids = list(prompt_ids)
        stats = StreamStats()
        start = time.perf_counter()
        stop: StopReason | None = None
        round_no = 0
        while stop is None:
            stop = self._stop_before_round(len(ids) - len(prompt_ids), len(ids), max_new_tokens, cancel)
            if stop is not None:
                break
            current = plan() if round_no else first
            gamma = self._gamma_for(current, ids, len(ids) - len(prompt_ids), max_new_tokens)
            events, emitted, stop = self._round(ids, round_no, gamma, current, generator, detok)
            for event in events:
                stats.add(event)
                yield event
            ids.extend(emitted)
            current.schedule.observe(events[-1])  # type: ignore[arg-type]
            round_no += 1
        decode_s = time.perf_counter() - start
        yield stats.summary(stop, prefill_ms=prefill_ms, decode_s=decode_s, prompt_tokens=len(prompt_ids))

    def _stop_before_round(
        self, generated: int, length: int, max_new_tokens: int, cancel: threading.Event | None
    ) -> StopReason | None:
        if cancel is not None and cancel.is_set():
            return "cancelled"
        if generated >= max_new_tokens:
            return "max_tokens"
        if self.max_context is not None and length >= self.max_context:
            return "context"
        return None

    def _gamma_for(self, current: RoundPlan, ids: list[int], generated: int, max_new_tokens: int) -> int:
        if current.drafter is None:
            return 0
        length = len(ids)
        gamma = current.schedule.next_gamma(current.drafter.next_source(ids))
        room = (self.max_context - length) if self.max_context is not None else gamma + 1
        # Never draft past the token budget or the context: the round adds accepted + 1 tokens.
        return max(0, min(gamma, max_new_tokens - generated - 1, room - 1))

    def _round(
        self,
        ids: list[int],
        round_no: int,
        gamma: int,
        current: RoundPlan,
        generator: torch.Generator,
        detok: IncrementalDetokenizer,
    ) -> tuple[list[Event], list[int], StopReason | None]:
        sampling = current.sampling
        t0 = time.perf_counter()
        draft = self._draft(ids, gamma, current, generator)
        device_sync(self.target.device)
        t1 = time.perf_counter()
        logits = self.target.logits_after(ids + draft.ids, len(draft.ids) + 1)
        p_target = shape_probs(logits, sampling)
        if p_target.shape[-1] < self.vocab_width:
            p_target = F.pad(p_target, (0, self.vocab_width - p_target.shape[-1]))
        verdict = verify(p_target, draft.p_draft, draft.tokens, sampling, generator)
        t2 = time.perf_counter()

        events: list[Event] = []
        emitted: list[int] = []
        stop: StopReason | None = None
        proposals = [
            (tok, "accepted", verdict.p_target_drafts[i], verdict.p_draft_drafts[i])
            for i, tok in enumerate(draft.ids[: verdict.accepted])
        ]
        closing = (
            verdict.next_token,
            _closing_kind(len(draft.ids), verdict.accepted),
            verdict.p_target_next,
            None,
        )
        for position, (token, kind, p_t, p_d) in enumerate([*proposals, closing]):
            if token in self.stop_ids:
                stop = "eos"
                break
            text = detok.add(token)
            events.append(TokenEvent(kind, token, text, round_no, position, p_t, p_d))  # type: ignore[arg-type]
            emitted.append(token)
        events.append(
            RoundEvent(
                round=round_no,
                gamma=gamma,
                drafted=len(draft.ids),
                accepted=verdict.accepted,
                draft_ms=(t1 - t0) * 1000.0,
                verify_ms=(t2 - t1) * 1000.0,
                drafter=current.drafter.name if current.drafter is not None else "none",
            )
        )
        return events, emitted, stop

    def _draft(self, ids: list[int], gamma: int, current: RoundPlan, generator: torch.Generator) -> Draft:
        drafter = current.drafter
        if drafter is None or gamma == 0:
            return empty_draft(self.vocab_width, self.target.device)
        return drafter.propose(ids, gamma, current.sampling, generator)
