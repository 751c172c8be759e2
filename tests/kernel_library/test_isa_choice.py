"""Which CPU path a start takes when specchat's kernels have no variant to run."""

from __future__ import annotations

from pathlib import Path

import pytest

import specchat.kernels as kernels
from specchat.errors import InvalidSettingError
from specchat.models.compute.cpu_quant import FALLBACK_CPU_PATH, NATIVE_CPU_PATH
from specchat.models.loading.loader import choose_cpu_path
from specchat.models.records import LoadProgress


def test_a_named_instruction_set_that_cannot_run_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kernels.ISA_ENV, "neon")
    with pytest.raises(InvalidSettingError, match="SPECCHAT_CPU_ISA=neon") as caught:
        choose_cpu_path("auto", "cpu", None, None)
    assert "\n" not in str(caught.value)


def test_a_cpu_without_a_fast_variant_runs_scalar_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kernels.ISA_ENV, raising=False)
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: {"sse2"})  # an x86 CPU without AVX2
    monkeypatch.setattr(kernels.platform, "machine", lambda: "x86_64")
    assert kernels.choose_variant().name == "scalar"
    reason = kernels.slow_reason()
    assert reason is not None and "avx2" in reason and "avx512" not in reason
    monkeypatch.setattr(kernels, "load", lambda report=None: None)
    monkeypatch.setattr(kernels, "is_built", lambda: True)
    events: list[LoadProgress] = []
    chosen = choose_cpu_path("auto", "cpu", None, events.append)
    assert str(chosen) == NATIVE_CPU_PATH
    [line] = [event.message for event in events if event.stage == "notice"]
    assert reason in line and "scalar" in line and "10×" in line


def test_a_forced_variant_is_not_called_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kernels.ISA_ENV, "scalar")
    assert kernels.choose_variant().name == "scalar" and kernels.slow_reason() is None


def test_a_system_no_variant_is_built_for_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kernels.ISA_ENV, raising=False)
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: "they are built for Linux and for macOS on arm64")
    with pytest.raises(InvalidSettingError, match="built for Linux") as stopped:
        choose_cpu_path("auto", "cpu", None, None)
    assert "\n" not in str(stopped.value) and FALLBACK_CPU_PATH in str(stopped.value)


def test_no_compiler_is_one_line_naming_how_to_get_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from specchat.kernels import library

    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with pytest.raises(kernels.KernelsUnavailable, match="apt install g\\+\\+") as refused:
        library._build(kernels.SCALAR.library, tmp_path)
    assert "no-such-compiler-here" in str(refused.value) and "\n" not in str(refused.value)
