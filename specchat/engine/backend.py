"""The backend interface: what the chat, ``generate`` and the bench drive.

A backend turns a conversation into a stream of engine events (:mod:`specchat.engine.events`).
Two kinds stand behind it: the local engine (:class:`specchat.engine.session.ChatEngine`: torch,
the models on this machine, every figure measured exactly) and remote servers that run
speculative decoding themselves (an OpenAI-compatible HTTP API), which report only part of what
happened. :class:`Capabilities` says which figures a backend measures, which it can only infer,
and which it cannot report, so front ends never show an invented number.

Pure Python (no torch, no textual): front ends import it freely.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from specchat.engine.events import Event, StopReason, SummaryEvent
from specchat.engine.gamma import SCHEDULES, check_gamma
from specchat.engine.registry import DRAFTER_NAMES
from specchat.errors import InvalidSettingError
from specchat.params import DRAFT_WINDOW, SamplingParams, check_sampling

Message = dict[str, str]
"""{"role": "system" | "user" | "assistant", "content": "..."}"""


def chat_messages(system_prompt: str | None, user: str) -> list[Message]:
    """A one-question conversation: the system prompt (when there is one), then the user's text."""
    system: list[Message] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*system, {"role": "user", "content": user}]


RAW_RENDERING = "raw: your text exactly as written, no template and no system prompt, BOS as the file says"
JOINED_RENDERING = (
    "no chat template in this model: the turns are joined by blank lines (--raw: your text exactly)"
)


def rendering(capabilities: Capabilities, controls: Controls | None) -> str | None:
    """How the conversation becomes the prompt, in words, where the user should know: raw mode,
    or a model without a chat template (None: its own chat template, as expected)."""
    if controls is not None and controls.raw:
        return RAW_RENDERING
    if not capabilities.chat_template:
        return JOINED_RENDERING
    return None


Provenance = Literal["exact", "inferred", "none"]
"""How a backend knows each token's kind: measured by our own verification, reconstructed from
counters a server reports, or not at all (tokens stream uncoloured, as plain target tokens)."""
GammaControl = Literal["per-round", "per-request", "fixed", "none"]
"""When a γ change takes effect: from the next round (local), from the next reply (a server
taking it per request), never (fixed when the server started), or γ does not apply."""
Figure = Literal["alpha", "tau", "per_position", "tokens_per_s", "timings", "trace"]
"""Figures a backend may report: α, τ, acceptance per draft position, tokens/s, per-round
draft/verify milliseconds, and the v2 trace (p, q, u, top tokens of every round)."""


@dataclass
class Controls:
    """Settings a user can change while a reply streams; read once per round (or per request)."""

    gamma: int = 4
    schedule: str = "fixed"
    drafter: str = "model"
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    max_new_tokens: int = 512
    seed: int | None = None
    thinking: bool = True
    """Let a thinking model reason before it answers; False asks its template not to, where the
    template has that switch (Qwen3's ``enable_thinking``). Read once per reply."""
    raw: bool = False
    """Feed the conversation's text exactly as written: no chat template, no system prompt, the
    beginning-of-sequence token as the model's file says (base models). Read once per reply."""
    draft_window: int = DRAFT_WINDOW
    """A draft model far behind reads at most the last this many tokens where reading them all
    would not pay (0: always all). Read once per round."""

    def validate(self) -> None:
        check_gamma(self.gamma)
        if self.schedule not in SCHEDULES:
            raise InvalidSettingError(
                f"unknown gamma schedule {self.schedule!r}: use {', '.join(SCHEDULES)}."
            )
        if self.drafter not in DRAFTER_NAMES:
            raise InvalidSettingError(f"unknown drafter {self.drafter!r}: use {', '.join(DRAFTER_NAMES)}.")
        if self.draft_window < 0:
            raise InvalidSettingError(
                f"the draft window must be 0 (none) or more tokens (got {self.draft_window})."
            )
        if self.max_new_tokens < 1:
            raise InvalidSettingError(f"max new tokens must be 1 or more (got {self.max_new_tokens}).")
        check_sampling(self.temperature, self.top_k, self.top_p)

    def sampling(self) -> SamplingParams:
        """The sampling part, for the local engine."""
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do and report; front ends label every figure by it."""

    kind: str
    """"local", "llama-server", "vllm", "openai" …"""
    provenance: Provenance
    measured: frozenset[Figure]
    """Figures counted from what really happened."""
    inferred: frozenset[Figure] = frozenset()
    """Figures reconstructed from coarser counters (say so on screen)."""
    gamma_control: GammaControl = "per-round"
    gamma: int | None = None
    """The γ a server fixed when it started, when it says so or shows it (None: unknown or local)."""
    drafters: tuple[str, ...] = ()
    """Drafters the user may switch between (empty: the backend decides)."""
    stepping: bool = False
    """Whether :meth:`Backend.start_chat` can run a reply one round at a time."""
    notes: tuple[str, ...] = field(default=())
    """Lines for the user about what this backend cannot do (shown in the controls panel)."""
    chat_template: bool = True
    """Whether turns go through a chat template (False: a base model's, joined by blank lines)."""
    thinking_switch: bool = False
    """Whether ``Controls.thinking`` False can turn the model's reasoning off (its template has
    Qwen3's ``enable_thinking``, or a server takes it in ``chat_template_kwargs``)."""
    raw: bool = False
    """Whether ``Controls.raw`` can feed text exactly as written (the local engine)."""

    def reports(self, figure: Figure) -> bool:
        return figure in self.measured or figure in self.inferred

    def source(self, figure: Figure) -> FigureSource:
        """How the figure on screen was obtained: front ends label it with this word."""
        if figure in self.measured:
            return "measured"
        if figure in self.inferred:
            return "inferred"
        return "unavailable"

    def describe(self) -> str:
        """One line for the user: which figures are measured, inferred, or not reported."""
        groups: dict[FigureSource, list[str]] = {"measured": [], "inferred": [], "unavailable": []}
        for figure, name in FIGURE_LABELS.items():
            groups[self.source(figure)].append(name)
        parts = [f"{source}: {', '.join(names)}" for source, names in groups.items() if names]
        return " · ".join(parts).replace("unavailable:", "not reported:")


FigureSource = Literal["measured", "inferred", "unavailable"]
FIGURE_LABELS: dict[Figure, str] = {
    "alpha": "α",
    "tau": "τ",
    "per_position": "per-position acceptance",
    "tokens_per_s": "tok/s",
    "timings": "round timings",
    "trace": "token probabilities",
}
"""Short names of the figures, in the order front ends list them."""


class Reply(Protocol):
    """A reply decoded one round per call (backends with ``capabilities.stepping``)."""

    @property
    def done(self) -> bool: ...

    def step(self) -> list[Event]:
        """Exactly one round's events; the last call also returns the SummaryEvent."""
        ...

    def finish(self, stop: StopReason = "cancelled") -> SummaryEvent:
        """End the reply between rounds."""
        ...


class Backend(Protocol):
    """What the chat, ``generate`` and the bench drive."""

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def available_drafters(self) -> list[str]: ...

    def stream_chat(
        self, messages: Sequence[Message], controls: Controls, cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        """The reply to ``messages`` as events; stops at the next round boundary once ``cancel``
        is set (the stream then ends with a SummaryEvent whose stop is "cancelled")."""
        ...

    def start_chat(
        self, messages: Sequence[Message], controls: Controls, cancel: threading.Event | None = None
    ) -> Reply:
        """The same reply, one round per :meth:`Reply.step` (only with ``capabilities.stepping``)."""
        ...

    def read_ahead(self, messages: Sequence[Message], controls: Controls, cancel: threading.Event) -> None:
        """Read what is known of the next prompt (``messages``: the conversation so far and what
        the user is typing) while nobody waits, so the next reply's first token comes sooner.
        Returns when done, when ``cancel`` is set, or when a reply starts, whichever is first;
        never changes a reply. A backend with nothing to read ahead returns at once."""
        ...

    def close(self) -> None:
        """Release what the backend holds (connections, caches)."""
        ...


@runtime_checkable
class LocalBackend(Backend, Protocol):
    """A backend on local models: what the talk jobs (the race, the self-test) need beyond the
    chat, namely token ids, the independent plain decoder and one token's text. A server client
    has none of it; the engine (:class:`specchat.engine.session.ChatEngine`) has all of it."""

    def prompt_ids(
        self, messages: Sequence[Message], *, thinking: bool = True, raw: bool = False
    ) -> list[int]: ...

    def stream_ids(
        self, prompt_ids: list[int], controls: Controls, cancel: threading.Event | None = None
    ) -> Iterator[Event]: ...

    def start_ids(
        self, prompt_ids: list[int], controls: Controls, cancel: threading.Event | None = None
    ) -> Reply: ...

    def stream_plain(
        self, prompt_ids: list[int], controls: Controls, cancel: threading.Event | None = None
    ) -> Iterator[Event]: ...

    def token_text(self, token_id: int) -> str: ...


class Wrapper(Protocol):
    """A backend that passes another one's events through, holding it as ``backend`` (tests
    retime or pause the engine)."""

    backend: object
