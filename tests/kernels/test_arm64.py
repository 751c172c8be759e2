"""The kernels' torch-free core on other instruction sets: the ARM64 builds (neon, i8mm) checked under
qemu against the x86 results and avxvnni's VEX build compiled (scripts/check_arm64.sh), the C++
driver on each x86 variant this CPU runs, and the flags and variant each platform and CPU gets."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

import specchat.kernels as kernels
from specchat.kernels import NEON, VARIANTS, KernelsUnavailable, Variant, missing_for
from specchat.kernels.library import BuildFailed, Library

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tests" / "kernels" / "cpp" / "driver.cpp"
SCRIPT = ROOT / "scripts" / "check_arm64.sh"
CROSS_TOOLS = ("g++", "aarch64-linux-gnu-g++", "qemu-aarch64")
BUILD_TIMEOUT_S = 600
"""Generous: the machine's few cores may be shared."""


def lines(output: str, verdict: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(verdict + " ")]


@pytest.mark.native
def test_neon_and_i8mm_under_qemu_give_the_scalar_bits() -> None:
    absent = [tool for tool in CROSS_TOOLS if shutil.which(tool) is None]
    if absent:
        pytest.skip(f"{', '.join(absent)} not found (Debian: g++-aarch64-linux-gnu qemu-user)")
    if platform.machine() != "x86_64":
        pytest.skip("the script compares with the x86-64 build's outputs")
    done = subprocess.run([SCRIPT], capture_output=True, text=True, timeout=3 * BUILD_TIMEOUT_S, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert not lines(output, "FAIL"), output
    for arm in ("neon", "i8mm"):
        passed = [line for line in lines(output, "PASS") if line.startswith(f"PASS aarch64 {arm}:")]
        # rows of six kinds, the layer's rows, then operations, matrices, layer
        assert len(passed) == 10, output
    # avxvnni's VEX build at least compiles (the laptops' build; no CI machine runs it)
    assert any(line.startswith("PASS x86-64 avxvnni:") for line in lines(output, "PASS")), output


def build(variant: Variant, folder: Path) -> Path:
    binary = folder / variant.name
    command = [
        "g++",
        "-std=c++17",
        *(flag for flag in kernels.common_flags() if flag != "-fopenmp"),  # the driver runs one thread
        *variant.isa_flags,
        variant.define,
        f"-I{kernels.SOURCE.parent}",
        str(DRIVER),
        "-o",
        str(binary),
    ]
    subprocess.run(command, check=True, timeout=BUILD_TIMEOUT_S)
    (folder / f"out-{variant.name}").mkdir()
    return binary


@pytest.fixture(scope="module")
def scalar_outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scalar driver's outputs on this machine: the reference every variant must equal."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not found")
    folder = tmp_path_factory.mktemp("driver")
    binary = build(kernels.SCALAR, folder)
    subprocess.run([binary, folder / "out-scalar"], check=True, capture_output=True, timeout=BUILD_TIMEOUT_S)
    return folder / "out-scalar"


X86_VARIANTS = [v for v in VARIANTS if "x86_64" in v.machines or not v.machines]


@pytest.mark.native
@pytest.mark.parametrize("variant", X86_VARIANTS, ids=[v.name for v in X86_VARIANTS])
def test_the_driver_passes_on_each_variant_this_cpu_runs(
    variant: Variant, scalar_outputs: Path, tmp_path: Path
) -> None:
    reason = missing_for(variant)
    if reason is not None:
        pytest.skip(f"the {variant.name} kernels cannot run here: {reason}")
    binary = build(variant, tmp_path)
    done = subprocess.run(
        [binary, tmp_path / f"out-{variant.name}", scalar_outputs, "scalar", "0"],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0 and not lines(done.stdout, "FAIL"), done.stdout + done.stderr
    assert len(lines(done.stdout, "PASS")) == 10, done.stdout


def test_apple_clang_gets_no_openmp() -> None:
    assert "-fopenmp" not in kernels.common_flags("darwin")
    assert kernels.link_flags("darwin") == ()
    assert "-fopenmp" in kernels.common_flags("linux")
    assert kernels.link_flags("linux") == ("-fopenmp",)
    for flags in (kernels.common_flags("darwin"), kernels.common_flags("linux")):
        assert "-ffp-contract=off" in flags  # the exactness rule holds on every platform


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
