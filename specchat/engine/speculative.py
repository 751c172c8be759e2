"""The speculative loop: draft → verify → accept → roll back, one round per call.

:meth:`SpeculativeDecoder.start` prefills and returns a :class:`Generation`; each
:meth:`Generation.step` runs exactly one round and returns its events (the reply's last step
also returns the summary). :meth:`SpeculativeDecoder.stream` is a loop over ``step``, so
streaming, stepping one round at a time (talk mode) and tracing share one code path.

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
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from specchat.engine.detokenize import IncrementalDetokenizer
from specchat.engine.drafters import DeviceDraft, Draft, Drafter, empty_draft
from specchat.engine.events import (
    UNKNOWN,
    Candidate,
    DraftTrace,
    Event,
    RoundEvent,
    StopReason,
    SummaryEvent,
    TokenEvent,
    TokenKind,
    Verdict,
)
from specchat.engine.gamma import GammaSchedule, RoundOutlook
from specchat.engine.kv import CachedLM, common_prefix_length
from specchat.engine.metrics import StreamStats
from specchat.engine.registry import is_model
from specchat.engine.sampling import (
    RoundVerification,
    SamplingParams,
    own_probabilities,
    shape_probs,
    verify,
)
from specchat.engine.static import StaticLM
from specchat.engine.timing import RoundClock
from specchat.errors import ContextTooLongError, InvalidSettingError

MEASURED_PREFILL = 16
"""Fewest prompt tokens a prefill must read for its time per token to price a draft's catch-up."""


@dataclass(frozen=True, slots=True)
class RoundPlan:
    """What the next round uses. Read once at the start of every round."""

    drafter: Drafter | None
    schedule: GammaSchedule
    sampling: SamplingParams
    draft_window: int | None = None
    """The most a draft model far behind reads when reading everything does not pay (None: no
    window); the schedule decides which it reads."""


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


def _verdict_of(position: int, accepted: int) -> Verdict:
    if position < accepted:
        return "accepted"
    return "rejected" if position == accepted else "untested"


class SpeculativeDecoder:
    def __init__(
        self,
        target: CachedLM,
        detokenizer: Callable[[list[int]], IncrementalDetokenizer],
        stop_ids: frozenset[int],
        max_context: int | None,
        vocab_width: int,
        token_text: Callable[[int], str] = str,
    ) -> None:
        self.target = target
        self.new_detokenizer = detokenizer
        self.stop_ids = stop_ids
        self.max_context = max_context
        self.vocab_width = vocab_width
        self.token_text = token_text
        """One token's text on its own, for traces (drafts and top candidates)."""

    def start(
        self,
        prompt_ids: list[int],
        *,
        plan: Callable[[], RoundPlan],
        max_new_tokens: int,
        seed: int | None = None,
        cancel: threading.Event | None = None,
    ) -> Generation:
        """Prefill the prompt and return the reply, ready for its first :meth:`Generation.step`."""
        check_prompt(prompt_ids, self.max_context)
        return Generation(self, prompt_ids, plan, max_new_tokens, seed, cancel)

    def stream(
        self,
        prompt_ids: list[int],
        *,
        plan: Callable[[], RoundPlan],
        max_new_tokens: int,
        seed: int | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        generation = self.start(
            prompt_ids, plan=plan, max_new_tokens=max_new_tokens, seed=seed, cancel=cancel
        )
        while not generation.done:
            yield from generation.step()


class Generation:
    """One reply being decoded: the state kept between rounds.

    ``step`` runs exactly one round. Time between steps (a paused talk, a slow consumer) is not
    decoding time: ``decode_s`` sums the steps themselves.
    """

    def __init__(
        self,
        decoder: SpeculativeDecoder,
        prompt_ids: list[int],
        plan: Callable[[], RoundPlan],
        max_new_tokens: int,
        seed: int | None,
        cancel: threading.Event | None,
    ) -> None:
        self.decoder = decoder
        self.prompt_tokens = len(prompt_ids)
        self.plan = plan
        self.max_new_tokens = max_new_tokens
        self.cancel = cancel
        self.generator = new_generator(decoder.target.device, seed)
        self.detok = decoder.new_detokenizer(prompt_ids)
        self._first: RoundPlan | None = plan()
        # Only the target reads the prompt now. A draft model reads it when it first drafts
        # (it catches up on whatever it has not seen), so a reply the schedule decodes plainly
        # never pays for it, and the first token is not kept waiting for it.
        read = max(len(prompt_ids) - 1 - common_prefix_length(decoder.target.cached_ids, prompt_ids), 0)
        self.prefill_ms = decoder.target.prefill(prompt_ids)
        self.prefill_ms_per_token = self.prefill_ms / read if read >= MEASURED_PREFILL else None
        """The target's prefill of this prompt per token read, where enough were read to tell."""
        self.ids = list(prompt_ids)
        self.stats = StreamStats()
        self.round_no = 0
        self.decode_s = 0.0
        self.stop: StopReason | None = None
        self.summary: SummaryEvent | None = None

    @property
    def generated(self) -> int:
        return len(self.ids) - self.prompt_tokens

    @property
    def done(self) -> bool:
        return self.summary is not None

    def step(self) -> list[Event]:
        """Run one round; its tokens, then its RoundEvent, then the summary if the reply ended."""
        if self.done:
            return []
        start = time.perf_counter()
        self.stop = self._stop_reason()
        if self.stop is not None:
            return [self._finish(start)]
        current = self._first or self.plan()
        self._first = None
        gamma, behind = self._gamma_for(current)
        window = current.schedule.window
        reads = min(behind, window) if window else behind
        events, emitted, eos = self._round(gamma, current, caught_up=reads if gamma else 0, window=window)
        self.ids.extend(emitted)
        current.schedule.observe(events[-1])  # type: ignore[arg-type]
        self.round_no += 1
        self.stop = "eos" if eos else self._stop_reason()
        if self.stop is not None:
            _flush_into_last_token(events, self.detok.flush())
        for event in events:
            self.stats.add(event)
        if self.stop is not None:
            events.append(self._finish(start))
        else:
            self.decode_s += time.perf_counter() - start
        return events

    def finish(self, stop: StopReason = "cancelled") -> SummaryEvent:
        """End the reply between rounds (a talk stopped while paused)."""
        if self.summary is None:
            self.stop = stop
            self._finish(time.perf_counter())
        assert self.summary is not None
        return self.summary

    def _finish(self, step_start: float) -> SummaryEvent:
        assert self.stop is not None
        self.decode_s += time.perf_counter() - step_start
        self.summary = self.stats.summary(
            self.stop, prefill_ms=self.prefill_ms, decode_s=self.decode_s, prompt_tokens=self.prompt_tokens
        )
        return self.summary

    def _stop_reason(self) -> StopReason | None:
        if self.cancel is not None and self.cancel.is_set():
            return "cancelled"
        if self.generated >= self.max_new_tokens:
            return "max_tokens"
        max_context = self.decoder.max_context
        if max_context is not None and len(self.ids) >= max_context:
            return "context"
        return None

    def _gamma_for(self, current: RoundPlan) -> tuple[int, int]:
        """γ for this round and how many tokens the drafter must catch up on before drafting."""
        if current.drafter is None:
            return 0, 0
        length = len(self.ids)
        behind = current.drafter.behind(self.ids)
        left = self.max_new_tokens - self.generated
        outlook = RoundOutlook(
            remaining=left,
            produced=self.generated,
            behind=behind,
            window=current.draft_window,
            prefill_ms_per_token=self.prefill_ms_per_token,
            read_share=current.drafter.read_share,
        )
        gamma = current.schedule.next_gamma(current.drafter.next_source(self.ids), outlook)
        max_context = self.decoder.max_context
        room = (max_context - length) if max_context is not None else gamma + 1
        # Never draft past the token budget or the context: the round adds accepted + 1 tokens.
        return max(0, min(gamma, left - 1, room - 1)), behind

    def _round(
        self, gamma: int, current: RoundPlan, *, caught_up: int = 0, window: int | None = None
    ) -> tuple[list[Event], list[int], bool]:
        """One draft → verify → accept round: its events, the ids it adds, and whether it hit a stop token.

        The round reads the device once, with the verdict: drafts that stayed on the device
        (:class:`DeviceDraft`) come back with it, and the draft/verify split is timed by device
        events rather than by waiting for the device in between. ``window``: a draft model far
        behind reads only the last this many tokens (the schedule's choice: a cheap probe, or a
        long prompt whose whole read would not pay); verification is exact whatever the draft
        saw, since p_draft is what it sampled from.
        """
        decoder = self.decoder
        target = decoder.target
        clock = RoundClock(target.device)
        draft = self._draft(gamma, current, window)
        clock.mark()
        if isinstance(draft, DeviceDraft) and not isinstance(target, StaticLM):
            draft = draft.read()
        if isinstance(draft, DeviceDraft):
            assert isinstance(target, StaticLM)
            logits = target.logits_after_tokens(self.ids, draft.tokens)
        else:
            logits = target.logits_after(self.ids + draft.ids, len(draft.ids) + 1)
        p_target = shape_probs(logits, current.sampling)
        if p_target.shape[-1] < decoder.vocab_width:
            p_target = F.pad(p_target, (0, decoder.vocab_width - p_target.shape[-1]))
        # At T > 0 the test sees shaped probabilities; the trace also shows the target's own
        # (T = 1), taken from these logits and read back with the verdict (no extra sync).
        own = None if current.sampling.greedy else own_probabilities(logits, draft.tokens)
        count = draft.count if isinstance(draft, DeviceDraft) else None
        verdict = verify(
            p_target, draft.p_draft, draft.tokens, current.sampling, self.generator,
            p_target_own=own, count=count,
        )  # fmt: skip
        clock.mark()
        drafted = draft.ids if isinstance(draft, Draft) else _proposed(verdict, draft, decoder.target)
        draft_ms, verify_ms = clock.spans_ms()

        events: list[Event] = []
        emitted: list[int] = []
        eos = False
        for token in self._round_tokens(drafted, verdict):
            if token.token_id in decoder.stop_ids:
                eos = True
                break
            text = self.detok.add(token.token_id)
            events.append(replace(token, text=text, reasoning=self.detok.reasoning.mark(text)))
            emitted.append(token.token_id)
        events.append(
            RoundEvent(
                round=self.round_no,
                gamma=gamma,
                drafted=len(drafted),
                accepted=verdict.accepted,
                draft_ms=draft_ms,
                verify_ms=verify_ms,
                drafter=current.drafter.name if current.drafter is not None else "none",
                drafts=self._draft_traces(drafted, verdict, current),
                caught_up=caught_up if drafted else 0,
                note=current.schedule.note,
            )
        )
        return events, emitted, eos

    def _round_tokens(self, drafted: list[int], verdict: RoundVerification) -> list[TokenEvent]:
        """The round's accepted drafts and its closing token (text filled in by the caller)."""
        round_no, accepted = self.round_no, verdict.accepted
        tokens = [
            TokenEvent(
                "accepted",
                tok,
                "",
                round_no,
                i,
                verdict.p_target_drafts[i],
                verdict.p_draft_drafts[i],
                "draft",
            )
            for i, tok in enumerate(drafted[:accepted])
        ]
        top = tuple(
            Candidate(tok, self.decoder.token_text(tok), p)
            for tok, p in zip(verdict.top_ids, verdict.top_probs, strict=True)
        )
        closing = TokenEvent(
            _closing_kind(len(drafted), accepted),
            verdict.next_token,
            "",
            round_no,
            accepted,
            verdict.p_target_next,
            None,
            "residual" if verdict.from_residual else "target",
            top,
        )
        return [*tokens, closing]

    def _draft_traces(
        self, drafted: list[int], verdict: RoundVerification, current: RoundPlan
    ) -> tuple[DraftTrace, ...]:
        accepted, draws = verdict.accepted, verdict.draws
        target_own = verdict.p_target_own or [UNKNOWN] * len(drafted)
        draft_own = _draft_own(verdict, current)
        return tuple(
            DraftTrace(
                tok,
                self.decoder.token_text(tok),
                verdict.p_target_drafts[i],
                verdict.p_draft_drafts[i],
                verdict.accept_probs[i],
                draws[i] if draws is not None and i <= accepted else None,
                _verdict_of(i, accepted),
                target_own[i],
                draft_own[i],
            )
            for i, tok in enumerate(drafted)
        )

    def _draft(self, gamma: int, current: RoundPlan, window: int | None = None) -> Draft | DeviceDraft:
        drafter = current.drafter
        if drafter is None or gamma == 0:
            return empty_draft(self.decoder.vocab_width, self.decoder.target.device)
        return drafter.propose(self.ids, gamma, current.sampling, self.generator, window=window)


def _proposed(verdict: RoundVerification, draft: DeviceDraft, target: CachedLM) -> list[int]:
    """The ids a device draft proposed, read back with the verdict; both caches learn what they hold."""
    assert verdict.draft_ids is not None and isinstance(target, StaticLM)
    every = verdict.draft_ids
    target.extend_known(every)  # the verify pass cached all γ drafts
    draft.lm.extend_known(every[:-1])  # the draft model fed all but its last
    return every[: len(verdict.p_draft_drafts)]


def _draft_own(verdict: RoundVerification, current: RoundPlan) -> list[float]:
    """The draft model's own softmax of each draft, where the round already holds it.

    At T = 0 a model's draft rows are its plain softmax (shape_probs), so they are its own
    probabilities. A lookup's rows are one-hot (nothing was sampled), and at T > 0 the rows
    are shaped and the draft's logits are gone: both are unknown rather than misreported.
    """
    drafter = current.drafter
    model_drafted = drafter is not None and is_model(drafter.name)
    if current.sampling.greedy and model_drafted:
        return list(verdict.p_draft_drafts)
    return [UNKNOWN] * len(verdict.p_draft_drafts)


def _flush_into_last_token(events: list[Event], held_back: str) -> None:
    """Give the reply's last token the text the detokenizer still held (a cut multi-byte character)."""
    if not held_back:
        return
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if isinstance(event, TokenEvent):
            events[index] = replace(event, text=event.text + held_back)
            return
