"""`specchat models FILE`: what a user's GGUF holds and whether the fast path runs it, from its header."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType

from specchat.errors import ModelLoadError
from specchat.models.compute.packing import pack_gguf
from specchat.models.gguf.report import describe_gguf, report_lines
from specchat.testing.tiny_models import TinyPair
from tests.models.conftest import write_tiny_gguf


@pytest.mark.parametrize(
    "qtype",
    [
        None,
        GGMLQuantizationType.Q4_0,
        GGMLQuantizationType.Q5_1,
        GGMLQuantizationType.F16,
        GGMLQuantizationType.MXFP4,
    ],
)
def test_the_report_names_types_and_sizes_the_pack_before_packing(
    tiny_pair: TinyPair, tmp_path: Path, qtype: GGMLQuantizationType | None
) -> None:
    path = write_tiny_gguf(tiny_pair.target, tiny_pair.tokenizer, tmp_path / "t.gguf", qtype)
    report = describe_gguf(path)
    assert (report.architecture, report.layers, report.hidden, report.heads) == ("llama", 2, 64, 4)
    assert report.vocab == tiny_pair.target.config.vocab_size
    assert report.context_length == tiny_pair.target.config.max_position_embeddings
    type_name = qtype.name if qtype else "F32"
    assert report.types["attention"] == {type_name: 8} and report.types["MLP"] == {type_name: 6}
    assert report.problem is None
    assert report.packed_size == pack_gguf(str(path)).nbytes
    text = "\n".join(report_lines(report))
    assert "fast path       yes" in text
    if qtype != GGMLQuantizationType.MXFP4:
        assert f"own bits        {type_name}" in text
    else:
        assert f"requantized     {type_name} → q8" in text


def test_a_family_the_fast_path_cannot_run_says_why(tiny_pair: TinyPair, tmp_path: Path) -> None:
    path = write_tiny_gguf(tiny_pair.target, tiny_pair.tokenizer, tmp_path / "q.gguf", architecture="gemma2")
    lines = report_lines(describe_gguf(path))
    assert any(line.startswith("  fast path       no:") and "soft-capping" in line for line in lines)


def test_strings_from_the_file_cannot_reach_the_terminal(tiny_pair: TinyPair, tmp_path: Path) -> None:
    hostile = "\x1b]0;owned\x07\x1b[2J" + "x" * 10_000
    path = write_tiny_gguf(tiny_pair.target, tiny_pair.tokenizer, tmp_path / "h.gguf", name=hostile)
    lines = report_lines(describe_gguf(path))
    assert not any("\x1b" in line or "\x07" in line for line in lines)
    assert max(len(line) for line in lines) < 300


@pytest.mark.parametrize("content", [b"", b"GGUF" + b"\xff" * 64, b"not a model at all" * 100])
def test_a_file_that_is_not_a_gguf_is_one_line(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=r"is not a GGUF file|damaged GGUF file|truncated") as refused:
        describe_gguf(path)
    assert "\n" not in str(refused.value)


def run_models(*args: str) -> tuple[int, str, str]:
    from click.testing import CliRunner

    from specchat.cli import main

    result = CliRunner().invoke(main, ["models", *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_specchat_models_file_prints_the_report_and_the_kernels_that_run_it(
    tiny_pair: TinyPair, tmp_path: Path
) -> None:
    qtype = GGMLQuantizationType.Q5_1
    path = write_tiny_gguf(tiny_pair.target, tiny_pair.tokenizer, tmp_path / "mine.gguf", qtype)
    code, out, err = run_models(str(path))
    assert (code, err) == (0, "")
    assert out.splitlines()[: len(report_lines(describe_gguf(path)))] == report_lines(describe_gguf(path))
    assert "own bits        Q5_1" in out
    assert out.splitlines()[-1].startswith("CPU kernels: ")


@pytest.mark.parametrize("kind", ["device", "folder", "missing", "not gguf", "hostile name", "with --clear"])
def test_specchat_models_refuses_what_is_not_a_gguf_in_one_line(kind: str, tmp_path: Path) -> None:
    args = {
        "device": ["/dev/zero"],
        "folder": [str(tmp_path)],
        "missing": [str(tmp_path / "nope.gguf")],
        "not gguf": [str(tmp_path / "notes.gguf")],
        "hostile name": [str(tmp_path / "\x1b]0;owned\x07.gguf")],
        "with --clear": [str(tmp_path / "notes.gguf"), "--clear", "all"],
    }[kind]
    (tmp_path / "notes.gguf").write_text("not a model\n")
    (tmp_path / "\x1b]0;owned\x07.gguf").write_bytes(b"GGUF" + b"\xff" * 64)
    code, out, err = run_models(*args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("specchat: ")
    assert "\x1b" not in err and "\x07" not in err and "Traceback" not in err


def test_models_file_says_what_a_first_start_costs_at_this_machines_packing_rate(
    tiny_pair: TinyPair, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from specchat.cli import main
    from specchat.models.compute.first_start import (
        FIXED_SECONDS,
        REFERENCE_RATE,
        estimate,
        record_packing_rate,
    )

    path = write_tiny_gguf(tiny_pair.target, tiny_pair.tokenizer, tmp_path / "t.gguf")
    report = describe_gguf(path)
    before = estimate(report.size, report.packed_size)
    assert (before.rate, before.rate_measured_here) == (REFERENCE_RATE, False)
    record_packing_rate(10_000_000, 2.0)  # 5 MB/s: what this machine showed when it last packed
    after = estimate(report.size, report.packed_size)
    assert after.rate == 5e6 and after.rate_measured_here
    assert after.seconds == pytest.approx(FIXED_SECONDS + report.size / 5e6)
    assert after.disk_bytes == report.packed_size and after.peak_bytes > report.packed_size
    shown = CliRunner().invoke(main, ["models", str(path)])
    assert shown.exit_code == 0, shown.output
    assert "first start     about" in shown.output and "this machine's last packing" in shown.output
    assert "memory          about" in shown.output and "disk            " in shown.output
