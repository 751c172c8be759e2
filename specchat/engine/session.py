"""ChatEngine: the one object front ends drive.

It owns the target, the drafters and their caches, turns a conversation into prompt ids with
the target's chat template, and streams events. ``Controls`` is a plain mutable object the
caller may change at any moment (a key press in the TUI); the engine snapshots it once at the
start of every round, so a change applies to the next round and never races the current one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specchat.engine.baseline import plain_decode
from specchat.engine.detokenize import IncrementalDetokenizer
from specchat.engine.drafters import DRAFTERS, Drafter, ModelDrafter, NgramDrafter
from specchat.engine.events import Event
from specchat.engine.gamma import SCHEDULES, GammaSchedule, check_gamma, make_schedule
from specchat.engine.hybrid import HybridDrafter
from specchat.engine.kv import CachedLM
from specchat.engine.sampling import SamplingParams
from specchat.engine.speculative import RoundPlan, SpeculativeDecoder
from specchat.errors import ContextTooLongError, InvalidSettingError, OutOfMemoryError

Message = dict[str, str]
"""{"role": "system" | "user" | "assistant", "content": "..."}"""


@dataclass
class Controls:
    """Settings a user can change while a reply streams; read once per round."""

    gamma: int = 4
    schedule: str = "fixed"
    drafter: str = "model"
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    max_new_tokens: int = 512
    seed: int | None = None

    def validate(self) -> None:
        check_gamma(self.gamma)
        if self.schedule not in SCHEDULES:
            raise InvalidSettingError(
                f"unknown gamma schedule {self.schedule!r}: use {', '.join(SCHEDULES)}."
            )
        if self.drafter not in DRAFTERS:
            raise InvalidSettingError(f"unknown drafter {self.drafter!r}: use {', '.join(DRAFTERS)}.")
        if self.max_new_tokens < 1:
            raise InvalidSettingError(f"max new tokens must be 1 or more (got {self.max_new_tokens}).")
        self.sampling()

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)


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
            self._schedule = make_schedule(c.schedule, lambda: self.controls.gamma)
            self._schedule_name = c.schedule
        return RoundPlan(self.engine.drafter(c.drafter), self._schedule, c.sampling())


class ChatEngine:
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
        lookup = NgramDrafter(self.vocab_width, self.target.device)
        self._drafters: dict[str, Drafter] = {"ngram": lookup}
        if self.draft is not None:
            model = ModelDrafter(self.draft, self.vocab_width)
            self._drafters["model"] = model
            # The hybrid shares both drafters (and the draft's cache): switching costs nothing.
            self._drafters["hybrid"] = HybridDrafter(lookup, model)
        self._decoder = SpeculativeDecoder(
            self.target, self._detokenizer, self.stop_ids, self.max_context, self.vocab_width
        )

    @property
    def available_drafters(self) -> list[str]:
        return [name for name in DRAFTERS if name == "none" or name in self._drafters]

    def drafter(self, name: str) -> Drafter | None:
        if name == "none":
            return None
        if name not in self._drafters:
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

    def stream_ids(
        self, prompt_ids: list[int], controls: Controls, cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        controls.validate()
        self.drafter(controls.drafter)  # fail before any work when the drafter is missing
        if self.max_context is not None and len(prompt_ids) >= self.max_context:
            raise ContextTooLongError(
                f"the conversation is {len(prompt_ids)} tokens but the context holds {self.max_context}: "
                "clear the conversation or start a new one."
            )
        stream = self._decoder.stream(
            prompt_ids,
            plan=_PlanReader(self, controls),
            max_new_tokens=controls.max_new_tokens,
            seed=controls.seed,
            cancel=cancel,
        )
        return _translate_oom(stream)

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

    def _detokenizer(self, prompt_ids: list[int]) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.tokenizer, prompt_ids)


def _translate_oom(stream: Iterator[Event]) -> Iterator[Event]:
    try:
        yield from stream
    except torch.OutOfMemoryError as err:
        raise OutOfMemoryError(
            "out of memory while decoding: lower --max-new-tokens, clear the conversation, "
            "use --quant 4bit or a smaller model."
        ) from err


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
