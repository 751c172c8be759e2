"""What the CLI says about itself must match what it does."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import pytest
from click.testing import CliRunner

from specchat.cli import main
from specchat.config import Settings
from specchat.engine.gamma import GAMMA_CHANGE, SCHEDULES, HeuristicGamma
from specchat.engine.registry import DRAFT_STOP_BELOW
from specchat.models.cache.paths import CONVERTED_MARKER
from specchat.models.compute.cpu_quant import FALLBACK_CPU_PATH, NATIVE_CPU_PATH
from specchat.models.compute.packed_cache import FORMAT_VERSION, PackRecipe, packed_folder
from specchat.models.names import assemble
from specchat.models.names.catalog import PACKAGED
from specchat.params import GAMMA_MAX


def help_text(command: str = "generate") -> str:
    result = CliRunner().invoke(main, [command, "--help"], terminal_width=400)
    assert result.exit_code == 0
    return " ".join(result.output.split())


def option_help(text: str, option: str) -> str:
    """The help of one option: from its name to the next option's."""
    start = text.index(f" {option} ")
    end = text.find(" --", start + len(option) + 2)
    return text[start:end]


def packed_copy(name: str, fmt: int) -> Path:
    model = PACKAGED[name]
    folder = packed_folder(name, f"packaged:{model.key}", PackRecipe("q4", 32768))
    folder.mkdir(parents=True)
    (folder / CONVERTED_MARKER).write_text(
        json.dumps({"origin": "/x/qwen05.gguf", "format": fmt, "files": {}})
    )
    return folder


def cached_column(output: str, name: str) -> str:
    header = next(line for line in output.splitlines() if line.startswith("name"))
    row = next(line for line in output.splitlines() if line.startswith(name + " "))
    at = header.index("cached")
    return row[at : at + 6].strip()


def test_models_says_cached_for_a_packaged_model_whose_packed_copy_is_in_the_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(assemble, "locate_package", lambda package: None)
    target, draft = list(PACKAGED)[:2]
    packed_copy(draft, FORMAT_VERSION)
    packed_copy(target, FORMAT_VERSION - 1)  # an earlier format: repacked at the next start
    output = CliRunner().invoke(main, ["models"]).output
    assert cached_column(output, draft) == "yes"
    assert cached_column(output, target) == "no"


def test_gamma_help_says_what_each_schedule_does_with_it() -> None:
    words = option_help(help_text(), "--gamma")
    assert "Most tokens drafted per round" not in words
    assert f"1–{GAMMA_MAX}" in words and str(DRAFT_STOP_BELOW) in words
    for schedule in ("fixed", "heuristic", "adaptive"):
        assert schedule in words
    # What the help now admits: the heuristic schedule drafts more than --gamma 1 asks.
    heuristic = HeuristicGamma(1)
    from specchat.engine.events import RoundEvent

    heuristic.observe(RoundEvent(0, 1, 1, 1, 1.0, 1.0, "model"))
    assert heuristic.next_gamma() > 1 and "+2" in words


def test_gamma_help_says_what_a_changed_gamma_does_under_each_schedule() -> None:
    # The behaviour behind each sentence is pinned in tests/engine/test_gamma_changes.py.
    words = option_help(help_text("chat"), "--gamma")
    for schedule in SCHEDULES:
        assert GAMMA_CHANGE[schedule] in words
    assert "restarts it from the new γ at the next round" in words


def test_cpu_path_help_describes_the_auto_of_today() -> None:
    words = option_help(help_text(), "--cpu-path")
    assert Settings().cpu_path == "auto" and "default auto" in words
    assert NATIVE_CPU_PATH in words and FALLBACK_CPU_PATH in words
    assert "per-row int8 target, int8 draft" not in words


@pytest.mark.parametrize(
    ("isa", "expected"),
    [
        ("scalar", "CPU kernels: scalar, forced by SPECCHAT_CPU_ISA"),
        (
            "bogus",
            "CPU kernels: none (SPECCHAT_CPU_ISA=bogus: unknown; use one of avx512, avxvnni, avxvnni-evex, "
            "avx2, i8mm, neon",
        ),
        pytest.param(
            "neon",
            "CPU kernels: none (SPECCHAT_CPU_ISA=neon: it needs an ARM64 CPU",
            marks=pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 wording"),
        ),
    ],
)
def test_models_says_which_kernel_variant_runs(
    monkeypatch: pytest.MonkeyPatch, isa: str, expected: str
) -> None:
    monkeypatch.setenv("SPECCHAT_CPU_ISA", isa)
    output = CliRunner().invoke(main, ["models"]).output
    assert expected in output
