"""`specchat bench` end to end on a tiny pair saved as Hugging Face folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specchat.cli.bench_command import bench


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.mark.slow
def test_quick_bench_writes_json_and_plot(
    runner: CliRunner, pair_folders: tuple[Path, Path], tmp_path: Path, one_thread: None
) -> None:
    target, draft = pair_folders
    out_json, out_png = tmp_path / "out.json", tmp_path / "out.png"
    args = [
        "--target", str(target), "--draft", str(draft), "--quick", "--categories", "code,qa",
        "--max-new-tokens", "6", "--gammas", "1,2", "--hf-gammas", "2", "--cpu-path", "none",
        "--json", str(out_json), "--plot", str(out_png), "--detail",
    ]  # fmt: skip
    result = runner.invoke(bench, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "speedup over plain by category" in result.output
    assert "targets:" in result.output
    for shown in ("where the wait goes", "total wait: our plain ÷ method", "wait ×", "guard:"):
        assert shown in result.output, shown
    data = json.loads(out_json.read_text())
    summary = data["summary"]
    for key in ("speedup_vs_plain", "vs_hf_assisted", "measured_over_predicted", "total_wait_ratio", "guard"):
        assert key in summary
    for r in data["records"]:
        assert r["ttft_s"] is not None and 0 < r["ttft_s"] <= r["total_wait_s"], r["method"]
        if r["kind"] != "hf":
            assert r["target_prefill_ms"] is not None and r["draft_prefill_ms"] is not None
    assert data["meta"]["settings"]["gammas"] == [1, 2]
    assert data["meta"]["cpu_path"] == "none"
    assert "load_before" in data["meta"]["machine"]
    assert {r["method"] for r in data["records"]} == {
        "plain", "fixed-1", "fixed-2", "heuristic", "adaptive", "ngram", "hybrid", "hf-assisted-2",
    }  # fmt: skip
    assert {r["category"] for r in data["records"]} == {"code", "qa"}
    assert all(r["matches_plain"] for r in data["records"])
    assert out_png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gammas", "0,2"], "--gammas must be between 1 and 16"),
        (["--gammas", "a"], "--gammas must be a comma-separated list"),
        (["--categories", "poetry"], "unknown category poetry"),
        (["--json", "/no/such/folder/out.json"], "does not exist"),
        (["--target", "no-such-model", "--cpu-path", "none"], "error:"),
        (["--cpu-path", "fp8/int8"], "unknown CPU path"),
        (["--methods", "hybrid,fastest"], "unknown method fastest: use plain, fixed-1"),
    ],
)
def test_errors_are_one_line(runner: CliRunner, args: list[str], message: str) -> None:
    result = runner.invoke(bench, ["--quick", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_methods_keeps_plain_and_the_rows_asked_for(
    runner: CliRunner, pair_folders: tuple[Path, Path], tmp_path: Path, one_thread: None
) -> None:
    target, draft = pair_folders
    out_json = tmp_path / "out.json"
    args = [
        "--target", str(target), "--draft", str(draft), "--quick", "--categories", "code",
        "--max-new-tokens", "4", "--no-hf", "--cpu-path", "none", "--methods", "hybrid",
        "--json", str(out_json),
    ]  # fmt: skip
    result = runner.invoke(bench, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert {r["method"] for r in json.loads(out_json.read_text())["records"]} == {"plain", "hybrid"}
