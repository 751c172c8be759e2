"""Find out what kind of server answers at a URL, and what it can report.

Signs, cheapest first: ``/v1/models`` (``owned_by`` is "llamacpp" for llama-server, "vllm" for
vLLM), then the kind's own endpoints: llama-server's ``/props`` and ``/slots`` (whether its
slots speculate), vLLM's Prometheus ``/metrics`` (speculative-decoding counters exist only when
it was started with a ``speculative_config``; one per-position counter per drafted position,
so their count is γ).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client.parser import text_string_to_metric_families

from specchat.remote.client import ServerClient
from specchat.remote.rounds import MAX_ROUND_DRAFTS
from specchat.remote.server_errors import ServerError
from specchat.untrusted import server_text

ServerKind = Literal["llama-server", "vllm", "openai"]

VLLM_DRAFTS = "vllm:spec_decode_num_drafts"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
VLLM_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
MAX_COUNTER = 1e15
"""A counter larger than this is not a count of tokens."""
MODEL_ID_SHOWN = 120
"""Characters of a model id shown (ids are short; a longer one is the server's mistake)."""


@dataclass
class ServerInfo:
    url: str
    kind: ServerKind
    model: str | None
    speculative: bool | None
    """Whether the server drafts at all (None: cannot tell before a reply)."""
    gamma: int | None = None
    """Drafts per round when the server says so (vLLM's num_speculative_tokens)."""
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """How the CLI and the TUI name the server. ``model`` stays as the server spelled it (it is
        sent back with each request); what is shown is masked, clipped and made visible."""
        model = f" · {server_text(self.model, MODEL_ID_SHOWN)}" if self.model else ""
        return f"{self.kind} at {self.url}{model}"


@dataclass(frozen=True)
class SpecCounters:
    """vLLM's speculative-decoding counters, summed over its engines."""

    drafts: float
    draft_tokens: float
    accepted: float
    per_position: tuple[float, ...]

    def minus(self, before: SpecCounters) -> SpecCounters:
        positions = tuple(
            a - b
            for a, b in zip(
                self.per_position, before.per_position + (0.0,) * len(self.per_position), strict=False
            )
        )
        return SpecCounters(
            self.drafts - before.drafts,
            self.draft_tokens - before.draft_tokens,
            self.accepted - before.accepted,
            positions,
        )

    def conditional_per_position(self) -> tuple[float | None, ...]:
        """Acceptance at position i given the round reached it (specchat's definition): vLLM counts
        acceptances at i over all drafts; a round reaches i when it accepted i − 1 first."""
        out: list[float | None] = []
        reached = self.drafts
        for accepted_here in self.per_position:
            out.append(accepted_here / reached if reached > 0 else None)
            reached = accepted_here
        return tuple(out)


def probe(client: ServerClient) -> ServerInfo:
    """Ask the server what it is. Raises ServerError when nothing OpenAI-compatible answers."""
    models = client.get_json("/v1/models")
    if models is None:
        raise ServerError(
            f"{client.url} has no /v1/models endpoint: is it an OpenAI-compatible server "
            "(llama-server, vLLM, …)?"
        )
    entries = models.get("data") if isinstance(models, dict) else None
    first: dict[str, Any] = (
        entries[0] if isinstance(entries, list) and entries and isinstance(entries[0], dict) else {}
    )
    model = first.get("id") if isinstance(first.get("id"), str) else None
    owner = str(first.get("owned_by", "")).lower()
    if owner == "llamacpp" or _is_llama_server(client):
        return _llama_server(client, model)
    if owner == "vllm":
        return _vllm(client, model)
    return ServerInfo(
        client.url,
        "openai",
        model,
        None,
        notes=["this server does not report speculative decoding: tokens stream uncoloured."],
    )


def _is_llama_server(client: ServerClient) -> bool:
    props = client.get_json("/props")
    return isinstance(props, dict) and "default_generation_settings" in props


def _llama_server(client: ServerClient, model: str | None) -> ServerInfo:
    info = ServerInfo(client.url, "llama-server", _short_model(model), None)
    slots = client.get_json("/slots")
    if isinstance(slots, list) and slots and isinstance(slots[0], dict) and "speculative" in slots[0]:
        info.speculative = bool(slots[0]["speculative"])
    if info.speculative is False:
        info.notes.append(
            "this llama-server runs no speculative decoding (start it with --model-draft FILE "
            "--spec-type draft-simple): every token is a plain target token."
        )
    return info


def _vllm(client: ServerClient, model: str | None) -> ServerInfo:
    info = ServerInfo(client.url, "vllm", model, None)
    counters = read_vllm_counters(client)
    if counters is None:
        info.speculative = False
        info.notes.append(
            "this vLLM server reports no speculative decoding (start it with --speculative-config): "
            "every token is a plain target token."
        )
    else:
        info.speculative = True
        info.gamma = len(counters.per_position) or None
    return info


def read_vllm_counters(client: ServerClient) -> SpecCounters | None:
    """The spec-decode counters from /metrics, or None (no /metrics, or no speculation)."""
    text = client.get_text("/metrics")
    return parse_vllm_counters(text) if text else None


def parse_vllm_counters(text: str) -> SpecCounters | None:
    """The counters in a Prometheus text, or None. A sample that is not a finite, non-negative
    number, or a position label that is not a whole number below ``MAX_ROUND_DRAFTS`` (the most
    drafts a rebuilt round holds), is left out: positions become a tuple that long."""
    totals: dict[str, float] = {}
    positions: dict[int, float] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError):
        return None
    for family in families:
        for sample in family.samples:
            if not (math.isfinite(sample.value) and 0 <= sample.value <= MAX_COUNTER):
                continue
            name = sample.name.removesuffix("_total")
            if name == VLLM_PER_POS:
                position = _position(sample.labels.get("position", "0"))
                if position is not None:
                    positions[position] = positions.get(position, 0.0) + sample.value
            elif name in (VLLM_DRAFTS, VLLM_DRAFT_TOKENS, VLLM_ACCEPTED):
                totals[name] = totals.get(name, 0.0) + sample.value
    if VLLM_DRAFTS not in totals:
        return None
    per_position = tuple(positions.get(i, 0.0) for i in range(max(positions, default=-1) + 1))
    return SpecCounters(
        totals.get(VLLM_DRAFTS, 0.0),
        totals.get(VLLM_DRAFT_TOKENS, 0.0),
        totals.get(VLLM_ACCEPTED, 0.0),
        per_position,
    )


def _position(label: str) -> int | None:
    """A position label as a number, if it is a short one in range (int() refuses 4,300 digits)."""
    return (
        int(label)
        if label.isascii() and label.isdigit() and len(label) <= 6 and int(label) < MAX_ROUND_DRAFTS
        else None
    )


def _short_model(model: str | None) -> str | None:
    """llama-server names its model by file path; the file name is enough on screen."""
    if model is None:
        return None
    return model.rsplit("/", 1)[-1]
