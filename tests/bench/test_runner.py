"""The harness on tiny models: records, greedy checks, the summary, JSON and the plot."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from specchat.bench import BenchError
from specchat.bench.costs import Costs, measure_costs
from specchat.bench.figures import predict
from specchat.bench.methods import BenchSettings, Method, build_methods
from specchat.bench.plot import write_plot
from specchat.bench.prompts import BenchPrompt, categories, load_prompts
from specchat.bench.report import render_tables, to_json
from specchat.bench.run_record import RunRecord, check_greedy, fastest
from specchat.bench.runner import run_bench, warm_up
from specchat.bench.summary import summarize
from specchat.engine.compare import first_difference
from specchat.engine.events import RoundEvent
from specchat.engine.gamma import AdaptiveGamma
from specchat.engine.session import ChatEngine

METHODS = build_methods([1, 3], hf_gammas=[2], hf_plain=True)
SETTINGS = BenchSettings(max_new_tokens=12)


@pytest.fixture(scope="module")
def records(engine: ChatEngine, prompts: list[BenchPrompt]) -> list[RunRecord]:
    return run_bench(engine, prompts, METHODS, SETTINGS)


@pytest.fixture
def costs(engine: ChatEngine, prompts: list[BenchPrompt]) -> Costs:
    return measure_costs(
        engine.target, engine.draft, engine.prompt_ids(prompts[0].messages), [1, 3], repeats=2
    )


def test_methods_cover_the_issue() -> None:
    names = [m.name for m in build_methods([1, 2], hf_gammas=[2], hf_plain=True, hf_default=True)]
    assert names == [
        "plain", "fixed-1", "fixed-2", "heuristic", "adaptive", "hybrid", "ngram",
        "hf-plain", "hf-assisted-2", "hf-assisted-default",
    ]  # fmt: skip
    assert [m.name for m in build_methods([1], has_draft=False)] == ["plain", "ngram"]


def test_a_drafter_added_to_the_registry_gets_a_bench_row() -> None:
    from specchat.bench import methods
    from specchat.engine.registry import DrafterSpec, registered

    extra = DrafterSpec("echo", "echo", "repeats", needs_draft_model=False, build=lambda kit: None)
    with registered(extra):
        added = [m for m in methods.build_methods([1]) if m.drafter == "echo"]
    assert [(m.name, m.schedule, m.gamma) for m in added] == [("echo", "fixed", 4)]


@pytest.mark.slow
def test_every_method_runs_on_every_prompt(records: list[RunRecord], prompts: list[BenchPrompt]) -> None:
    assert len(records) == len(prompts) * len(METHODS)
    assert {(r.prompt_id, r.method) for r in records} == {(p.id, m.name) for p in prompts for m in METHODS}
    for r in records:
        assert 0 < r.tokens <= SETTINGS.max_new_tokens
        assert r.tokens == len(r.token_ids)
        assert r.wall_s > 0 and r.timing_problem is None
        assert r.tok_s is not None and r.e2e_tok_s is not None and r.e2e_tok_s > 0
        assert r.decode_wall_s is not None and 0 < r.decode_wall_s < r.wall_s
        assert r.text
        if r.kind == "hf":
            assert r.rounds == 0 and r.alpha is None and r.summary is None
            assert r.decode_tokens < r.tokens  # the first streamed chunk is prefill's
            continue
        assert r.tok_s >= r.e2e_tok_s
        assert r.rounds > 0 and sum(r.drafted_hist.values()) == r.rounds == len(r.round_events)
        assert r.prefill_ms is not None and r.summary is not None
        assert r.tested <= r.drafted
        if r.kind == "plain":
            assert r.drafted == 0 and r.drafted_hist == {0: r.rounds}
        if r.method.startswith("fixed-"):
            assert r.drafted > 0
            assert 0.0 <= (r.alpha or 0.0) <= (r.alpha_iid or 0.0) <= 1.0
            assert max(r.drafted_hist) <= r.gamma


@pytest.mark.slow  # runs the whole bench on the tiny pair once (the records fixture)
def test_greedy_runs_all_equal_plain(records: list[RunRecord]) -> None:
    for r in records:
        assert r.matches_plain is True, (r.method, r.prompt_id, r.first_mismatch)
        assert r.first_mismatch is None


@pytest.mark.slow  # runs the whole bench on the tiny pair once (the records fixture)
def test_an_injected_mismatch_is_caught(records: list[RunRecord]) -> None:
    victim = next(r for r in records if r.method == "fixed-3")
    ids = list(victim.token_ids)
    ids[4] = (ids[4] + 1) % 40
    broken = replace(victim, token_ids=ids)
    shorter = replace(next(r for r in records if r.method == "ngram"), token_ids=victim.token_ids[:5])
    others = [r for r in records if r is not victim]
    check_greedy([*others, broken, shorter])
    assert broken.matches_plain is False and broken.first_mismatch == 4
    assert shorter.matches_plain is False and shorter.first_mismatch == 5
    assert first_difference([1, 2], [1, 2]) is None


@pytest.mark.slow  # runs the whole bench on the tiny pair once (the records fixture)
def test_summary_and_json(records: list[RunRecord], costs: Costs, tmp_path: Path) -> None:
    summary = summarize(records, METHODS, costs)
    for key in ("speedup_vs_plain", "vs_hf_assisted", "measured_over_predicted", "best", "greedy_equal"):
        assert key in summary
    assert summary["best"] in {m.name for m in METHODS if m.kind == "specchat"}
    assert summary["greedy_equal"] == {m.name: True for m in METHODS if m.kind != "plain"}
    targets = summary["targets"]
    assert isinstance(targets, dict)
    assert set(targets) == {
        "measured_over_predicted >= 0.9",
        "vs_hf_assisted >= 1.2",
        "adaptive >= 1.0 in every category",
        "adaptive >= 1.5 overall",
    }
    data = json.loads(json.dumps(to_json(records, METHODS, costs, {"command": "test"})))
    assert set(data) == {"meta", "costs", "summary", "groups", "records"}
    assert len(data["records"]) == len(records)
    record = data["records"][0]
    for key in ("prompt_id", "category", "method", "tok_s", "alpha", "tau", "matches_plain", "token_ids"):
        assert key in record
    assert {g["category"] for g in data["groups"]} == {"all", "code", "chat"}
    assert data["costs"]["probe"]["c"] == pytest.approx(costs.c, abs=1e-3)
    assert render_tables(records, METHODS, costs)


@pytest.mark.slow  # runs the whole bench on the tiny pair once (the records fixture)
def test_plot_is_written(records: list[RunRecord], costs: Costs, tmp_path: Path) -> None:
    path = write_plot(tmp_path / "bench.png", records, METHODS, costs)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # runs the whole bench on the tiny pair once (the records fixture)
def test_plot_into_a_missing_folder_is_a_bench_error(
    records: list[RunRecord], costs: Costs, tmp_path: Path
) -> None:
    with pytest.raises(BenchError):
        write_plot(tmp_path / "missing" / "bench.png", records, METHODS, costs)


def test_costs_measured_and_interpolated(costs: Costs) -> None:
    assert costs.target_ms > 0 and costs.draft_ms is not None and costs.c is not None
    assert set(costs.verify_ms) == {1, 3}
    synthetic = Costs(100.0, 20.0, {1: 110.0, 3: 130.0})
    assert synthetic.c == pytest.approx(0.2)
    assert synthetic.v(0) == 1.0
    assert synthetic.v(2) == pytest.approx(1.2)
    assert synthetic.v(5) == pytest.approx(1.5)  # on the line through the measured widths
    bent = Costs(100.0, 20.0, {1: 100.0, 2: 140.0})  # least squares through (0,100) (1,100) (2,140)
    assert bent.v(4) == pytest.approx((340.0 / 3.0 + 20.0 * 3) / 100.0)  # slope 20 ms per width
    assert bent.v(2) == pytest.approx(1.4)  # a measured width is its own value


def test_prediction_is_the_seed_formula() -> None:
    costs = Costs(100.0, 20.0, {2: 120.0})
    base = dict(prompt_id="p", category="c", kind="specchat", schedule="fixed", gamma=2, prompt_tokens=5)
    # α = 0.5 per tested position: 10 rounds of γ=2, each "accepted 1, tested 2";
    # the rounds' own timings say c = 40 ms / 2 tokens / 100 ms = 0.2 and v(2) = 1.2, as the probe.
    record = RunRecord(method="fixed-2", drafter="model", tokens=20, wall_s=1.0, **base)  # type: ignore[arg-type]
    record.round_events = [RoundEvent(n, 2, 2, 1, 40.0, 120.0, "model") for n in range(10)]
    expected = (1 - 0.5**3) / (1 - 0.5) / (2 * 0.2 + 1.2)
    assert predict([record], costs, plain_ms=100.0) == pytest.approx(expected)
    assert predict([record], costs, in_situ=False) == pytest.approx(expected)
    # Slower rounds than the probe saw: the in-situ prediction follows the rounds.
    record.round_events = [RoundEvent(n, 2, 2, 1, 80.0, 150.0, "model") for n in range(10)]
    assert predict([record], costs, plain_ms=100.0) == pytest.approx(
        (1 - 0.5**3) / (1 - 0.5) / (2 * 0.4 + 1.5)
    )
    assert predict([record], costs, in_situ=False) == pytest.approx(expected)
    plain = RunRecord(method="plain", drafter="none", tokens=5, wall_s=1.0, **{**base, "kind": "plain"})  # type: ignore[arg-type]
    assert predict([plain], costs) == 1.0


def test_prompt_set() -> None:
    assert categories() == ["multi-turn", "code", "math", "summarization", "qa", "translation"]
    everything = load_prompts()
    quick = load_prompts(quick=True)
    assert len(everything) >= 18 and len({p.id for p in everything}) == len(everything)
    assert {p.category for p in quick} == set(categories()) and len(quick) == len(categories())
    assert all(p.messages[-1]["role"] == "user" for p in everything)
    assert [p.category for p in load_prompts(only=["math"], per_category=2)] == ["math", "math"]
    with pytest.raises(BenchError):
        load_prompts(only=["poetry"])


def test_repeats_keep_every_run_and_report_the_fastest(
    engine: ChatEngine, prompts: list[BenchPrompt]
) -> None:
    methods = [Method("plain", "plain"), Method("fixed-2", "specchat", "model", "fixed", 2)]
    records = run_bench(engine, prompts[:1], methods, BenchSettings(max_new_tokens=6), repeats=2)
    assert sorted((r.method, r.repeat) for r in records) == [
        ("fixed-2", 0),
        ("fixed-2", 1),
        ("plain", 0),
        ("plain", 1),
    ]
    best = fastest(records)
    assert len(best) == 2
    for r in best:
        assert r.tok_s == max(x.tok_s for x in records if x.method == r.method and x.tok_s is not None)


def test_sampling_runs_skip_the_greedy_check(engine: ChatEngine, prompts: list[BenchPrompt]) -> None:
    methods = [Method("plain", "plain"), Method("fixed-2", "specchat", "model", "fixed", 2)]
    records = run_bench(
        engine, prompts[:1], methods, BenchSettings(max_new_tokens=6, temperature=0.8, seed=3)
    )
    assert all(r.matches_plain is None for r in records)


@pytest.mark.slow
def test_the_timed_runs_start_without_the_warm_ups_measurements(
    engine: ChatEngine, prompts: list[BenchPrompt]
) -> None:
    ids = engine.prompt_ids(prompts[0].messages)
    warm_up(engine, ids, METHODS, tokens=4)
    adaptive = engine.schedule("adaptive", lambda: 4)
    assert isinstance(adaptive, AdaptiveGamma)
    assert adaptive.estimates().plain_ms is None  # a first reply's schedule: nothing measured yet
