"""The kernels' torch-free core on other instruction sets: the ARM64 builds (neon, i8mm) checked under
qemu against the x86 results and avxvnni's VEX build compiled (scripts/check_arm64.sh), the C++
driver on each x86 variant this CPU runs, and the compiler flags each platform gets. Which variant
a CPU gets is tests/kernel_library/test_isa_choice.py's."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

import specchat.kernels as kernels
from specchat.kernels import VARIANTS, Variant, missing_for

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
