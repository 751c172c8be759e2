"""What the user waits for: target prefill, the draft's catch-up, time to first token, decoding
and the total wait; the total-wait ratio to our plain; the guard on every category."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from specchat.bench.costs import Costs
from specchat.bench.figures import all_groups, wait_ratio
from specchat.bench.hf_peer import PeerResult
from specchat.bench.llamacpp_peer import PLAIN_ROW as LLAMA_PLAIN
from specchat.bench.llamacpp_peer import PeerCompletion, PeerTimings
from specchat.bench.methods import PLAIN, BenchSettings, Method
from specchat.bench.prompts import BenchPrompt
from specchat.bench.report import headline, render_detail, render_tables, to_json
from specchat.bench.run_record import RunRecord
from specchat.bench.runner import run_method
from specchat.bench.summary import GUARD_RATIO, guard, summarize
from specchat.engine.costs import ROUTINE_CATCH_UP, draft_prefill_ms
from specchat.engine.events import UNKNOWN, Event, RoundEvent, SummaryEvent, TokenEvent

COSTS = Costs(10.0, 3.0, {2: 12.0})
HYBRID = Method("hybrid", "specchat", "hybrid", "adaptive", 4)
NGRAM = Method("ngram", "specchat", "ngram", "fixed", 4)
HF = Method("hf-assisted-2", "hf", "model", "constant", 2)


def routine(drafter: str, draft_ms: float, drafted: int = 2, caught_up: int = 1) -> RoundEvent:
    return RoundEvent(0, drafted, drafted, drafted, draft_ms, 20.0, drafter, caught_up=caught_up)


def catch_up(drafter: str, draft_ms: float, drafted: int, caught_up: int = 60) -> RoundEvent:
    return RoundEvent(0, drafted, drafted, 0, draft_ms, 20.0, drafter, caught_up=caught_up)


# ---------------------------------------------------------------------------------- catch-up
def test_a_catch_up_is_its_draft_time_less_the_runs_routine_drafting() -> None:
    rounds = [
        # The model's routine rounds: 4, 5 and 50 ms a drafted token. d is their median, 5 ms
        # (a mean, 19.7 ms, would swallow most of the catch-up below).
        routine("model", 8.0),
        routine("model", 10.0),
        routine("model", 100.0),
        catch_up("model", 115.0, drafted=3),  # 115 − 3 × 5 = 100 ms of catch-up
        catch_up("model", 10.0, drafted=3),  # faster than its drafting: 0, never negative
        RoundEvent(0, 4, 4, 2, 0.2, 20.0, "ngram"),  # a lookup reads nothing
        RoundEvent(0, 0, 0, 0, 0.0, 18.0, "none"),  # a plain round
        catch_up("eagle", 40.0, drafted=2),  # no routine round of its own: all of it
    ]
    assert draft_prefill_ms(rounds) == pytest.approx(100.0 + 0.0 + 40.0)


def test_routine_catch_up_is_part_of_drafting() -> None:
    # Reading the closing token and the last draft is what every round after a drafted one does.
    at_the_bound = [routine("model", 10.0), routine("model", 30.0, caught_up=ROUTINE_CATCH_UP)]
    assert draft_prefill_ms(at_the_bound) == 0.0
    past_it = [routine("model", 10.0), catch_up("model", 30.0, drafted=2, caught_up=ROUTINE_CATCH_UP + 1)]
    # d = 5 ms from the one routine round: 30 − 2 × 5.
    assert draft_prefill_ms(past_it) == pytest.approx(20.0)
    assert draft_prefill_ms([]) == 0.0


def test_an_untimed_catch_up_is_unknown_not_free() -> None:
    assert draft_prefill_ms([routine("model", 10.0), catch_up("model", UNKNOWN, drafted=2)]) is None
    # An untimed routine round only leaves d to the others.
    rounds = [routine("model", UNKNOWN), routine("model", 10.0), catch_up("model", 50.0, drafted=2)]
    assert draft_prefill_ms(rounds) == pytest.approx(40.0)


# ---------------------------------------------------------------------------- synthetic runs
def record(
    method: Method,
    prompt: str,
    category: str,
    wall_s: float,
    *,
    prefill_ms: float = 100.0,
    ttft_s: float | None = 0.12,
    rounds: Sequence[RoundEvent] = (),
    decode_s: float | None = None,
    tokens: int = 20,
) -> RunRecord:
    """One run as the runner would record it: total wait ``wall_s``; for specchat, decoding is
    the total less the target prefill, unless ``decode_s`` says otherwise."""
    r = RunRecord(
        prompt, category, method.name, method.kind, method.drafter, method.schedule, method.gamma, 30,
        tokens=tokens, wall_s=wall_s, ttft_s=ttft_s, decode_tokens=tokens,
    )  # fmt: skip
    r.round_events = list(rounds)
    if method.kind in ("plain", "specchat"):
        decode = wall_s - prefill_ms / 1000.0 if decode_s is None else decode_s
        r.decode_wall_s = decode
        r.summary = SummaryEvent(
            tokens, len(rounds), 0, 0, None, None, tokens / decode, (), "max_tokens", prefill_ms,
            decode * 0.9, 30,
        )  # fmt: skip
    else:
        r.decode_wall_s = wall_s - (ttft_s or 0.0) if decode_s is None else decode_s
    return r


def test_a_run_records_what_the_user_waits_for() -> None:
    rounds = [routine("model", 10.0), catch_up("model", 250.0, drafted=2)]
    r = record(HYBRID, "p1", "qa", 2.0, prefill_ms=300.0, ttft_s=0.31, rounds=rounds)
    assert r.prefill_ms == 300.0
    assert r.draft_prefill_ms == pytest.approx(240.0)
    assert r.total_wait_s == 2.0
    assert r.decode_wall_s == pytest.approx(1.7)
    data = json.loads(json.dumps(r.to_json()))
    assert data["ttft_s"] == 0.31 and data["total_wait_s"] == 2.0 and data["target_prefill_ms"] == 300.0
    assert data["draft_prefill_ms"] == pytest.approx(240.0) and data["decode_wall_s"] == pytest.approx(1.7)
    assert record(PLAIN, "p1", "qa", 2.0).draft_prefill_ms == 0.0
    hf = record(HF, "p1", "qa", 2.0, ttft_s=0.4)
    assert (hf.prefill_ms, hf.draft_prefill_ms) == (None, None)  # not separable in generate


# ------------------------------------------------------------------------- the runner's clocks
class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


class ScriptedEngine:
    """Just what run_method touches: caches to reset and a stream that advances the clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.target = SimpleNamespace(reset=lambda: None, model=None)
        self.draft = None
        self.stop_ids = frozenset({0})
        self.tokenizer = SimpleNamespace(decode=lambda ids: "x" * len(ids))

    def stream_plain(self, prompt_ids: list[int], controls: Any) -> Iterator[Event]:
        self.clock.now += 0.25  # the target's prefill, then the first token
        for i in range(3):
            if i:
                self.clock.now += 0.1
            yield TokenEvent("target", i + 1, "x", i, 0, 0.9, None)
            yield RoundEvent(i, 0, 0, 0, 0.0, 100.0, "none")
        self.clock.now += 0.05
        yield SummaryEvent(3, 3, 0, 0, None, 1.0, 3 / 0.3, (), "max_tokens", 240.0, 0.3, 5)

    stream_ids = stream_plain


def test_an_engine_runs_time_to_first_token_is_the_benchs_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr("specchat.bench.runner.time", clock)
    prompt = BenchPrompt("p1", "qa", ({"role": "user", "content": "hi"},))
    engine: Any = ScriptedEngine(clock)
    r = run_method(engine, prompt, [5, 6, 7], PLAIN, BenchSettings(max_new_tokens=3))
    assert r.ttft_s == pytest.approx(0.25)  # from the call to the first TokenEvent
    assert r.total_wait_s == pytest.approx(0.5)  # to the end of the stream
    assert r.prefill_ms == 240.0 and r.decode_wall_s == pytest.approx(0.5 - 0.24)
    assert r.to_json()["ttft_s"] == pytest.approx(0.25)


def test_the_peers_time_to_first_token_is_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    prompt = BenchPrompt("p1", "qa", ({"role": "user", "content": "hi"},))
    engine: Any = ScriptedEngine(Clock())
    monkeypatch.setattr(
        "specchat.bench.runner.hf_generate", lambda *a, **k: PeerResult([3, 4, 5], 1.5, 0.4, 1)
    )
    hf = run_method(engine, prompt, [5], HF, BenchSettings(max_new_tokens=8), peer=(None, None))
    assert hf.ttft_s == 0.4 and hf.total_wait_s == 1.5 and hf.prefill_ms is None

    timings = PeerTimings(prompt_n=30, prompt_ms=120.0, predicted_n=5, predicted_ms=400.0)

    class Llama:
        def run(self, row: str, ids: list[int], budget: int) -> tuple[PeerCompletion, float]:
            return PeerCompletion([1, 2, 3, 4, 5], "hello", "max_tokens", timings), 0.6

    peer: Any = Llama()
    llama = run_method(engine, prompt, [5], Method(LLAMA_PLAIN, "llamacpp"), BenchSettings(5), llama=peer)
    assert llama.ttft_s == pytest.approx(0.12)  # its prompt_ms: prompt processing and the first token
    assert llama.prefill_ms == 120.0 and llama.draft_prefill_ms is None and llama.total_wait_s == 0.6


# ----------------------------------------------------------------- the headline ratio and the guard
def table() -> list[RunRecord]:
    """Our plain, hybrid and the n-gram drafter on four categories (two of them MT-Bench's, which
    the report adds up as Spec-Bench's ``mt_bench``), and a slow Hugging Face peer.

    hybrid decodes faster everywhere, but on rag its draft model's catch-up of the long passages
    costs more than the faster decoding saves: its total wait there is 0.84× plain's.
    """
    slow_catch_up = [routine("model", 10.0), catch_up("model", 1010.0, drafted=2)]  # 1000 ms
    rows = [
        # category, prompt, plain's wait, hybrid's wait, hybrid's decoding
        ("qa", "q1", 2.0, 1.5, 1.4),
        ("qa", "q2", 2.0, 1.5, 1.4),
        ("rag", "r1", 2.1, 2.4, 1.2),
        ("rag", "r2", 2.1, 2.6, 1.2),
        ("writing", "81", 2.0, 2.0, 1.5),
        ("roleplay", "91", 2.0, 2.4, 1.5),
    ]
    records: list[RunRecord] = []
    for category, prompt, plain_s, hybrid_s, hybrid_decode in rows:
        records.append(record(PLAIN, prompt, category, plain_s))
        rounds = slow_catch_up if category == "rag" else [routine("model", 10.0)]
        records.append(record(HYBRID, prompt, category, hybrid_s, rounds=rounds, decode_s=hybrid_decode))
        records.append(record(NGRAM, prompt, category, plain_s / 0.971))  # just above the bound
        records.append(record(HF, prompt, category, plain_s * 3, ttft_s=0.5))
    return records


METHODS = [PLAIN, HYBRID, NGRAM, HF]


def test_the_total_wait_ratio_is_plains_wait_over_the_methods() -> None:
    records = table()
    groups = {(g.method, g.category): g for g in all_groups(records, METHODS, COSTS)}
    rag = groups[("hybrid", "rag")]
    assert rag.wait_ratio == pytest.approx((2.1 + 2.1) / (2.4 + 2.6))
    assert rag.speedup is not None and rag.speedup > 1.5  # decoding alone says hybrid wins
    assert rag.total_wait_s == pytest.approx(2.5)
    assert rag.target_prefill_ms == pytest.approx(100.0)
    assert rag.draft_prefill_ms == pytest.approx(1000.0)
    assert rag.ttft_ms == pytest.approx(120.0)
    assert rag.decode_s == pytest.approx(1.2)
    assert groups[("hybrid", "qa")].wait_ratio == pytest.approx(2.0 / 1.5)
    assert groups[("hybrid", "mt_bench")].wait_ratio == pytest.approx(4.0 / 4.4)
    assert groups[("plain", "all")].wait_ratio == pytest.approx(1.0)
    assert groups[("plain", "all")].draft_prefill_ms == 0.0
    hf = groups[("hf-assisted-2", "all")]
    assert hf.wait_ratio == pytest.approx(1 / 3) and hf.target_prefill_ms is None and hf.ttft_ms == 500.0
    # Our plain must cover the method's every prompt, or there is no ratio.
    hybrid = [r for r in records if r.method == "hybrid"]
    plain = [r for r in records if r.method == "plain"]
    assert wait_ratio(hybrid, plain[1:]) is None


def test_the_guard_flags_a_category_whose_wait_is_below_the_bound() -> None:
    records = table()
    waits, decodes = guard(records, all_groups(records, METHODS, COSTS))
    flagged = {(f.method, f.category): f for f in waits}
    # hybrid on rag (0.84×), on roleplay and on the mt_bench task it belongs to, not over all
    # prompts (0.98×); ngram sits just above the bound (0.971×); the peer is three times slower
    # but is compared, not guarded.
    assert set(flagged) == {("hybrid", "rag"), ("hybrid", "roleplay"), ("hybrid", "mt_bench")}
    rag = flagged[("hybrid", "rag")]
    assert rag.ratio == pytest.approx(0.84)
    assert rag.prompts == (("r2", pytest.approx(2.1 / 2.6)), ("r1", pytest.approx(2.1 / 2.4)))
    assert rag.line().startswith(f"⚑ hybrid · rag: 0.840× our plain (total wait), below {GUARD_RATIO}")
    assert "r2: 0.81×, r1: 0.88×" in rag.line()
    # Decoding speed is reported apart: ngram's (0.9695× plain's, its wait 0.971×) is flagged
    # there and only there.
    assert {(f.method, f.measure) for f in decodes} == {("ngram", "decode tok/s")}


def test_the_guard_judges_sampled_runs_too() -> None:
    # At T > 0 there is no greedy check (matches_plain stays None); the guard still judges.
    records = table()
    assert all(r.matches_plain is None for r in records)
    assert summarize(records, METHODS, COSTS)["guard"]["passed"] is False  # type: ignore[index]
    faster = [r for r in records if not (r.method == "hybrid" and r.category in ("rag", "roleplay"))]
    summary = summarize(faster, METHODS, COSTS)
    assert summary["guard"]["passed"] is True and summary["guard"]["flags"] == []  # type: ignore[index]


def test_summary_json_and_output_carry_the_wait_and_the_flags() -> None:
    records = table()
    summary = summarize(records, METHODS, COSTS)
    assert summary["plain_total_wait_s"] == pytest.approx((2.0 * 2 + 2.1 * 2 + 2.0 * 2) / 6)
    ratios = summary["total_wait_ratio"]
    assert isinstance(ratios, dict) and ratios["hybrid"] == pytest.approx(12.2 / 12.4)
    assert summary["best_total_wait"] == "hybrid"
    assert summary["best_total_wait_ratio"] == pytest.approx(12.2 / 12.4)
    found = summary["guard"]
    assert isinstance(found, dict) and found["threshold"] == GUARD_RATIO
    assert [(f["method"], f["category"]) for f in found["flags"]] == [
        ("hybrid", "rag"), ("hybrid", "roleplay"), ("hybrid", "mt_bench"),
    ]  # fmt: skip
    data = json.loads(json.dumps(to_json(records, METHODS, COSTS, {"command": "test"})))
    assert data["summary"]["guard"]["flags"][0]["prompts"][0] == {
        "prompt": "r2",
        "ratio": pytest.approx(2.1 / 2.6),
    }
    group = next(g for g in data["groups"] if (g["method"], g["category"]) == ("hybrid", "rag"))
    for key in ("wait_ratio", "total_wait_s", "target_prefill_ms", "draft_prefill_ms", "ttft_ms", "decode_s"):
        assert group[key] is not None, key
    record_json = next(r for r in data["records"] if r["method"] == "hybrid")
    assert {"ttft_s", "target_prefill_ms", "draft_prefill_ms", "total_wait_s"} <= set(record_json)

    lines = headline(summary, COSTS)
    assert any(line.startswith("shortest wait: hybrid at 0.98× our plain's total wait") for line in lines)
    assert "⚑ hybrid · rag: 0.840× our plain (total wait), below 0.97" in "\n".join(lines)
    # Decoding is reported apart, its ratios rounded down (0.9695 reads 0.969, not 0.970).
    assert any(line.startswith("  ngram: all 0.969×, qa 0.969×") for line in lines)
    console = Console(width=250, record=True)
    for renderable in [*render_tables(records, METHODS, COSTS), render_detail(records, METHODS, COSTS)]:
        console.print(renderable)
    text = console.export_text()
    for title in (
        "where the wait goes",
        "total wait: our plain ÷ method, by category",
        "per method and category",
    ):
        assert title in text
    assert "0.84× ⚑" in text and "1000.0" in text  # the flagged cell, rag's draft prefill


def test_the_readme_tables_script_shows_the_wait_and_the_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    machine = {
        "platform": "p",
        "torch": "t",
        "threads": 2,
        "load_before": {"load1": 0},
        "load_after": {"load1": 0},
    }
    meta = {
        "command": "specchat bench",
        "date": "today",
        "machine": machine,
        "elapsed_s": 1.0,
        "cpu_path": "none",
    }
    path = tmp_path / "out.json"
    path.write_text(json.dumps(to_json(table(), METHODS, COSTS, meta)))
    spec = importlib.util.spec_from_file_location(
        "bench_markdown", Path(__file__).parents[2] / "scripts" / "bench_markdown.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(str(path))
    out = capsys.readouterr().out
    assert "| method | total wait vs plain | tok/s |" in out
    assert "| **hybrid** | **0.98×** | **14.63** | **1.41×** |" in out
    assert "Guard: ⚑ hybrid · rag: 0.840× our plain (total wait)" in out


def test_sampled_replies_of_different_lengths_are_compared_at_plains_length() -> None:
    # At T > 0 the hybrid's reply ran to 64 tokens where plain's stopped at 38: the same pace
    # (1 s to the first token, then 40 ms a token) must not read as a slower method.
    plain = record(PLAIN, "91/t2", "roleplay", 1.0 + 37 * 0.04, ttft_s=1.0, tokens=38)
    hybrid = record(HYBRID, "91/t2", "roleplay", 1.0 + 63 * 0.04, ttft_s=1.0, tokens=64)
    assert hybrid.wait_for(38) == pytest.approx(plain.total_wait_s)
    assert wait_ratio([hybrid], [plain]) == pytest.approx(1.0)
    assert plain.total_wait_s / hybrid.total_wait_s < 0.75  # what the raw wall times said
    # The same length (greedy): the run's own wall time, whatever its pace.
    assert hybrid.wait_for(64) == hybrid.total_wait_s
