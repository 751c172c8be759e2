"""`specchat bench --check`: greedy equality of every drafter and schedule with plain decoding."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from specchat.bench.check import check_methods, run_check
from specchat.bench.prompts import BenchPrompt, load_prompts
from specchat.cli import main
from specchat.cli.bench_command import bench
from specchat.engine.events import Event, TokenEvent
from specchat.engine.gamma import SCHEDULES
from specchat.engine.session import ChatEngine


def test_the_check_covers_every_drafter_and_schedule(engine: ChatEngine) -> None:
    names = [m.name for m in check_methods(engine, 4)]
    drafters = [d for d in engine.available_drafters if d != "none"]
    assert set(drafters) == {"model", "ngram", "hybrid"}
    assert names == [f"{d}/{s}" for d in drafters for s in SCHEDULES]
    assert len(names) == 9


def test_at_least_fifty_prompts_all_distinct() -> None:
    prompts = load_prompts(check=True)
    assert len(prompts) >= 50 and len({p.id for p in prompts}) == len(prompts)
    assert len(load_prompts()) < len(prompts)  # the timing bench keeps its own set
    assert {p.category for p in load_prompts(check=True, quick=True)} == {p.category for p in prompts}
    assert all(p.messages[-1]["role"] == "user" for p in prompts)


@pytest.mark.slow
def test_every_configuration_matches_plain_on_the_tiny_pair(
    engine: ChatEngine, prompts: list[BenchPrompt]
) -> None:
    result = run_check(engine, prompts, check_methods(engine, 3), max_new_tokens=16)
    assert result.total == len(prompts) * 9
    assert result.matched == result.total and not result.mismatches
    assert result.lines()[0].startswith(f"greedy equality with plain decoding: {result.total}/{result.total}")


@pytest.mark.slow
def test_a_mismatch_names_the_run_and_the_first_differing_token(
    engine: ChatEngine, prompts: list[BenchPrompt], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = ChatEngine.stream_ids

    def one_token_off(
        self: ChatEngine, prompt_ids: list[int], controls: object, cancel: object = None
    ) -> Iterator[Event]:
        for event in real(self, prompt_ids, controls, cancel):  # type: ignore[arg-type]
            if (
                isinstance(event, TokenEvent)
                and controls.drafter == "ngram"  # type: ignore[attr-defined]
                and controls.schedule == "heuristic"  # type: ignore[attr-defined]
                and event.round == 2
                and event.position == 0
            ):
                event = TokenEvent(event.kind, 7, "e", event.round, 0, event.p_target, event.p_draft)
            yield event

    monkeypatch.setattr(ChatEngine, "stream_ids", one_token_off)
    result = run_check(engine, prompts[:1], check_methods(engine, 3), max_new_tokens=16)
    assert result.total - result.matched == 1
    (miss,) = result.mismatches
    assert miss.method == "ngram/heuristic" and miss.prompt_id == prompts[0].id
    assert miss.got == (7, "e") and miss.plain is not None and miss.plain != miss.got
    plain = next(r for r in result.records if r.kind == "plain")
    assert plain.token_ids[miss.index] == miss.plain[0]
    assert any(
        line.startswith("MISMATCH ngram/heuristic on copy-1: first difference at token")
        for line in result.lines()
    )


@pytest.mark.slow
def test_cli_check_counts_matches_and_writes_json(
    pair_folders: tuple[Path, Path], tmp_path: Path, one_thread: None
) -> None:
    target, draft = pair_folders
    out = tmp_path / "check.json"
    args = [
        "--check", "--quick", "--categories", "code,qa", "--target", str(target), "--draft", str(draft),
        "--cpu-path", "none", "--max-new-tokens", "8", "--json", str(out),
    ]  # fmt: skip
    result = CliRunner().invoke(bench, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert (
        "greedy equality with plain decoding: 18/18 replies matched (2 prompts × 9 configurations"
        in result.output
    )
    assert "tok/s" not in result.output
    data = json.loads(out.read_text())
    assert data["check"]["matched"] == data["check"]["total"] == 18
    assert data["check"]["mismatches"] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--temperature", "0.7"], "--check compares greedy replies"),
        (["--plot", "x.png"], "nothing to plot"),
        (["--start-gamma", "0"], "0 is not in the range 1<=x<=16"),
        (["--categories", "poetry"], "unknown category poetry"),
        (["--llama-cpp", "."], "drop --llama-cpp"),
    ],
)
def test_check_errors_are_one_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["bench", "--check", *args])  # main words click's errors
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_cli_check_on_the_packaged_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isa: str) -> None:
    """The CI-sized check on the real pair, on each SIMD kernel variant this CPU runs: one prompt
    per category, every configuration. (The scalar variant, ten times slower, is held to the
    same bits as these on single matrices and tiny models in tests/kernels.)"""
    from specchat.kernels import ISA_ENV, cpu_supports
    from specchat.models.names.assemble import is_installed
    from specchat.models.names.catalog import PACKAGED

    if not all(is_installed(PACKAGED[n]) for n in ("qwen-coder-1.5b", "qwen-coder-0.5b")):
        pytest.skip("the packaged pair is not installed")
    monkeypatch.setenv(ISA_ENV, isa)
    if cpu_supports() is not None:
        pytest.skip(f"{cpu_supports()}")
    monkeypatch.delenv("SPECCHAT_CACHE_DIR", raising=False)  # the real models' shared cache
    out = tmp_path / "check.json"
    args = [
        "--check",
        "--quick",
        "--max-new-tokens",
        "24",
        "--threads",
        str(os.cpu_count() or 1),
        "--json",
        str(out),
    ]
    result = CliRunner().invoke(bench, args, catch_exceptions=False)
    data = json.loads(out.read_text())
    assert data["check"]["total"] == 6 * 9
    assert result.exit_code == 0, result.output
    assert data["check"]["matched"] == data["check"]["total"], data["check"]["mismatches"]
    assert f"on {isa} kernels" in result.output, "the check ran on the variant asked for"
