"""ChatEngine: the one object front ends drive.

It owns the target, the drafters and their caches, turns a conversation into prompt ids with
the target's chat template (or, raw, the text exactly as written), and streams events. A
conversation longer than the context leaves its oldest exchanges out of the prompt (the system
prompt stays), and the reply says so first with a ContextEvent. ``Controls``
(:mod:`specchat.engine.backend`, re-exported here) is a plain mutable object the caller may change at
any moment (a key press in the TUI); the engine snapshots it once at the start of every round,
so a change applies to the next round and never races the current one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any

import torch

from specchat.engine.backend import Capabilities, Controls, Message
from specchat.engine.baseline import plain_decode
from specchat.engine.detokenize import IncrementalDetokenizer
from specchat.engine.drafters import Drafter
from specchat.engine.events import ContextEvent, Event, StopReason, SummaryEvent
from specchat.engine.gamma import GammaSchedule, make_schedule
from specchat.engine.read_ahead import ReadAhead, read_ahead, settled
from specchat.engine.registry import DrafterKit, drafter_spec, drafters
from specchat.engine.speculative import Generation, RoundPlan, SpeculativeDecoder
from specchat.engine.static import make_cached_lm
from specchat.engine.template_budget import RenderTooLong, render_chat, warm_up
from specchat.errors import ContextTooLongError, InvalidSettingError, OutOfMemoryError, SpecchatError

if TYPE_CHECKING:
    # Types only: importing transformers' modeling code costs seconds at every start.
    from transformers import PreTrainedTokenizerBase

    from specchat.engine.kv import EngineModel

__all__ = ["ChatEngine"]

LOCAL_FIGURES = frozenset({"alpha", "tau", "per_position", "tokens_per_s", "timings", "trace"})
THINKING_SWITCH = "enable_thinking"
"""The variable a template reads to skip reasoning (Qwen3's; its generation prompt then holds an
empty ``<think></think>``)."""
REPLY_SHARE = 4
"""A reply is given room for at least 1/REPLY_SHARE of the context (or its whole token budget,
if smaller) before the oldest messages are left out."""


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
        window = c.draft_window or None
        return RoundPlan(self.engine.drafter(c.drafter), self._schedule, c.sampling(), window)


class ChatEngine:
    """The local backend: both models on this machine, every figure measured exactly."""

    def __init__(
        self,
        target: EngineModel,
        tokenizer: PreTrainedTokenizerBase,
        draft: EngineModel | None = None,
        *,
        kv: str = "auto",
    ) -> None:
        """``kv``: the models' caches, ``static`` (graphs on CUDA), ``dynamic`` or ``auto`` (static for
        transformers models on CUDA; see :func:`specchat.engine.static.make_cached_lm`)."""
        self.tokenizer = tokenizer
        self.target = make_cached_lm(target, kv)
        self.draft = make_cached_lm(draft, kv) if draft is not None else None
        widths = [self.target.vocab_width] + ([self.draft.vocab_width] if self.draft else [])
        self.vocab_width = max(widths)
        self.max_context = _min_optional(
            self.target.max_positions, self.draft.max_positions if self.draft else None
        )
        self.input_rows = _min_optional(self.target.input_rows, self.draft.input_rows if self.draft else None)
        """Every prompt id must be below it: the models have no embedding for the ids past it."""
        self.stop_ids = _stop_ids(target, tokenizer)
        kit = DrafterKit(self.target, self.draft, self.vocab_width, self.target.device)
        self._drafters: dict[str, Drafter | None] = {}
        for spec in drafters():
            drafter = kit.get(spec.name)
            if drafter is not None or not spec.needs_draft_model:
                self._drafters[spec.name] = drafter
        self.token_text = lru_cache(maxsize=1 << 16)(self._token_text)
        if self.chat_template is not None:
            warm_up()  # the template's renderer starts while the caller gets ready
        self._schedules: dict[str, GammaSchedule] = {}
        self._decoder = SpeculativeDecoder(
            self.target, self._detokenizer, self.stop_ids, self.max_context, self.vocab_width, self.token_text
        )
        self._reading = threading.Lock()
        """Held while the models read ahead, and while a reply starts: never both at once."""
        self._reply_starts = threading.Event()
        """Set while a reply waits to start: a read-ahead stops at its next chunk."""
        self._active: Generation | _Running | None = None
        """The latest reply started; no reading ahead until it is done."""
        self.last_read_ahead: ReadAhead | None = None

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
            chat_template=self.chat_template is not None,
            thinking_switch=THINKING_SWITCH in (self.chat_template or ""),
            raw=True,
        )

    @property
    def chat_template(self) -> str | None:
        """The target's chat template (None: a base model without one)."""
        template = getattr(self.tokenizer, "chat_template", None)
        if isinstance(template, dict):  # named templates: the default one renders chats
            template = template.get("default")
        return template if isinstance(template, str) and template else None

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

    def prompt_ids(
        self, messages: Sequence[Message], *, thinking: bool = True, raw: bool = False
    ) -> list[int]:
        """The conversation through the target's chat template, ready for the assistant's turn.

        ``thinking`` False asks the template to skip reasoning (where it has the switch; others
        ignore the variable). ``raw`` feeds the turns' text exactly as written, one after the
        other: no template, no system prompt, the tokenizer's own beginning-of-sequence token as
        the file says (what llama-server's ``/completion`` does with a text prompt). The template
        is the model file's code: it is rendered within a time, memory and output budget
        (specchat.engine.template_budget), then tokenized as apply_chat_template does."""
        if raw:
            return self.raw_ids("".join(m["content"] for m in messages if m["role"] != "system"))
        if self.chat_template is not None:
            options: dict[str, Any] = {} if thinking else {THINKING_SWITCH: False}
            text = render_chat(
                self.tokenizer,
                list(messages),
                context_tokens=self.max_context,
                template=self.chat_template,
                **options,
            )
            encoded: Any = self.tokenizer(text, add_special_tokens=False)
            return [int(i) for i in encoded["input_ids"]]
        # No template (a base model): plain concatenation of the turns.
        text = "\n\n".join(m["content"] for m in messages)
        return list(self.tokenizer(text)["input_ids"])

    def raw_ids(self, text: str) -> list[int]:
        """``text`` as the model reads it: special tokens written in it are parsed, and BOS is
        added where the file asks for it (a GGUF's ``add_bos_token``, which the converted
        tokenizer's post-processor carries)."""
        return [int(i) for i in self.tokenizer(text)["input_ids"]]

    def fit(self, messages: Sequence[Message], controls: Controls) -> tuple[list[int], ContextEvent | None]:
        """The prompt for ``messages``, leaving out the oldest exchanges when the conversation has
        outgrown the context (the system prompt stays), with a ContextEvent saying how many.

        The prompt may fill the context up to the reply's room: its token budget, or a quarter
        of the context if that is less. Whole exchanges go (a user turn and the replies after
        it), so the kept turns still start with a user's, as chat templates expect; the newest
        user message always stays. The cut is found by bisection: a few renders, not one per turn.
        """
        render = partial(self.prompt_ids, thinking=controls.thinking, raw=controls.raw)
        limit = self._prompt_limit(controls)
        try:
            ids = render(messages)
        except RenderTooLong:
            if limit is None:
                raise
            ids = None  # longer than the template budget allows for any prompt this context holds
        if ids is not None and (limit is None or len(ids) <= limit):
            return ids, None
        assert limit is not None

        def fits(candidate: Sequence[Message]) -> list[int] | None:
            try:
                prompt = render(candidate)
            except RenderTooLong:
                return None
            return prompt if len(prompt) <= limit else None

        head = [m for m in messages[:1] if m["role"] == "system"]
        turns = list(messages[len(head) :])
        cuts = [i for i, m in enumerate(turns) if i > 0 and (controls.raw or m["role"] == "user")]
        if not cuts:
            # One message: nothing to leave out (the check says if it cannot fit).
            return (render(messages) if ids is None else ids), None
        low, high = 0, len(cuts) - 1
        best = render([*head, *turns[cuts[high] :]])
        chosen = high
        while low < high:  # the smallest cut whose prompt fits
            middle = (low + high) // 2
            candidate = fits([*head, *turns[cuts[middle] :]])
            if candidate is not None:
                best, chosen, high = candidate, middle, middle
            else:
                low = middle + 1
        kept = len(turns) - cuts[chosen]
        assert self.max_context is not None
        return best, ContextEvent(cuts[chosen], kept, len(best), self.max_context)

    def _prompt_limit(self, controls: Controls) -> int | None:
        if self.max_context is None:
            return None
        room = min(controls.max_new_tokens, self.max_context // REPLY_SHARE)
        return max(self.max_context - max(room, 1), 1)

    def stream_chat(
        self, messages: Sequence[Message], controls: Controls, cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        ids, left_out = self.fit(messages, controls)
        stream = self.stream_ids(ids, controls, cancel)
        return stream if left_out is None else _after(left_out, stream)

    def start_chat(
        self, messages: Sequence[Message], controls: Controls, cancel: threading.Event | None = None
    ) -> LocalReply:
        """The reply to ``messages``, one round per ``step()`` (prefilled before returning)."""
        ids, left_out = self.fit(messages, controls)
        return LocalReply(self.start_ids(ids, controls, cancel).generation, left_out)

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
        with self._models_to_myself(), _oom_as_user_error():
            generation = self._decoder.start(
                prompt_ids,
                plan=_PlanReader(self, controls),
                max_new_tokens=controls.max_new_tokens,
                seed=controls.seed,
                cancel=cancel,
            )
            self._active = generation
        return LocalReply(generation)

    def read_ahead(self, messages: Sequence[Message], controls: Controls, cancel: threading.Event) -> None:
        """Have the target (then the draft, if the drafter uses it) read what is settled of the
        next prompt while nobody waits (:mod:`specchat.engine.read_ahead`). Stops within one
        chunk once ``cancel`` is set or a reply starts; does nothing while a reply runs.
        :attr:`last_read_ahead` says what it did (None: nothing, as a reply ran, the prompt
        could not be rendered yet, or it would not fit)."""
        self.last_read_ahead = self._read_ahead(messages, controls, cancel)

    def _read_ahead(
        self, messages: Sequence[Message], controls: Controls, cancel: threading.Event
    ) -> ReadAhead | None:
        with self._reading:
            if self._active is not None and not self._active.done:
                return None
            try:
                ids = settled(self.prompt_ids(messages, thinking=controls.thinking, raw=controls.raw))
            except SpecchatError:  # the reply will say what is wrong, when there is one
                return None
            if self.max_context is not None and len(ids) >= self.max_context:
                return None  # the reply will leave older messages out: another prompt
            models = {"target": self.target}
            if self.draft is not None and drafter_spec(controls.drafter).needs_draft_model:
                models["draft"] = self.draft
            with _oom_as_user_error():
                return read_ahead(models, ids, lambda: cancel.is_set() or self._reply_starts.is_set())

    @contextmanager
    def _models_to_myself(self) -> Iterator[None]:
        """Stop a read-ahead (within one chunk) and keep the models until the block ends."""
        self._reply_starts.set()
        try:
            with self._reading:
                self._reply_starts.clear()
                yield
        finally:
            self._reply_starts.clear()

    def stream_plain(
        self, prompt_ids: list[int], controls: Controls, cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        """The independent target-only reference (benchmarks and exactness checks)."""
        controls.validate()
        return self._while_running(
            _translate_oom(
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
        )

    def _while_running(self, stream: Iterator[Event]) -> Iterator[Event]:
        """``stream``, with no reading ahead until it ends (or is dropped)."""
        running = _Running()
        with self._models_to_myself():
            self._active = running
        try:
            yield from stream
        finally:
            running.done = True

    def close(self) -> None:
        self.target.reset()
        if self.draft is not None:
            self.draft.reset()

    def _check(self, prompt_ids: list[int], controls: Controls) -> None:
        """Fail before any work: bad controls, a missing drafter, a prompt the context cannot hold."""
        controls.validate()
        controls.sampling()
        self.drafter(controls.drafter)
        past = [i for i in prompt_ids if i < 0 or (self.input_rows is not None and i >= self.input_rows)]
        if past:
            raise InvalidSettingError(
                f"the prompt holds token id {past[0]}, and the model has embeddings for ids 0 to "
                f"{(self.input_rows or 1) - 1} only: its tokenizer and its weights disagree"
            )
        if self.max_context is not None and len(prompt_ids) >= self.max_context:
            # Chats have left out every older exchange by now (see fit): only the newest remains.
            raise ContextTooLongError(
                f"the prompt is {len(prompt_ids)} tokens but the context holds {self.max_context}, "
                "even with only the newest message: shorten the message or the system prompt."
            )

    def _detokenizer(self, prompt_ids: list[int]) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.tokenizer, prompt_ids)

    def _token_text(self, token_id: int) -> str:
        text = self.tokenizer.decode(
            [token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        return text if isinstance(text, str) else "".join(text)


class LocalReply:
    """A local reply stepped one round at a time (see :class:`specchat.engine.backend.Reply`)."""

    def __init__(self, generation: Generation, left_out: ContextEvent | None = None) -> None:
        self.generation = generation
        self._first: list[Event] = [left_out] if left_out is not None else []
        """Given with the first round: what the prompt left out."""

    @property
    def done(self) -> bool:
        return self.generation.done

    def step(self) -> list[Event]:
        first, self._first = self._first, []
        with _oom_as_user_error():
            return first + self.generation.step()

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


def _after(first: Event, stream: Iterator[Event]) -> Iterator[Event]:
    yield first
    yield from stream


def _translate_oom(stream: Iterator[Event]) -> Iterator[Event]:
    with _oom_as_user_error():
        yield from stream


@dataclass
class _Running:
    """A plain decoding stream, as :meth:`ChatEngine.read_ahead` sees it."""

    done: bool = False


def _stop_ids(model: EngineModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
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
