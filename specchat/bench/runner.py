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
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from specchat.bench.hf_peer import hf_generate
from specchat.bench.llamacpp_peer import LlamaCppPeer
from specchat.bench.methods import BenchSettings, Method
from specchat.bench.prompts import BenchPrompt
from specchat.bench.run_record import RunRecord, check_greedy
from specchat.engine.backend import Controls
from specchat.engine.events import RoundEvent, SummaryEvent, TokenEvent
from specchat.engine.session import ChatEngine

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
