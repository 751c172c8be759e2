"""Every method on every prompt, interleaved, with the models loaded once: one record per run.

Methods per prompt: plain decoding (the engine's independent target-only loop), specchat
speculative decoding with a fixed γ sweep, the heuristic and adaptive schedules, the n-gram and
hybrid drafters, and the peers: Hugging Face ``generate`` (plain and assisted) and, when given,
llama.cpp's server (plain and speculative). The order rotates from prompt to prompt so that slow
drift on the machine does not favour one method. Every run starts from empty caches: no method
inherits another's prefill.
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from specchat.bench.hf_peer import hf_generate
from specchat.bench.llamacpp_peer import PLAIN_ROW as LLAMA_PLAIN
from specchat.bench.llamacpp_peer import SPECULATIVE_ROW as LLAMA_SPECULATIVE
from specchat.bench.llamacpp_peer import LlamaCppPeer, PeerTimings
from specchat.bench.prompts import BenchPrompt
from specchat.engine.backend import Controls
from specchat.engine.compare import first_difference
from specchat.engine.events import RoundEvent, SummaryEvent, TokenEvent
from specchat.engine.gamma import positions_tested
from specchat.engine.metrics import draft_prefill_ms
from specchat.engine.registry import drafters, find_drafter
from specchat.engine.sampling import SamplingParams
from specchat.engine.session import ChatEngine
from specchat.params import DRAFT_WINDOW

MethodKind = Literal["plain", "specchat", "hf", "llamacpp"]


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    kind: MethodKind
    drafter: str = "none"
    """specchat: a drafter name or "none"; hf: "model" (assisted) or "none" (plain generate);
    llamacpp: "model" (its speculative server) or "none" (its plain one)."""
    schedule: str = "fixed"
    gamma: int = 0
    """Fixed γ, the starting γ of a schedule, or HF's num_assistant_tokens (0 = transformers' defaults)."""

    @property
    def sweep_gamma(self) -> int | None:
        """γ of specchat's fixed-γ run with a draft model (the points of the γ sweep), else None.

        Peers' speculative rows draft a fixed γ too, but they are lines of their own, not points
        of specchat's curve."""
        if self.kind != "specchat" or self.schedule != "fixed" or self.gamma <= 0:
            return None
        spec = find_drafter(self.drafter)
        if spec is not None and spec.bench == "sweep":
            return self.gamma
        return None

    @property
    def speculative(self) -> bool:
        return self.drafter != "none"


PLAIN = Method("plain", "plain")


def build_methods(
    gammas: Sequence[int],
    *,
    start_gamma: int = 4,
    ngram_gamma: int = 4,
    schedules: Sequence[str] = ("heuristic", "adaptive"),
    hf_gammas: Sequence[int] = (),
    hf_plain: bool = False,
    hf_default: bool = False,
    has_draft: bool = True,
    hybrid: bool = True,
    llama_cpp_draft_max: int | None = None,
) -> list[Method]:
    """Every method of a bench run, one or more per drafter of the registry (in its order);
    ``llama_cpp_draft_max`` (its --spec-draft-n-max) adds llama.cpp's rows.

    ``ngram_gamma`` (the CLI's --ngram-gamma) is the γ of every lookup drafter's row, and
    ``hybrid`` keeps the rows of combined drafters; both read the registry's ``kind``."""
    methods = [PLAIN]
    for spec in drafters():
        if spec.needs_draft_model and not has_draft:
            continue
        if spec.bench == "sweep":
            methods += [Method(f"fixed-{g}", "specchat", spec.name, "fixed", g) for g in gammas]
            methods += [Method(s, "specchat", spec.name, s, start_gamma) for s in schedules]
        elif spec.bench == "row" and (hybrid or spec.kind != "combined"):
            gamma = ngram_gamma if spec.is_lookup else start_gamma
            methods.append(Method(spec.name, "specchat", spec.name, spec.bench_schedule, gamma))
    if hf_plain:
        methods.append(Method("hf-plain", "hf"))
    if has_draft:
        methods += [Method(f"hf-assisted-{g}", "hf", "model", "constant", g) for g in hf_gammas]
        if hf_default:
            methods.append(Method("hf-assisted-default", "hf", "model", "default", 0))
    if llama_cpp_draft_max is not None:
        methods.append(Method(LLAMA_PLAIN, "llamacpp"))
        if has_draft:
            methods.append(Method(LLAMA_SPECULATIVE, "llamacpp", "model", "fixed", llama_cpp_draft_max))
    return methods


@dataclass(frozen=True, slots=True)
class BenchSettings:
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    seed: int | None = 0
    draft_window: int = DRAFT_WINDOW
    """The draft's window (Controls.draft_window; 0: none)."""

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


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


Peer = tuple[Any, Any]
"""(target, draft-or-None): the Hugging Face models ``generate`` runs on (the engine's by default)."""


def run_method(
    engine: ChatEngine,
    prompt: BenchPrompt,
    prompt_ids: list[int],
    method: Method,
    settings: BenchSettings,
    peer: Peer | None = None,
    llama: LlamaCppPeer | None = None,
) -> RunRecord:
    """Run one method on one prompt from empty caches."""
    engine.target.reset()
    if engine.draft is not None:
        engine.draft.reset()
    gc.collect()
    record = RunRecord(
        prompt.id, prompt.category, method.name, method.kind, method.drafter, method.schedule,
        method.gamma, len(prompt_ids),
    )  # fmt: skip
    if method.kind == "hf":
        _run_hf(record, engine, prompt_ids, method, settings, peer)
    elif method.kind == "llamacpp":
        if llama is None:
            raise ValueError(f"{method.name} needs the llama.cpp servers")
        _run_llamacpp(record, llama, prompt_ids, method, settings)
    else:
        _run_engine(record, engine, prompt_ids, method, settings)
    return record


def _run_engine(
    record: RunRecord, engine: ChatEngine, prompt_ids: list[int], method: Method, settings: BenchSettings
) -> None:
    """specchat's loops: decoding time is this run's wall time less this run's target prefill.

    The draft's prefill stays inside it: it is a cost speculation pays and plain decoding does not.
    The time to first token is the same clock read at the first TokenEvent the stream yields.
    """
    controls = Controls(
        gamma=max(method.gamma, 1),
        schedule=method.schedule,
        drafter=method.drafter,
        temperature=settings.temperature,
        top_k=settings.top_k,
        top_p=settings.top_p,
        max_new_tokens=settings.max_new_tokens,
        seed=settings.seed,
        draft_window=settings.draft_window,
    )
    start = time.perf_counter()
    stream = (
        engine.stream_plain(prompt_ids, controls)
        if method.kind == "plain"
        else engine.stream_ids(prompt_ids, controls)
    )
    pieces: list[str] = []
    for event in stream:
        if isinstance(event, TokenEvent):
            if record.ttft_s is None:
                record.ttft_s = time.perf_counter() - start
            record.token_ids.append(event.token_id)
            pieces.append(event.text)
        elif isinstance(event, RoundEvent):
            record.round_events.append(event)
        elif isinstance(event, SummaryEvent):
            record.summary = event
    record.wall_s = time.perf_counter() - start
    record.text = "".join(pieces)
    record.tokens = len(record.token_ids)
    summary = record.summary
    if summary is None:
        record.timing_note = "the engine ended the reply without its summary (no prefill time)"
        return
    record.stop = summary.stop
    record.decode_wall_s = record.wall_s - summary.prefill_ms / 1000.0
    record.decode_tokens = record.tokens


def _run_hf(
    record: RunRecord,
    engine: ChatEngine,
    prompt_ids: list[int],
    method: Method,
    settings: BenchSettings,
    peer: Peer | None,
) -> None:
    """Hugging Face ``generate``: decoding time runs from its first streamed tokens to its end.

    Its prefill is not separable from its first step, so the tokens that came with the first
    streamed chunk are left out of the count along with the time it took to produce them.
    """
    models: Peer = peer or (engine.target.model, engine.draft.model if engine.draft else None)
    hf_target, hf_draft = models
    result = hf_generate(
        hf_target,
        prompt_ids,
        sampling=settings.sampling,
        max_new_tokens=settings.max_new_tokens,
        stop_ids=engine.stop_ids,
        draft=hf_draft if method.speculative else None,
        gamma=method.gamma or None,
        seed=settings.seed,
    )
    record.tokens = len(result.token_ids)
    record.wall_s = result.wall_s
    record.token_ids = result.token_ids
    record.text = str(engine.tokenizer.decode(result.token_ids))
    record.stop = "max_tokens" if record.tokens >= settings.max_new_tokens else "eos"
    record.ttft_s = result.first_s
    if result.first_s is None:
        record.timing_note = "Hugging Face streamed no token, so its decoding time is unknown"
        return
    record.decode_wall_s = result.wall_s - result.first_s
    record.decode_tokens = max(record.tokens - result.first_tokens, 0)


def _run_llamacpp(
    record: RunRecord, llama: LlamaCppPeer, prompt_ids: list[int], method: Method, settings: BenchSettings
) -> None:
    """llama.cpp's server: decoding time and steps are its own (``predicted_ms`` covers the
    ``predicted_n − 1`` steps after the first token, which comes with prompt processing, so its
    time to first token is its ``prompt_ms``)."""
    completion, wall = llama.run(method.name, prompt_ids, settings.max_new_tokens)
    record.wall_s = wall
    record.token_ids = completion.token_ids
    record.tokens = len(completion.token_ids)
    record.text = completion.text
    record.stop = completion.stop
    record.peer_timings = completion.timings
    if completion.timings is None:
        record.timing_note = "llama.cpp reported no timings, so its decoding time is unknown"
        return
    record.decode_wall_s = completion.timings.predicted_ms / 1000.0
    record.decode_tokens = completion.timings.decode_steps
    if completion.timings.predicted_n > 0:
        record.ttft_s = completion.timings.prompt_ms / 1000.0


def run_bench(
    engine: ChatEngine,
    prompts: Sequence[BenchPrompt],
    methods: Sequence[Method],
    settings: BenchSettings,
    *,
    repeats: int = 1,
    progress: Callable[[RunRecord], None] | None = None,
    before_run: Callable[[BenchPrompt, Method], None] | None = None,
    peer: Peer | None = None,
    llama: LlamaCppPeer | None = None,
) -> list[RunRecord]:
    """All methods on all prompts, ``repeats`` times, the order rotating from pass to pass.

    Greedy runs are checked against plain decoding. Reports aggregate the fastest of the
    repeats of each (prompt, method) (:func:`fastest`): on a shared machine a burst of someone
    else's work slows a run several times over, never speeds it up.
    """
    records: list[RunRecord] = []
    for index, prompt in enumerate(prompts):
        prompt_ids = engine.prompt_ids(prompt.messages)
        for repeat in range(repeats):
            shift = (index + repeat) % len(methods)
            for method in [*methods[shift:], *methods[:shift]]:
                for record in run_turns(
                    engine, prompt, prompt_ids, method, settings, peer, llama, before_run=before_run
                ):
                    record.repeat = repeat
                    records.append(record)
                    if progress is not None:
                        progress(record)
    if settings.greedy:
        check_greedy(records)
    return records


def run_turns(
    engine: ChatEngine,
    prompt: BenchPrompt,
    prompt_ids: list[int],
    method: Method,
    settings: BenchSettings,
    peer: Peer | None = None,
    llama: LlamaCppPeer | None = None,
    *,
    before_run: Callable[[BenchPrompt, Method], None] | None = None,
) -> Iterator[RunRecord]:
    """One method on every turn of a question, each turn a record of its own.

    A later turn is asked after this method's own reply to the turn before
    (:meth:`BenchPrompt.next_turn`), as Spec-Bench runs MT-Bench's questions; each turn starts
    from empty caches like any run, so its time includes prefilling the conversation so far.
    """
    turn: BenchPrompt | None = prompt
    ids = prompt_ids
    while turn is not None:
        if before_run is not None:
            before_run(turn, method)
        record = run_method(engine, turn, ids, method, settings, peer, llama)
        yield record
        turn = turn.next_turn(record.text)
        if turn is not None:
            ids = engine.prompt_ids(turn.messages)


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


def warm_up(
    engine: ChatEngine,
    prompt_ids: list[int],
    methods: Sequence[Method],
    tokens: int = 8,
    peer: Peer | None = None,
    llama: LlamaCppPeer | None = None,
) -> None:
    """A few tokens of every kind of run first: allocators, kernels and thread pools settle."""
    settings = BenchSettings(max_new_tokens=tokens)
    seen: set[tuple[str, str, str]] = set()
    prompt = BenchPrompt("warm-up", "warm-up", ())
    for method in methods:
        key = (method.kind, method.drafter, method.schedule)
        if key not in seen:
            seen.add(key)
            run_method(engine, prompt, prompt_ids, method, settings, peer, llama)
    # The warm-up's rounds are cold (the first passes fault the mapped weights in) and few; left
    # in the adaptive schedule, their costs and α steer the timed runs' first choices (after them,
    # the first prompt drafted γ = 1 in 52 of 72 rounds). The timed runs start as a fresh
    # `specchat` does.
    engine.forget_measurements()
