"""ChatEngine: the one object front ends drive.

It owns the target, the drafters and their caches, turns a conversation into prompt ids with
the target's chat template, and streams events. ``Controls`` is a plain mutable object the
caller may change at any moment (a key press in the TUI); the engine snapshots it once at the
start of every round, so a change applies to the next round and never races the current one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import torch

from specchat.backend import Capabilities, Controls, Message
from specchat.engine.baseline import plain_decode
from specchat.engine.detokenize import IncrementalDetokenizer
from specchat.engine.drafters import Drafter
from specchat.engine.events import Event, StopReason, SummaryEvent
from specchat.engine.gamma import GammaSchedule, make_schedule
from specchat.engine.kv import CachedLM
from specchat.engine.registry import DrafterKit, drafter_spec, drafters
from specchat.engine.speculative import Generation, RoundPlan, SpeculativeDecoder
from specchat.errors import ContextTooLongError, InvalidSettingError, OutOfMemoryError

if TYPE_CHECKING:
    # Types only: importing transformers' modeling code costs seconds at every start.
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["ChatEngine", "Controls", "Message"]

LOCAL_FIGURES = frozenset({"alpha", "tau", "per_position", "tokens_per_s", "timings", "trace"})


@dataclass
class _PlanReader:
    """Turns the live Controls into a RoundPlan each round, keeping schedule state per reply."""

    engine: ChatEngine
    controls: Controls
    _schedule: GammaSchedule | None = None
    _schedule_name: str = ""

    def __call__(self) -> RoundPlan:
        c = self.controls
        if self._schedule is None or self._schedule_name != c.schedule:
            self._schedule = self.engine.schedule(c.schedule, lambda: self.controls.gamma)
            self._schedule_name = c.schedule
        return RoundPlan(self.engine.drafter(c.drafter), self._schedule, c.sampling())


class ChatEngine:
    """The local backend: both models on this machine, every figure measured exactly."""

    def __init__(
        self,
        target: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        draft: PreTrainedModel | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.target = CachedLM(target)
        self.draft = CachedLM(draft) if draft is not None else None
        widths = [self.target.vocab_width] + ([self.draft.vocab_width] if self.draft else [])
        self.vocab_width = max(widths)
        self.max_context = _min_optional(
            self.target.max_positions, self.draft.max_positions if self.draft else None
        )
        self.stop_ids = _stop_ids(target, tokenizer)
        kit = DrafterKit(self.target, self.draft, self.vocab_width, self.target.device)
        self._drafters: dict[str, Drafter | None] = {}
        for spec in drafters():
            drafter = kit.get(spec.name)
            if drafter is not None or not spec.needs_draft_model:
                self._drafters[spec.name] = drafter
        self.token_text = lru_cache(maxsize=1 << 16)(self._token_text)
        self._schedules: dict[str, GammaSchedule] = {}
        self._decoder = SpeculativeDecoder(
            self.target, self._detokenizer, self.stop_ids, self.max_context, self.vocab_width, self.token_text
        )

    @property
    def available_drafters(self) -> list[str]:
        return list(self._drafters)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            kind="local",
            provenance="exact",
            measured=LOCAL_FIGURES,  # type: ignore[arg-type]
            gamma_control="per-round",
            drafters=tuple(self._drafters),
            stepping=True,
        )

    def schedule(self, name: str, gamma: Callable[[], int]) -> GammaSchedule:
        """The engine's one schedule of that name, told a reply begins (its measurements persist)."""
        if name not in self._schedules:
            self._schedules[name] = make_schedule(name, gamma)
        schedule = self._schedules[name]
        schedule.begin_reply(gamma)
        return schedule

    def forget_measurements(self) -> None:
        """Drop what the γ schedules measured (costs, α): the next reply starts as the first did."""
        self._schedules.clear()

    def drafter(self, name: str) -> Drafter | None:
        if name not in self._drafters:
            drafter_spec(name)  # an unknown name gets the registry's message
            raise InvalidSettingError(
                f"drafter {name!r} is not available: load a draft model (--draft) or use --drafter ngram."
            )
        return self._drafters[name]

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The conversation through the target's chat template, ready for the assistant's turn."""
        if getattr(self.tokenizer, "chat_template", None):
            # transformers 5 returns a BatchEncoding here; pass return_dict so that is guaranteed.
            encoded: Any = self.tokenizer.apply_chat_template(
                list(messages), add_generation_prompt=True, tokenize=True, return_dict=True
            )
            return [int(i) for i in encoded["input_ids"]]
        # No template (a base model): plain concatenation of the turns.
        text = "\n\n".join(m["content"] for m in messages)
        return list(self.tokenizer(text)["input_ids"])

    def stream_chat(
        self, messages: Sequence[Message], controls: Controls, cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        return self.stream_ids(self.prompt_ids(messages), controls, cancel)

    def start_chat(
        self, messages: Sequence[Message], controls: Controls, cancel: threading.Event | None = None
    ) -> LocalReply:
        """The reply to ``messages``, one round per ``step()`` (prefilled before returning)."""
        return self.start_ids(self.prompt_ids(messages), controls, cancel)

    def stream_ids(
        self, prompt_ids: list[int], controls: Controls, cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        self._check(prompt_ids, controls)
        return _translate_oom(self._stream_ids(prompt_ids, controls, cancel))

    def _stream_ids(
        self, prompt_ids: list[int], controls: Controls, cancel: threading.Event | None
    ) -> Iterator[Event]:
        reply = self.start_ids(prompt_ids, controls, cancel)
        while not reply.done:
            yield from reply.step()

    def start_ids(
        self, prompt_ids: list[int], controls: Controls, cancel: threading.Event | None = None
    ) -> LocalReply:
        self._check(prompt_ids, controls)
        with _oom_as_user_error():
            generation = self._decoder.start(
                prompt_ids,
                plan=_PlanReader(self, controls),
                max_new_tokens=controls.max_new_tokens,
                seed=controls.seed,
                cancel=cancel,
            )
        return LocalReply(generation)

    def stream_plain(
        self, prompt_ids: list[int], controls: Controls, cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        """The independent target-only reference (benchmarks and exactness checks)."""
        controls.validate()
        return _translate_oom(
            plain_decode(
                self.target,
                self._detokenizer(prompt_ids),
                prompt_ids,
                sampling=controls.sampling(),
                max_new_tokens=controls.max_new_tokens,
                stop_ids=self.stop_ids,
                max_context=self.max_context,
                seed=controls.seed,
                cancel=cancel,
            )
        )

    def close(self) -> None:
        self.target.reset()
        if self.draft is not None:
            self.draft.reset()

    def _check(self, prompt_ids: list[int], controls: Controls) -> None:
        """Fail before any work: bad controls, a missing drafter, a prompt the context cannot hold."""
        controls.validate()
        controls.sampling()
        self.drafter(controls.drafter)
        if self.max_context is not None and len(prompt_ids) >= self.max_context:
            raise ContextTooLongError(
                f"the conversation is {len(prompt_ids)} tokens but the context holds {self.max_context}: "
                "clear the conversation or start a new one."
            )

    def _detokenizer(self, prompt_ids: list[int]) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.tokenizer, prompt_ids)

    def _token_text(self, token_id: int) -> str:
        text = self.tokenizer.decode(
            [token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        return text if isinstance(text, str) else "".join(text)


class LocalReply:
    """A local reply stepped one round at a time (see :class:`specchat.backend.Reply`)."""

    def __init__(self, generation: Generation) -> None:
        self.generation = generation

    @property
    def done(self) -> bool:
        return self.generation.done

    def step(self) -> list[Event]:
        with _oom_as_user_error():
            return self.generation.step()

    def finish(self, stop: StopReason = "cancelled") -> SummaryEvent:
        return self.generation.finish(stop)


@contextmanager
def _oom_as_user_error() -> Iterator[None]:
    try:
        yield
    except torch.OutOfMemoryError as err:
        raise OutOfMemoryError(
            "out of memory while decoding: lower --max-new-tokens, clear the conversation, "
            "use --quant 4bit or a smaller model."
        ) from err


def _translate_oom(stream: Iterator[Event]) -> Iterator[Event]:
    with _oom_as_user_error():
        yield from stream


def _stop_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    ids: set[int] = set()
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (config_eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return frozenset(ids)


def _min_optional(*values: int | None) -> int | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None
