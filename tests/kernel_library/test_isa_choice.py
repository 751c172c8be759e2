"""Which build of specchat's kernels a CPU gets: from its flags and platform, from
SPECCHAT_CPU_ISA, when a build fails, and which CPU path a start takes when no variant runs."""

from __future__ import annotations

import platform
from pathlib import Path
from types import ModuleType

import pytest

import specchat.kernels as kernels
from specchat.errors import InvalidSettingError
from specchat.kernels import NEON, KernelsUnavailable, missing_for
from specchat.kernels.library import BuildFailed, Library
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


def on(monkeypatch: pytest.MonkeyPatch, system: str, machine: str, cpu_flags: str = "") -> None:
    monkeypatch.setattr(platform, "system", lambda: system)
    monkeypatch.setattr(platform, "machine", lambda: machine)
    cpuinfo = f"Features\t: fp asimd {cpu_flags}\n"  # what /proc/cpuinfo says
    monkeypatch.setattr(Path, "read_text", lambda self, *args, **kwargs: cpuinfo)
    monkeypatch.delenv(kernels.ISA_ENV, raising=False)


def test_arm64_linux_with_the_dot_product_runs_neon(monkeypatch: pytest.MonkeyPatch) -> None:
    on(monkeypatch, "Linux", "aarch64", "asimddp")
    assert kernels.choose_variant() is NEON


def test_arm64_linux_without_the_dot_product_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    on(monkeypatch, "Linux", "aarch64")
    assert missing_for(NEON) == "this CPU lacks asimddp"
    assert kernels.choose_variant() is kernels.SCALAR  # exact but slow, never a dead end
    assert kernels.slow_reason() == "no neon build runs here: this CPU lacks asimddp"
    monkeypatch.setenv(kernels.ISA_ENV, "scalar")
    assert kernels.choose_variant() is kernels.SCALAR
    assert kernels.slow_reason() is None  # asked for, so no notice


def test_apple_arm64_runs_neon(monkeypatch: pytest.MonkeyPatch) -> None:
    on(monkeypatch, "Darwin", "arm64")
    assert kernels.choose_variant() is NEON


def test_neon_asked_for_on_x86_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    on(monkeypatch, "Linux", "x86_64", "avx2 fma f16c")
    monkeypatch.setenv(kernels.ISA_ENV, "neon")
    with pytest.raises(KernelsUnavailable) as raised:
        kernels.choose_variant()
    assert str(raised.value) == f"{kernels.ISA_ENV}=neon: it needs an ARM64 CPU (this is x86_64)"


AVX512_FLAGS = "avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni"


@pytest.mark.parametrize(
    ("machine", "cpu_flags", "expected"),
    [
        ("x86_64", "avx2 fma f16c", "avx2"),  # Zen 1-4, Core before 12th gen
        ("x86_64", "avx2 fma f16c avx_vnni", "avxvnni"),  # Core 12th-15th gen, Core Ultra
        ("x86_64", AVX512_FLAGS, "avx512"),  # the EVEX twin is never chosen unasked
        ("x86_64", f"{AVX512_FLAGS} avx_vnni", "avx512"),  # Sapphire Rapids, Zen 5: the wider one
        ("x86_64", "avx2 fma avx_vnni", "scalar"),  # no f16c: nothing fast runs
        ("aarch64", "asimddp", "neon"),
        ("aarch64", "asimddp i8mm", "i8mm"),  # Graviton 3 and 4, Neoverse V1/V2/N2
        ("aarch64", "i8mm", "scalar"),  # i8mm builds on neon's dot product
    ],
)
def test_the_variant_follows_the_cpu_flags(
    monkeypatch: pytest.MonkeyPatch, machine: str, cpu_flags: str, expected: str
) -> None:
    on(monkeypatch, "Linux", machine, cpu_flags)
    assert kernels.choose_variant().name == expected


@pytest.mark.parametrize(("has_i8mm", "expected"), [(True, "i8mm"), (False, "neon")])
def test_apple_arm64_runs_i8mm_where_the_sysctl_says_so(
    monkeypatch: pytest.MonkeyPatch, has_i8mm: bool, expected: str
) -> None:
    on(monkeypatch, "Darwin", "arm64")
    asked: list[str] = []

    def sysctl_says(name: str) -> bool:
        asked.append(name)
        return has_i8mm

    monkeypatch.setattr(kernels, "_sysctl_says", sysctl_says)
    assert kernels.choose_variant().name == expected
    assert "hw.optional.arm.FEAT_I8MM" in asked


def test_the_evex_twin_runs_where_asked_and_avx512_vnni_is_there(monkeypatch: pytest.MonkeyPatch) -> None:
    on(monkeypatch, "Linux", "x86_64", AVX512_FLAGS)
    monkeypatch.setenv(kernels.ISA_ENV, "avxvnni-evex")
    assert kernels.choose_variant().name == "avxvnni-evex"
    on(monkeypatch, "Linux", "x86_64", "avx2 fma f16c avx_vnni")
    monkeypatch.setenv(kernels.ISA_ENV, "avxvnni-evex")
    with pytest.raises(KernelsUnavailable, match="lacks avx512_vnni, avx512vl"):
        kernels.choose_variant()


def test_a_variant_the_compiler_cannot_build_falls_back_to_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """GCC before 11 has no -mavxvnni: an AVX-VNNI laptop then runs avx2, and says so."""
    on(monkeypatch, "Linux", "x86_64", "avx2 fma f16c avx_vnni")
    monkeypatch.setattr(kernels, "_loaded", {})
    monkeypatch.setattr(kernels, "_fallen_back", {})
    monkeypatch.setattr(kernels, "build_dir", lambda chosen=None: Path("/nonexistent"))
    avx2_module = ModuleType("avx2 kernels")

    def load_library(library: Library, folder: Path, report: object = None) -> ModuleType:
        if "avxvnni" in library.name:
            raise BuildFailed("g++: error: unrecognized command-line option '-mavxvnni'")
        return avx2_module

    monkeypatch.setattr(kernels, "load_library", load_library)
    heard: list[str] = []
    assert kernels.load(heard.append) is avx2_module
    assert kernels.variant() == "avx2"
    assert heard == [
        "specchat's avxvnni CPU kernels did not build (g++: error: unrecognized command-line option "
        "'-mavxvnni'); trying the next"
    ]
