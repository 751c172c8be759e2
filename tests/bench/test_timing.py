"""Decoding speed comes only from durations measured in the run it describes."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from specchat.bench.costs import Costs
from specchat.bench.figures import all_groups, refusals
from specchat.bench.methods import PLAIN, BenchSettings, Method
from specchat.bench.plot import write_plot
from specchat.bench.prompts import BenchPrompt
from specchat.bench.report import headline, render_tables
from specchat.bench.run_record import RunRecord, fastest
from specchat.bench.runner import run_bench
from specchat.bench.summary import summarize
from specchat.engine.session import ChatEngine

METHODS = [
    PLAIN,
    Method("fixed-2", "specchat", "model", "fixed", 2),
    Method("ngram", "specchat", "ngram", "fixed", 3),
]
COSTS = Costs(10.0, 3.0, {2: 12.0, 3: 13.0})


@pytest.fixture(scope="module")
def records(engine: ChatEngine, prompts: list[BenchPrompt]) -> list[RunRecord]:
    return run_bench(engine, prompts, METHODS, BenchSettings(max_new_tokens=12))


@pytest.mark.slow
def test_a_slow_plain_prefill_cannot_inflate_other_runs(
    engine: ChatEngine, prompts: list[BenchPrompt], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst of load during the plain run's prefill (a busy machine) used to make every other
    run on that prompt report ~1e10 tok/s: their decoding time was their wall time less the
    *plain run's* prefill, clamped at 1 ns when that was longer than their whole run."""
    running: list[str] = []
    real_prefill = engine.target.prefill

    def prefill_slowed_in_plain_runs(ids: list[int]) -> float:
        start = time.perf_counter()
        if running[-1] == "plain":
            time.sleep(0.5)  # the measured prefill really takes this long
        real_prefill(ids)
        return (time.perf_counter() - start) * 1000.0

    monkeypatch.setattr(engine.target, "prefill", prefill_slowed_in_plain_runs)
    records = run_bench(
        engine,
        prompts,
        METHODS,
        BenchSettings(max_new_tokens=12),
        before_run=lambda prompt, method: running.append(method.name),
    )
    for r in records:
        assert r.summary is not None and r.timing_problem is None
        # The bench's window holds the engine's decode loop: it can never be faster than it.
        assert r.tok_s is not None
        assert r.tok_s <= r.tokens / r.summary.decode_s * 1.001, (r.method, r.prompt_id, r.tok_s)


@pytest.mark.slow
def test_every_engine_run_is_timed_by_its_own_clock(records: list[RunRecord]) -> None:
    for r in records:
        assert r.summary is not None and r.decode_wall_s is not None
        assert r.decode_wall_s == pytest.approx(r.wall_s - r.summary.prefill_ms / 1000.0)
        assert r.decode_wall_s >= r.summary.decode_s  # the engine's loop is inside the bench's window
        assert r.decode_tokens == r.tokens == r.summary.tokens
        assert r.tok_s == pytest.approx(r.tokens / r.decode_wall_s)
        # α and τ are the engine's own figures, not recomputed beside it.
        assert (r.alpha, r.tau, r.rounds) == (r.summary.alpha, r.summary.tau, r.summary.rounds)


def contradicted(record: RunRecord) -> RunRecord:
    """The shape of the original defect: a decoding time far below what the engine measured inside it."""
    return replace(record, decode_wall_s=1e-9)


def test_a_contradicted_duration_is_refused_naming_the_run(records: list[RunRecord]) -> None:
    victim = next(r for r in records if r.method == "ngram" and r.prompt_id == "copy-1")
    bad = contradicted(victim)
    assert bad.tok_s is None
    problem = bad.timing_problem
    assert problem is not None and "shorter than the engine's own decode loop" in problem
    others = [r for r in records if r is not victim]
    table = [*others, bad]
    assert refusals(table) == [f"ngram on copy-1 (repeat 0): {problem}"]
    groups = {(g.method, g.category): g for g in all_groups(table, METHODS, COSTS)}
    for key in (("ngram", "all"), ("ngram", "code")):
        assert groups[key].tok_s is None and groups[key].speedup is None
        assert groups[key].refused == (f"ngram on copy-1 (repeat 0): {problem}",)
    # Other methods and the untouched category keep their figures.
    assert groups[("ngram", "chat")].tok_s is not None
    assert groups[("fixed-2", "all")].speedup is not None
    summary = summarize(table, METHODS, COSTS)
    assert summary["refused"] == [f"ngram on copy-1 (repeat 0): {problem}"]
    lines = headline(summary, COSTS)
    assert any("ngram on copy-1 (repeat 0)" in line for line in lines)
    from rich.console import Console

    console = Console(width=200, record=True)
    for renderable in render_tables(table, METHODS, COSTS):
        console.print(renderable)
    text = console.export_text()
    assert "refused" in text
    assert "e+" not in text  # no absurd figure anywhere


def test_the_plot_leaves_refused_figures_out(records: list[RunRecord], tmp_path: Path) -> None:
    table = [contradicted(r) if r.method == "ngram" else r for r in records]
    path = write_plot(tmp_path / "refused.png", table, METHODS, COSTS)
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_an_unmeasured_duration_is_refused(records: list[RunRecord]) -> None:
    victim = next(r for r in records if r.method == "fixed-2")
    bad = replace(victim, decode_wall_s=None, timing_note="Hugging Face streamed no token")
    assert bad.tok_s is None and bad.timing_problem == "Hugging Face streamed no token"
    zero = replace(victim, summary=None, decode_wall_s=0.0)
    assert zero.tok_s is None and "not a duration" in (zero.timing_problem or "")


def test_a_refused_plain_run_refuses_every_speedup_on_its_prompt(records: list[RunRecord]) -> None:
    plain = next(r for r in records if r.kind == "plain" and r.prompt_id == "chat-1")
    table = [r for r in records if r is not plain] + [contradicted(plain)]
    groups = {(g.method, g.category): g for g in all_groups(table, METHODS, COSTS)}
    assert groups[("fixed-2", "chat")].tok_s is not None
    assert groups[("fixed-2", "chat")].speedup is None
    assert groups[("fixed-2", "code")].speedup is not None


def test_the_fastest_repeat_is_never_a_refused_one(records: list[RunRecord]) -> None:
    good = next(r for r in records if r.method == "fixed-2")
    bad = replace(contradicted(good), repeat=1)
    assert fastest([bad, good]) == [good]
    assert fastest([bad]) == [bad]  # kept, so the report refuses rather than drops the prompt
