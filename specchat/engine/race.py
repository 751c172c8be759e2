"""The race: plain decoding against speculative decoding on the same prompt, measured honestly.

Two cores cannot run two decoders at full speed at once, so :func:`run_race` decodes the lanes
one after the other, each from empty caches, and stamps every token with the seconds since its
lane started (prefill included, as a user waits for it). Front ends then play both lanes back in
sync at their measured pace (:meth:`RaceLane.shown_at`) and must say that it is a replay.

Speeds follow the bench's definition: tokens over the lane's wall time less the target's prompt
prefill, so a speculative lane still pays for prefilling its draft model. The figures come from
the lanes' own events: α and τ from the speculative lane's summary, text identity from token ids.

Imports nothing heavy: the UI reads :class:`RaceResult` without loading torch (the engine is
passed in).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from specchat.engine.compare import first_difference
from specchat.engine.events import (
    TOKEN_KINDS,
    Event,
    RoundEvent,
    SummaryEvent,
    TokenEvent,
    TokenKind,
)

if TYPE_CHECKING:
    from specchat.engine.backend import Controls, LocalBackend, Message


LaneName = Literal["plain", "speculative"]
RACE_FORMAT = 1
"""Version of the race's JSON export."""
RACE_TOKENS = 128
"""Tokens per lane unless the user says otherwise: long enough to settle, short enough for a talk."""
WARM_UP_TOKENS = 4
"""Tokens decoded both ways, untimed, before a race (a fresh process's first passes are slow)."""


@dataclass(frozen=True, slots=True)
class LaneToken:
    """One token of a lane: when it arrived and how it was made."""

    t: float
    """Seconds since the lane started (its prefill included)."""
    text: str
    kind: TokenKind
    token_id: int

    def to_json(self) -> dict[str, object]:
        return {"t": round(self.t, 6), "text": self.text, "kind": self.kind, "id": self.token_id}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LaneToken:
        kind = str(data["kind"])
        if kind not in TOKEN_KINDS:
            raise ValueError(f"unknown token kind {kind!r}")
        return cls(float(data["t"]), str(data["text"]), kind, int(data["id"]))  # type: ignore[arg-type]


@dataclass(frozen=True)
class RaceLane:
    """One measured run: its tokens with arrival times, and the engine's summary of it."""

    name: LaneName
    tokens: tuple[LaneToken, ...]
    wall_s: float
    """Seconds from the lane's start to its end (the step that stopped it included)."""
    summary: SummaryEvent
    rounds: tuple[RoundEvent, ...] = ()
    _times: tuple[float, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_times", tuple(token.t for token in self.tokens))

    @property
    def prefill_s(self) -> float:
        """The target's prompt prefill, as the engine timed it (subtracted from the speed)."""
        return min(self.summary.prefill_ms / 1000.0, self.wall_s)

    @property
    def decode_s(self) -> float:
        return max(self.wall_s - self.prefill_s, 1e-9)

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.decode_s

    @property
    def text(self) -> str:
        return "".join(token.text for token in self.tokens)

    @property
    def token_ids(self) -> list[int]:
        return [token.token_id for token in self.tokens]

    def shown_at(self, t: float) -> int:
        """How many tokens had arrived ``t`` seconds after the lane started."""
        return bisect.bisect_right(self._times, t)

    def rate_at(self, t: float) -> float | None:
        """Tokens per second so far at time ``t`` (None while the prompt is still being read)."""
        t = min(t, self.wall_s)
        if t <= self.prefill_s:
            return None
        return self.shown_at(t) / max(t - self.prefill_s, 1e-9)

    def finished_at(self, t: float) -> bool:
        return t >= self.wall_s

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "wall_s": round(self.wall_s, 6),
            "prefill_s": round(self.prefill_s, 6),
            "tokens_per_s": self.tokens_per_s,
            "tokens": [token.to_json() for token in self.tokens],
            "summary": self.summary.to_json(),
            "rounds": [event.to_json() for event in self.rounds],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RaceLane:
        name = str(data["name"])
        if name not in ("plain", "speculative"):
            raise ValueError(f"unknown lane {name!r}")
        return cls(
            name,  # type: ignore[arg-type]
            tuple(LaneToken.from_json(t) for t in data["tokens"]),
            float(data["wall_s"]),
            SummaryEvent.from_json(data["summary"]),
            tuple(RoundEvent.from_json(r) for r in data.get("rounds") or ()),
        )


@dataclass(frozen=True)
class RaceResult:
    """Both lanes of one race and what they were asked to do."""

    prompt: str
    settings: dict[str, Any]
    """γ, schedule, drafter, temperature, top-k, top-p, max new tokens and seed of the race."""
    plain: RaceLane
    speculative: RaceLane
    models: dict[str, str | None] = field(default_factory=dict)
    """{"target": …, "draft": …} as the front end named them."""
    measured_at: str = ""
    """ISO time the race was run."""

    @property
    def speedup(self) -> float:
        """Speculative tokens/s over plain tokens/s, both measured here."""
        return self.speculative.tokens_per_s / self.plain.tokens_per_s if self.plain.tokens else 0.0

    @property
    def alpha(self) -> float | None:
        return self.speculative.summary.alpha

    @property
    def tau(self) -> float | None:
        return self.speculative.summary.tau

    @property
    def greedy(self) -> bool:
        return float(self.settings.get("temperature", 0.0)) == 0.0

    @property
    def identical(self) -> bool:
        """Whether both lanes produced the same token ids."""
        return self.plain.token_ids == self.speculative.token_ids

    @property
    def first_difference(self) -> int | None:
        """Index of the first token where the lanes differ (None when identical)."""
        return first_difference(self.plain.token_ids, self.speculative.token_ids)

    @property
    def duration_s(self) -> float:
        """How long the replay runs: until the slower lane finished."""
        return max(self.plain.wall_s, self.speculative.wall_s)

    def lane(self, name: LaneName) -> RaceLane:
        return self.plain if name == "plain" else self.speculative

    def to_json(self) -> dict[str, object]:
        return {
            "type": "race",
            "format": RACE_FORMAT,
            "prompt": self.prompt,
            "settings": self.settings,
            "models": self.models,
            "measured_at": self.measured_at,
            "speedup": self.speedup,
            "alpha": self.alpha,
            "tau": self.tau,
            "identical": self.identical,
            "first_difference": self.first_difference,
            "note": "decoded one after the other on this machine; per-token times are seconds "
            "since each lane started (prefill included)",
            "lanes": {"plain": self.plain.to_json(), "speculative": self.speculative.to_json()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RaceResult:
        if data.get("type") != "race":
            raise ValueError("not a specchat race")
        lanes = data["lanes"]
        return cls(
            str(data["prompt"]),
            dict(data.get("settings") or {}),
            RaceLane.from_json(lanes["plain"]),
            RaceLane.from_json(lanes["speculative"]),
            dict(data.get("models") or {}),
            str(data.get("measured_at") or ""),
        )


Progress = Callable[[LaneName, int], None]
"""Called as tokens arrive while measuring: the lane and its token count so far."""


class RaceCancelled(Exception):
    """The race was stopped before both lanes finished."""


def run_race(
    engine: LocalBackend,
    messages: Sequence[Message],
    controls: Controls,
    *,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    warm_up_tokens: int = 0,
    models: dict[str, str | None] | None = None,
) -> RaceResult:
    """Decode ``messages`` plainly, then speculatively with ``controls``, one after the other.

    Each lane starts from empty caches, so neither inherits the other's prefill. ``warm_up_tokens``
    first decodes that many tokens both ways (a fresh process's first passes are slow).
    Raises :class:`RaceCancelled` once ``cancel`` is set.
    """
    controls.validate()
    prompt_ids = engine.prompt_ids(messages)
    if warm_up_tokens > 0:
        warm = replace(controls, max_new_tokens=warm_up_tokens)
        for _ in _lane_events(engine, "plain", prompt_ids, warm, cancel):
            pass
        for _ in _lane_events(engine, "speculative", prompt_ids, warm, cancel):
            pass
    plain = measure_lane(engine, "plain", prompt_ids, controls, progress, cancel)
    speculative = measure_lane(engine, "speculative", prompt_ids, controls, progress, cancel)
    prompt = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    return RaceResult(
        prompt=prompt,
        settings=race_settings(controls),
        plain=plain,
        speculative=speculative,
        models=dict(models or {}),
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )


def race_settings(controls: Controls) -> dict[str, Any]:
    return {
        "gamma": controls.gamma,
        "schedule": controls.schedule,
        "drafter": controls.drafter,
        "temperature": controls.temperature,
        "top_k": controls.top_k,
        "top_p": controls.top_p,
        "max_new_tokens": controls.max_new_tokens,
        "seed": controls.seed,
    }


def measure_lane(
    engine: LocalBackend,
    name: LaneName,
    prompt_ids: list[int],
    controls: Controls,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> RaceLane:
    """One lane from empty caches, every token stamped with the seconds since the lane started."""
    tokens: list[LaneToken] = []
    rounds: list[RoundEvent] = []
    summary: SummaryEvent | None = None
    start = time.perf_counter()
    for event in _lane_events(engine, name, prompt_ids, controls, cancel):
        now = time.perf_counter() - start
        if isinstance(event, TokenEvent):
            tokens.append(LaneToken(now, event.text, event.kind, event.token_id))
            if progress is not None:
                progress(name, len(tokens))
        elif isinstance(event, RoundEvent):
            rounds.append(event)
        elif isinstance(event, SummaryEvent):
            summary = event
    wall = time.perf_counter() - start
    if summary is None or summary.stop == "cancelled":
        raise RaceCancelled(f"the race was stopped while decoding the {name} lane")
    return RaceLane(name, tuple(tokens), wall, summary, tuple(rounds))


def _lane_events(
    engine: LocalBackend,
    name: LaneName,
    prompt_ids: list[int],
    controls: Controls,
    cancel: threading.Event | None,
) -> Iterator[Event]:
    engine.close()  # empty caches: no lane inherits the other's prefill
    if name == "plain":
        return engine.stream_plain(prompt_ids, controls, cancel)
    return engine.stream_ids(prompt_ids, controls, cancel)
