"""What one bench run records (:class:`RunRecord`: the engine's own events and summary, the
bench's clock, a peer's timings), and what is read across runs: the fastest repeat of each
(:func:`fastest`) and the greedy check against plain decoding (:func:`check_greedy`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from specchat.bench.llamacpp_peer import PLAIN_ROW as LLAMA_PLAIN
from specchat.bench.llamacpp_peer import PeerTimings
from specchat.bench.methods import MethodKind
from specchat.engine.compare import first_difference
from specchat.engine.costs import draft_prefill_ms
from specchat.engine.events import RoundEvent, SummaryEvent
from specchat.engine.metrics import positions_tested

TIMING_SLACK_S = 0.002
"""How far one measured duration may fall short of another nested inside it (timer resolution)."""


@dataclass
class RunRecord:
    """One method on one prompt.

    Figures the engine reports (tokens, rounds, α, τ, per-position acceptance, prefill and its own
    decode time) are the engine's SummaryEvent, kept whole; the round-by-round costs are its
    RoundEvents. Nothing here recomputes what the engine already reported.

    Decoding speed divides ``decode_tokens`` by ``decode_wall_s``, a duration measured in this
    very run (see :func:`run_method` for each kind of run); a run whose duration was not
    measured, or is contradicted by a duration measured inside it, gets no speed at all
    (:attr:`timing_problem` says why) rather than a figure made from someone else's clock.
    """

    prompt_id: str
    category: str
    method: str
    kind: MethodKind
    drafter: str
    schedule: str
    gamma: int
    prompt_tokens: int
    tokens: int = 0
    wall_s: float = 0.0
    """The whole reply as the user waits for it, from Enter to its last token: prefill of both
    models plus decoding (:attr:`total_wait_s`)."""
    ttft_s: float | None = None
    """Time to first token: from the start of the run to the first token it produced. Engine
    runs: the bench's clock, from the call to the first TokenEvent the stream yields. Hugging
    Face: the bench's clock, from ``generate``'s start to its first streamed chunk
    (``PeerResult.first_s``). llama.cpp: its own ``prompt_ms`` (prompt processing up to and
    including sampling the first token, by the server's clock: the request is not streamed, so
    the bench never sees the first token arrive; the HTTP round trip is left out). None: no
    token came, or it was not measured."""
    decode_wall_s: float | None = None
    """Decoding time measured in this run: its wall time less its own target prefill (engine runs),
    from its first streamed tokens to its last (Hugging Face), llama.cpp's own generation time
    (llama.cpp). None: not measured."""
    decode_tokens: int = 0
    """The tokens produced inside ``decode_wall_s``."""
    timing_note: str | None = None
    """Why ``decode_wall_s`` could not be measured, when it could not."""
    stop: str = "max_tokens"
    summary: SummaryEvent | None = None
    """The engine's own figures for this reply (None for peers)."""
    peer_timings: PeerTimings | None = None
    """llama.cpp's own figures for this reply (its timings object)."""
    round_events: list[RoundEvent] = field(default_factory=list)
    """Every round the engine reported, in order."""
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    matches_plain: bool | None = None
    """Greedy runs: the reply's token ids equal plain decoding's (None when not checked)."""
    first_mismatch: int | None = None
    reference: str = "plain"
    """What the greedy check compared with."""
    repeat: int = 0

    # ---------------------------------------------------------------- the engine's figures
    @property
    def rounds(self) -> int:
        return self.summary.rounds if self.summary else 0

    @property
    def drafted(self) -> int:
        return self.summary.drafted if self.summary else 0

    @property
    def accepted(self) -> int:
        return self.summary.accepted if self.summary else 0

    @property
    def alpha(self) -> float | None:
        """accepted / drafted, as the engine (or llama.cpp) reported it."""
        if self.summary is not None:
            return self.summary.alpha
        peer = self.peer_timings
        if peer is not None and peer.draft_n:
            return (peer.draft_n_accepted or 0) / peer.draft_n
        return None

    @property
    def tau(self) -> float | None:
        """Tokens per round, as the engine reported it."""
        return self.summary.tau if self.summary else None

    @property
    def prefill_ms(self) -> float | None:
        """The target's prompt prefill in this run, as the engine measured it (SummaryEvent's
        ``prefill_ms``), or llama.cpp its ``prompt_ms``; None for Hugging Face, whose prefill is
        not separable from its first step."""
        if self.summary is not None:
            return self.summary.prefill_ms
        return self.peer_timings.prompt_ms if self.peer_timings is not None else None

    @property
    def draft_prefill_ms(self) -> float | None:
        """The draft model's catch-up in this run (the prompt at its first draft, the tokens of
        lookup and plain rounds since), estimated from the engine's rounds by
        :func:`~specchat.engine.metrics.draft_prefill_ms`; 0 for plain decoding; None for the
        peers, which report no rounds."""
        if self.kind in ("hf", "llamacpp"):
            return None
        return draft_prefill_ms(self.round_events)

    @property
    def total_wait_s(self) -> float:
        """What the user waits for: from Enter to the last token (the run's whole wall time)."""
        return self.wall_s

    def wait_for(self, tokens: int) -> float:
        """The wait for a reply of ``tokens`` tokens at this run's pace: its own total wait when
        it made that many (greedy runs make plain decoding's text), else its time to first token
        plus ``tokens − 1`` times its time per later token. Sampled replies (T > 0) of two
        methods differ in length, and a longer one is a longer wait, not a slower method."""
        if tokens == self.tokens or self.ttft_s is None or self.tokens < 2:
            return self.total_wait_s
        per_token = (self.wall_s - self.ttft_s) / (self.tokens - 1)
        return self.ttft_s + max(tokens - 1, 0) * per_token

    @property
    def engine_tok_s(self) -> float | None:
        """The engine's own tokens/s (its decode loop only: the draft's prefill excluded)."""
        return self.summary.tokens_per_s if self.summary else None

    @property
    def tested(self) -> int:
        """Draft positions verification looked at (up to and including each round's first rejection)."""
        return sum(positions_tested(e) for e in self.round_events if e.drafted)

    @property
    def drafted_hist(self) -> dict[int, int]:
        """Tokens drafted in a round → how many rounds drafted that many (0: plain rounds)."""
        return dict(Counter(e.drafted for e in self.round_events))

    @property
    def alpha_iid(self) -> float | None:
        """accepted / tested: the per-position acceptance the formula E[T](α, γ) assumes."""
        return self.accepted / self.tested if self.tested else None

    @property
    def mean_gamma(self) -> float | None:
        return self.drafted / self.rounds if self.rounds else None

    # ---------------------------------------------------------------- speed
    @property
    def timing_problem(self) -> str | None:
        """Why this run's decoding speed cannot be given, or None when it can."""
        if self.decode_wall_s is None:
            return self.timing_note or "its decoding time was not measured"
        if self.decode_tokens > 0 and self.decode_wall_s <= 0.0:
            return f"{self.decode_tokens} tokens decoded in {self.decode_wall_s:.6f} s is not a duration"
        inside = self.decode_wall_s
        if self.peer_timings is not None:
            inside = (self.peer_timings.prompt_ms + self.peer_timings.predicted_ms) / 1000.0
        if inside > self.wall_s + TIMING_SLACK_S:
            return (
                f"it reports {inside:.3f} s of work inside a run that took {self.wall_s:.3f} s "
                "by the bench's clock"
            )
        inner = self.summary.decode_s if self.summary else None
        if inner is not None and self.decode_wall_s < inner - TIMING_SLACK_S:
            return (
                f"its decoding time ({self.decode_wall_s:.3f} s) is shorter than the engine's own decode "
                f"loop inside it ({inner:.3f} s): the two were not measured on one clock"
            )
        return None

    @property
    def tok_s(self) -> float | None:
        """Decoding speed: ``decode_tokens / decode_wall_s``; None when the duration is unusable."""
        if self.timing_problem is not None or self.decode_wall_s is None:
            return None
        return self.decode_tokens / self.decode_wall_s if self.decode_wall_s > 0 else 0.0

    @property
    def e2e_tok_s(self) -> float | None:
        """Tokens over the whole wall time, prefill included."""
        return self.tokens / self.wall_s if self.wall_s > 0 else None

    def describe(self) -> str:
        """The run in words, for messages: method, prompt and repeat."""
        return f"{self.method} on {self.prompt_id} (repeat {self.repeat})"

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["drafted_hist"] = {str(k): v for k, v in sorted(self.drafted_hist.items())}
        data["round_events"] = [e.to_json() for e in self.round_events]
        data["summary"] = self.summary.to_json() if self.summary else None
        data["peer_timings"] = self.peer_timings.to_json() if self.peer_timings else None
        data.update(
            tok_s=self.tok_s,
            timing_problem=self.timing_problem,
            e2e_tok_s=self.e2e_tok_s,
            engine_tok_s=self.engine_tok_s,
            target_prefill_ms=self.prefill_ms,
            draft_prefill_ms=self.draft_prefill_ms,
            total_wait_s=self.total_wait_s,
            rounds=self.rounds,
            drafted=self.drafted,
            accepted=self.accepted,
            tested=self.tested,
            alpha=self.alpha,
            alpha_iid=self.alpha_iid,
            tau=self.tau,
            mean_gamma=self.mean_gamma,
        )
        return data


def fastest(records: Sequence[RunRecord]) -> list[RunRecord]:
    """One record per (prompt, method): the repeat with the highest decoding speed.

    A repeat without a usable speed is kept only when no repeat has one, so that the report
    refuses that figure instead of silently dropping the prompt.
    """
    best: dict[tuple[str, str], RunRecord] = {}
    for record in records:
        key = (record.prompt_id, record.method)
        if key not in best or _faster(record, best[key]):
            best[key] = record
    return list(best.values())


def _faster(record: RunRecord, than: RunRecord) -> bool:
    if record.tok_s is None:
        return False
    return than.tok_s is None or record.tok_s > than.tok_s


def check_greedy(records: Iterable[RunRecord]) -> None:
    """Mark every record whose token ids differ from plain decoding's on the same prompt.

    specchat's methods compare with specchat's plain loop. Hugging Face's assisted runs compare
    with Hugging Face's own plain ``generate`` when it ran (its forward may round differently
    from specchat's, e.g. where a prompt's last token is computed), else with specchat's plain.
    llama.cpp's speculative runs compare with llama.cpp's plain runs (its kernels compute a
    different approximation of the model than specchat's, so its plain text differs from ours
    sooner or later; that comparison is reported too).
    """
    records = list(records)
    plain = {r.prompt_id: r.token_ids for r in records if r.kind == "plain"}
    own_plain = {
        kind: {r.prompt_id: r.token_ids for r in records if r.method == name}
        for kind, name in (("hf", "hf-plain"), ("llamacpp", LLAMA_PLAIN))
    }
    for record in records:
        reference = plain.get(record.prompt_id)
        peers = own_plain.get(record.kind, {})
        if record.method not in ("hf-plain", LLAMA_PLAIN) and record.prompt_id in peers:
            reference = peers[record.prompt_id]
            record.reference = "hf-plain" if record.kind == "hf" else LLAMA_PLAIN
        if reference is None:
            continue
        record.first_mismatch = first_difference(record.token_ids, reference)
        record.matches_plain = record.first_mismatch is None
