"""RemoteBackend: a speculative-decoding server behind the :class:`specchat.engine.backend.Backend` interface.

One reply is one streamed ``POST /v1/chat/completions``. What the server streams becomes the
engine's events through a reader from :mod:`specchat.remote.rounds`, chosen by server kind;
the reply ends with a SummaryEvent like the local engine's. A cut stream raises ServerError
after every event that did arrive, so front ends keep the partial reply.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from specchat.engine.backend import Capabilities, Controls, Figure, GammaControl, Message
from specchat.engine.events import UNKNOWN_ID, Event, RoundEvent, StopReason, SummaryEvent
from specchat.engine.metrics import StreamStats
from specchat.engine.registry import proposes
from specchat.errors import InvalidSettingError, SpecchatError
from specchat.remote.client import DEFAULT_TIMEOUT, DOCUMENT_DEADLINE, ServerClient, api_key_from_env
from specchat.remote.probe import ServerInfo, SpecCounters, probe, read_vllm_counters
from specchat.remote.reply_stream import HEARTBEAT_S, Reader, ReplyStream
from specchat.remote.rounds import CounterRounds, PlainTokens, StepRounds
from specchat.remote.server_errors import ServerError

CHAT_PATH = "/v1/chat/completions"
TEMPLATE_KWARGS = frozenset({"llama-server", "vllm"})
"""Servers that pass ``chat_template_kwargs`` to the model's template (enable_thinking)."""
STOPS: dict[str, StopReason] = {"stop": "eos", "length": "max_tokens", "eos": "eos"}


def connect(
    url: str, *, timeout: float = DEFAULT_TIMEOUT, verify: bool = True, transport: Any = None
) -> RemoteBackend:
    """Probe the server at ``url`` and return a backend for it (ServerError when it cannot)."""
    client = ServerClient(
        url, api_key=api_key_from_env(), timeout=timeout, verify=verify, transport=transport
    )
    try:
        with client.deadline(DOCUMENT_DEADLINE, "to say what it is (its /v1/models, /props, /slots)"):
            info = probe(client)
    except BaseException:
        client.close()
        raise
    return RemoteBackend(client, info)


class RemoteBackend:
    """A server that runs speculative decoding itself; see :mod:`specchat.remote`."""

    def __init__(self, client: ServerClient, info: ServerInfo) -> None:
        self.client = client
        self.info = info
        self.gamma_honoured: bool | None = None
        """llama-server: whether it drafted within the γ we asked for (None: not seen yet)."""
        self.server_gamma: int | None = info.gamma
        """Most drafts seen in a round (llama-server), or vLLM's num_speculative_tokens."""
        self._use_logprobs = info.kind == "vllm"
        self.notes: list[str] = list(info.notes)
        """Lines for the user about this server (shown once, and in the controls panel)."""

    # ------------------------------------------------------------------ interface

    @property
    def capabilities(self) -> Capabilities:
        kind = self.info.kind
        measured: set[Figure] = {"tokens_per_s"}
        inferred: set[Figure] = set()
        provenance: Any = "none"
        gamma_control: GammaControl = "none"
        if kind == "llama-server":
            provenance = "inferred"
            measured.add("alpha")  # the server's own draft counters, summed exactly
            inferred.update({"tau", "per_position"})  # round boundaries are reconstructed
            gamma_control = "fixed" if self.gamma_honoured is False else "per-request"
        elif kind == "vllm" and self.info.speculative:
            provenance = "inferred"
            inferred.update({"alpha", "tau", "per_position"})
            gamma_control = "fixed"
        elif kind == "vllm":
            provenance = "inferred"
        return Capabilities(
            kind=kind,
            provenance=provenance,
            measured=frozenset(measured),
            inferred=frozenset(inferred),
            gamma_control=gamma_control,
            gamma=self.server_gamma if gamma_control == "fixed" else None,
            drafters=(),
            stepping=True,
            notes=tuple(self._control_notes()),
            thinking_switch=kind in TEMPLATE_KWARGS,
        )

    @property
    def available_drafters(self) -> list[str]:
        return []  # the server chose its drafter when it started

    @property
    def label(self) -> str:
        return self.info.label

    def stream_chat(
        self, messages: Sequence[Message], controls: Controls, cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        if controls.raw:
            raise InvalidSettingError(
                "raw mode feeds text to the local engine only: a server renders the prompt with its "
                "own template (turn raw off, or run the model here without --server)."
            )
        return self._stream(list(messages), controls, cancel)

    def start_chat(
        self, messages: Sequence[Message], controls: Controls, cancel: threading.Event | None = None
    ) -> RemoteReply:
        rounds = self.capabilities.provenance != "none"
        return RemoteReply(self.stream_chat(messages, controls, cancel), cancel, rounds)

    def read_ahead(self, messages: Sequence[Message], controls: Controls, cancel: threading.Event) -> None:
        """Nothing: a server reads the prompt itself, when it arrives (its own prefix cache)."""

    def close(self) -> None:
        self.client.close()

    # -------------------------------------------------------------------- a reply

    def request_body(self, messages: list[Message], controls: Controls) -> dict[str, Any]:
        body: dict[str, Any] = {
            "messages": messages,
            "stream": True,
            "max_tokens": controls.max_new_tokens,
            "temperature": controls.temperature,
            "top_p": controls.top_p,
        }
        if self.info.model:
            body["model"] = self.info.model
        if controls.top_k is not None:
            body["top_k"] = controls.top_k
        if controls.seed is not None:
            body["seed"] = controls.seed
        kind = self.info.kind
        if not controls.thinking and kind in TEMPLATE_KWARGS:
            body["chat_template_kwargs"] = {"enable_thinking": False}
        if kind == "llama-server":
            body["timings_per_token"] = True  # running draft_n / draft_n_accepted in every chunk
            body["speculative.n_max"] = 0 if not proposes(controls.drafter) else controls.gamma
            body["speculative.n_min"] = 0
        elif kind == "vllm":
            # Continuous usage stats count every chunk's tokens exactly: one chunk is one step.
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
            if self._use_logprobs:
                body["logprobs"] = True  # each token's own text, to colour a step token by token
        else:
            body["stream_options"] = {"include_usage": True}
        return body

    def _stream(
        self, messages: list[Message], controls: Controls, cancel: threading.Event | None
    ) -> Iterator[Event]:
        before = read_vllm_counters(self.client) if self._vllm_speculative else None
        try:
            yield from self._stream_once(messages, controls, cancel, before)
        except _RetryWithoutLogprobs:
            self._use_logprobs = False
            yield from self._stream_once(messages, controls, cancel, before)

    @property
    def _vllm_speculative(self) -> bool:
        return self.info.kind == "vllm" and bool(self.info.speculative)

    def _reader(self) -> Reader:
        if self.info.kind == "llama-server":
            return CounterRounds()
        if self.info.kind == "vllm":
            return StepRounds(self.info.gamma or 0 if self.info.speculative else 0)
        return PlainTokens()

    def _stream_once(
        self,
        messages: list[Message],
        controls: Controls,
        cancel: threading.Event | None,
        before: SpecCounters | None,
    ) -> Iterator[Event]:
        body = self.request_body(messages, controls)
        reply = ReplyStream(
            self._reader(), self.info.kind, self.client.url, controls.max_new_tokens, self.client.timeout
        )
        try:
            for data in self.client.stream_events(CHAT_PATH, body, cancel, heartbeat=HEARTBEAT_S):
                yield from reply.take(data)
                if reply.overrun:
                    break  # leaving the stream closes the connection
        except ServerError as err:
            if self._use_logprobs and not reply.started and "logprob" in str(err).lower():
                raise _RetryWithoutLogprobs from err
            yield from reply.end()
            if reply.started:
                raise ServerError(
                    f"{err} The reply was cut after {reply.stats.tokens} tokens; what arrived is kept."
                ) from err
            raise
        if reply.untimed:
            self._note("this llama-server sent no timings_per_token: its rounds cannot be rebuilt.")
        cancelled = cancel is not None and cancel.is_set()
        yield from reply.end()
        if reply.finish is None and not cancelled:
            raise ServerError(
                f"the server at {self.client.url} ended the stream mid-reply (after {reply.stats.tokens} "
                "tokens, no finish reason); what arrived is kept."
            )
        self._learn_gamma(reply.reader, controls)
        decode_s, notices = reply.server_decode_s()
        yield from notices
        yield self._summary(reply, decode_s, cancelled, before)

    def _note(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)

    def _learn_gamma(self, reader: Any, controls: Controls) -> None:
        """llama-server: did it draft within the γ we asked? More drafts than asked means no."""
        if not isinstance(reader, CounterRounds) or reader.max_drafted == 0:
            return
        self.server_gamma = max(self.server_gamma or 0, reader.max_drafted)
        if reader.max_drafted > controls.gamma:
            self.gamma_honoured = False
        elif reader.max_drafted == controls.gamma and self.gamma_honoured is None:
            self.gamma_honoured = None  # consistent, not proof: the server's own γ may equal ours

    def _summary(
        self, reply: ReplyStream, server_decode_s: float | None, cancelled: bool, before: SpecCounters | None
    ) -> SummaryEvent:
        stop: StopReason = "cancelled" if cancelled else STOPS.get(reply.finish or "", "eos")
        timings = reply.last.get("timings") or {}
        usage = reply.last.get("usage") or {}
        stats, timing = reply.stats, reply.timing
        if server_decode_s is not None:
            decode_s = server_decode_s  # the server's own clock
            prefill_ms = float(timings.get("prompt_ms", 0.0))
        else:
            first, end = timing.first_token, timing.last_token
            decode_s = (end - first) if first is not None and end is not None else 0.0
            prefill_ms = ((first - timing.started) * 1000.0) if first is not None else 0.0
        prompt_tokens = UNKNOWN_ID
        if "prompt_n" in timings:
            prompt_tokens = int(timings["prompt_n"]) + int(timings.get("cache_n", 0))
        elif "prompt_tokens" in usage:
            prompt_tokens = int(usage["prompt_tokens"])
        summary = stats.summary(stop, prefill_ms=prefill_ms, decode_s=decode_s, prompt_tokens=prompt_tokens)
        if server_decode_s is None and decode_s > 0:
            # Client clocks start at the first token, so count the tokens after it.
            summary = replace(summary, tokens_per_s=max(0, stats.tokens - timing.tokens_at_first) / decode_s)
        if before is not None:
            summary = self._with_server_counters(summary, before, stats)
        return summary

    def _with_server_counters(
        self, summary: SummaryEvent, before: SpecCounters, stats: StreamStats
    ) -> SummaryEvent:
        """vLLM: this reply's acceptance per position from the server's own counters."""
        after = read_vllm_counters(self.client)
        if after is None:
            return summary
        delta = after.minus(before)
        if delta.drafts <= 0:
            return summary
        if round(delta.drafts) != sum(1 for r in stats.round_events if r.drafted):
            note = (
                "vLLM's counters moved by more than this reply's steps (other requests on the server?): "
                "per-position acceptance in the reply summary covers them too."
            )
            if note not in self.notes:
                self.notes.append(note)
        alpha = delta.accepted / delta.draft_tokens if delta.draft_tokens > 0 else summary.alpha
        return replace(summary, alpha=alpha, per_position=delta.conditional_per_position())

    def _control_notes(self) -> list[str]:
        notes = list(self.notes)
        kind = self.info.kind
        if kind == "llama-server" and self.gamma_honoured is False:
            notes.append(
                f"this llama-server ignores the per-request speculative.n_max: it drafts up to "
                f"{self.server_gamma} tokens a round, set when it started (--spec-draft-n-max)."
            )
        elif kind == "llama-server":
            notes.append("γ is sent with each request (speculative.n_max): it applies from the next reply.")
        elif kind == "vllm" and self.info.speculative:
            notes.append(
                f"vLLM fixes γ when it starts (num_speculative_tokens = {self.info.gamma}): "
                "γ keys change nothing here."
            )
        return notes


class _RetryWithoutLogprobs(Exception):
    """The server refused logprobs (some vLLM versions do with speculative decoding)."""


class RemoteReply:
    """A remote reply stepped one round at a time (it streams regardless; steps just group it).

    A server that reports no rounds (a plain OpenAI-compatible one) has nothing to group tokens
    by: each step is the next token, so the chat shows them as they arrive. A stream that breaks
    mid-step hands over what arrived before the error, which the next step raises.
    """

    def __init__(self, stream: Iterator[Event], cancel: threading.Event | None, rounds: bool = True) -> None:
        self._stream = stream
        self._cancel = cancel
        self._rounds = rounds
        self._error: SpecchatError | None = None
        self.done = False
        self.summary: SummaryEvent | None = None

    def step(self) -> list[Event]:
        if self._error is not None:
            error, self._error = self._error, None
            self.done = True
            raise error
        out: list[Event] = []
        try:
            for event in self._stream:
                out.append(event)
                if isinstance(event, SummaryEvent):
                    self.done = True
                    self.summary = event
                    return out
                if isinstance(event, RoundEvent) or not self._rounds:
                    return out
        except SpecchatError as err:
            if not out:
                self.done = True
                raise
            self._error = err  # raised by the next step, after these events are shown
            return out
        self.done = True
        return out

    def finish(self, stop: StopReason = "cancelled") -> SummaryEvent:
        if self._cancel is not None:
            self._cancel.set()
        while not self.done:
            self.step()
        assert self.summary is not None
        return self.summary
