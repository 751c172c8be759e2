"""Every method on every prompt, interleaved, with the models loaded once: one record per run.

Methods per prompt: plain decoding (the engine's independent target-only loop), specchat
speculative decoding with a fixed γ sweep, the heuristic and adaptive schedules and the n-gram
drafter, and Hugging Face ``generate`` (plain and assisted) as the peer. The order rotates from
prompt to prompt so that slow drift on the machine does not favour one method. Every run starts
from empty caches: no method inherits another's prefill.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from specchat.bench.hf_peer import hf_generate
from specchat.bench.prompts import BenchPrompt
from specchat.engine.events import RoundEvent, SummaryEvent, TokenEvent
from specchat.engine.gamma import positions_tested
from specchat.engine.sampling import SamplingParams
from specchat.engine.session import ChatEngine, Controls

MethodKind = Literal["plain", "specchat", "hf"]


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    kind: MethodKind
    drafter: str = "none"
    """specchat: "model", "ngram" or "none"; hf: "model" (assisted) or "none" (plain generate)."""
    schedule: str = "fixed"
    gamma: int = 0
    """Fixed γ, the starting γ of a schedule, or HF's num_assistant_tokens (0 = transformers' defaults)."""

    @property
    def sweep_gamma(self) -> int | None:
        """γ of a fixed-γ run with a draft model (the points of the γ sweep), else None."""
        if self.drafter == "model" and self.schedule == "fixed" and self.gamma > 0:
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
) -> list[Method]:
    methods = [PLAIN]
    if has_draft:
        methods += [Method(f"fixed-{g}", "specchat", "model", "fixed", g) for g in gammas]
        methods += [Method(s, "specchat", "model", s, start_gamma) for s in schedules]
    methods.append(Method("ngram", "specchat", "ngram", "fixed", ngram_gamma))
    if has_draft and hybrid:
        methods.append(Method("hybrid", "specchat", "hybrid", "adaptive", start_gamma))
    if hf_plain:
        methods.append(Method("hf-plain", "hf"))
    if has_draft:
        methods += [Method(f"hf-assisted-{g}", "hf", "model", "constant", g) for g in hf_gammas]
        if hf_default:
            methods.append(Method("hf-assisted-default", "hf", "model", "default", 0))
    return methods


@dataclass(frozen=True, slots=True)
class BenchSettings:
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    seed: int | None = 0

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class RunRecord:
    """One method on one prompt. Figures the engine reports come from its events."""

    prompt_id: str
    category: str
    method: str
    kind: MethodKind
    drafter: str
    schedule: str
    gamma: int
    prompt_tokens: int
    tokens: int
    wall_s: float
    """The whole reply as the user waits for it: prefill of both models plus decoding."""
    target_prefill_ms: float | None = None
    """The target's prefill of this prompt, as the plain run measured it: subtracted from every
    method's wall time, so that tokens/s compares decoding (draft prefill stays included)."""
    stop: str = "max_tokens"
    prefill_ms: float | None = None
    decode_s: float | None = None
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    tested: int = 0
    """Draft positions verification looked at (up to and including each round's first rejection)."""
    drafted_hist: dict[int, int] = field(default_factory=dict)
    """Tokens drafted in a round → how many rounds drafted that many (0: plain rounds)."""
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    round_log: list[tuple[str, int, int, float, float]] = field(default_factory=list)
    """Every round: (drafter, drafted, accepted, draft_ms, verify_ms), from its RoundEvent."""
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    matches_plain: bool | None = None
    """Greedy runs: the reply's token ids equal plain decoding's (None when not checked)."""
    first_mismatch: int | None = None
    reference: str = "plain"
    """What the greedy check compared with."""
    repeat: int = 0
    predicted_speedup: float | None = None

    @property
    def decode_wall_s(self) -> float:
        """Wall time less the target's prompt prefill (the same for every method)."""
        if self.target_prefill_ms is None:
            return self.wall_s
        return max(self.wall_s - self.target_prefill_ms / 1000.0, 1e-9)

    @property
    def tok_s(self) -> float:
        """Decoding speed: tokens over wall time less the target's prompt prefill."""
        return self.tokens / self.decode_wall_s if self.wall_s > 0 else 0.0

    @property
    def e2e_tok_s(self) -> float:
        """Tokens over the whole wall time, prefill included."""
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def engine_tok_s(self) -> float | None:
        """The engine's own SummaryEvent figure (decode loop only; None for Hugging Face)."""
        return self.tokens / self.decode_s if self.decode_s else None

    @property
    def alpha(self) -> float | None:
        """accepted / drafted, as the engine reports it."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def alpha_iid(self) -> float | None:
        """accepted / tested: the per-position acceptance the formula E[T](α, γ) assumes."""
        return self.accepted / self.tested if self.tested else None

    @property
    def tau(self) -> float | None:
        return self.tokens / self.rounds if self.rounds else None

    @property
    def mean_gamma(self) -> float | None:
        rounds = sum(self.drafted_hist.values())
        return sum(d * n for d, n in self.drafted_hist.items()) / rounds if rounds else None

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["drafted_hist"] = {str(k): v for k, v in sorted(self.drafted_hist.items())}
        data.update(
            tok_s=self.tok_s,
            e2e_tok_s=self.e2e_tok_s,
            engine_tok_s=self.engine_tok_s,
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
) -> RunRecord:
    """Run one method on one prompt from empty caches."""
    engine.target.reset()
    if engine.draft is not None:
        engine.draft.reset()
    gc.collect()
    record = RunRecord(
        prompt.id, prompt.category, method.name, method.kind, method.drafter, method.schedule,
        method.gamma, len(prompt_ids), 0, 0.0,
    )  # fmt: skip
    if method.kind == "hf":
        hf_target, hf_draft = peer or (engine.target.model, engine.draft.model if engine.draft else None)
        target = hf_target
        draft = hf_draft if method.drafter == "model" else None
        result = hf_generate(
            target,
            prompt_ids,
            sampling=settings.sampling,
            max_new_tokens=settings.max_new_tokens,
            stop_ids=engine.stop_ids,
            draft=draft,
            gamma=method.gamma or None,
            seed=settings.seed,
        )
        record.tokens = len(result.token_ids)
        record.wall_s = result.wall_s
        record.token_ids = result.token_ids
        record.text = engine.tokenizer.decode(result.token_ids)
        record.stop = "max_tokens" if record.tokens >= settings.max_new_tokens else "eos"
        return record
    controls = Controls(
        gamma=max(method.gamma, 1),
        schedule=method.schedule,
        drafter=method.drafter,
        temperature=settings.temperature,
        top_k=settings.top_k,
        top_p=settings.top_p,
        max_new_tokens=settings.max_new_tokens,
        seed=settings.seed,
    )
    start = time.perf_counter()
    stream = (
        engine.stream_plain(prompt_ids, controls)
        if method.kind == "plain"
        else engine.stream_ids(prompt_ids, controls)
    )
    pieces: list[str] = []
    summary: SummaryEvent | None = None
    for event in stream:
        if isinstance(event, TokenEvent):
            record.token_ids.append(event.token_id)
            pieces.append(event.text)
        elif isinstance(event, RoundEvent):
            _add_round(record, event)
        else:
            summary = event
    record.wall_s = time.perf_counter() - start
    record.text = "".join(pieces)
    record.tokens = len(record.token_ids)
    if summary is not None:
        record.stop = summary.stop
        record.prefill_ms = summary.prefill_ms
        record.decode_s = summary.decode_s
    return record


def _add_round(record: RunRecord, event: RoundEvent) -> None:
    record.rounds += 1
    record.drafted += event.drafted
    record.accepted += event.accepted
    if event.drafted:
        record.tested += positions_tested(event)
    record.drafted_hist[event.drafted] = record.drafted_hist.get(event.drafted, 0) + 1
    record.draft_ms += event.draft_ms
    record.verify_ms += event.verify_ms
    record.round_log.append(
        (event.drafter, event.drafted, event.accepted, round(event.draft_ms, 3), round(event.verify_ms, 3))
    )


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
            done: list[RunRecord] = []
            for method in [*methods[shift:], *methods[:shift]]:
                if before_run is not None:
                    before_run(prompt, method)
                record = run_method(engine, prompt, prompt_ids, method, settings, peer)
                record.repeat = repeat
                done.append(record)
                if progress is not None:
                    progress(record)
            plain_prefill = next((r.prefill_ms for r in done if r.kind == "plain"), None)
            for record in done:
                record.target_prefill_ms = plain_prefill
            records.extend(done)
    if settings.greedy:
        check_greedy(records)
    return records


def fastest(records: Sequence[RunRecord]) -> list[RunRecord]:
    """One record per (prompt, method): the repeat with the highest decoding speed."""
    best: dict[tuple[str, str], RunRecord] = {}
    for record in records:
        key = (record.prompt_id, record.method)
        if key not in best or record.tok_s > best[key].tok_s:
            best[key] = record
    return list(best.values())


def check_greedy(records: Iterable[RunRecord]) -> None:
    """Mark every record whose token ids differ from plain decoding's on the same prompt.

    specchat's methods compare with specchat's plain loop. Hugging Face's assisted runs compare
    with Hugging Face's own plain ``generate`` when it ran (its forward may round differently
    from specchat's, e.g. where a prompt's last token is computed), else with specchat's plain.
    """
    records = list(records)
    plain = {r.prompt_id: r.token_ids for r in records if r.kind == "plain"}
    hf_plain = {r.prompt_id: r.token_ids for r in records if r.method == "hf-plain"}
    for record in records:
        reference = plain.get(record.prompt_id)
        if record.kind == "hf" and record.method != "hf-plain" and record.prompt_id in hf_plain:
            reference = hf_plain[record.prompt_id]
            record.reference = "hf-plain"
        if reference is None:
            continue
        record.first_mismatch = first_difference(record.token_ids, reference)
        record.matches_plain = record.first_mismatch is None


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def warm_up(
    engine: ChatEngine,
    prompt_ids: list[int],
    methods: Sequence[Method],
    tokens: int = 8,
    peer: Peer | None = None,
) -> None:
    """A few tokens of every kind of run first: allocators, kernels and thread pools settle."""
    settings = BenchSettings(max_new_tokens=tokens)
    seen: set[tuple[str, str, str]] = set()
    prompt = BenchPrompt("warm-up", "warm-up", ())
    for method in methods:
        key = (method.kind, method.drafter, method.schedule)
        if key not in seen:
            seen.add(key)
            run_method(engine, prompt, prompt_ids, method, settings, peer)
