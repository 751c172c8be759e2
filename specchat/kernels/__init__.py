"""specchat's own CPU kernels: linear layers on GGUF-quantized weights (see qgemm.cpp).

One C++ source (qgemm.cpp, the torch binding of the torch-free core/), built once per instruction
set (a *variant*: avx512, avxvnni, avx2, i8mm, neon or scalar; see isa/) on first use, with the
compiler PyTorch extensions use, into the cache folder; later starts check the built library against what was
recorded at build time and load it in milliseconds, from a read-only folder too (see library.py).
A damaged library is rebuilt where its folder can be written. Every variant computes the same
bits from the same packed weights.

:func:`load` runs the best variant this CPU can execute, or the one ``$SPECCHAT_CPU_ISA`` names
(where the compiler cannot build the best one, the next that builds, with a notice).
Where none can be loaded or built (no compiler, a CPU without AVX2 or ARM's dot product, a
damaged library in a read-only folder), it raises :class:`KernelsUnavailable` with the reason, and
callers fall back to the stock int8 path.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from specchat.kernels.library import BuildFailed, KernelsUnavailable, Library, Report, load_library

__all__ = [
    "KernelsUnavailable",
    "Variant",
    "build_dir",
    "choose_variant",
    "cpu_supports",
    "is_built",
    "load",
    "slow_reason",
    "variant",
]

SOURCE = Path(__file__).with_name("qgemm.cpp")
ISA_ENV = "SPECCHAT_CPU_ISA"
KERNELS_ENV = "SPECCHAT_KERNELS_DIR"
X86 = ("x86_64", "AMD64")
ARM64 = ("aarch64", "arm64")


def common_flags(system: str = sys.platform) -> tuple[str, ...]:
    """Compiler flags of every variant. Apple's clang has no -fopenmp; nothing needs it there, as
    the kernels' threads come from ATen's pool (OpenMP is only how torch's Linux builds run it)."""
    openmp = () if system == "darwin" else ("-fopenmp",)
    return ("-O3", *openmp, "-ffp-contract=off")


def link_flags(system: str = sys.platform) -> tuple[str, ...]:
    return () if system == "darwin" else ("-fopenmp",)


COMMON_FLAGS = common_flags()


@dataclass(frozen=True)
class Variant:
    """One build of the kernels: the instruction set it uses, what it needs of the CPU, its flags."""

    name: str
    cpu_flags: tuple[str, ...]
    """Flags of /proc/cpuinfo the CPU must list (none: any CPU)."""
    isa_flags: tuple[str, ...]
    machines: tuple[str, ...] = ()
    """The values of platform.machine() it runs on (none: any)."""
    fast: bool = True
    """False for the portable reference: ``auto`` runs it only where no fast variant runs, and
    says so (:func:`slow_reason`)."""
    header: str = ""
    """The isa/ header it is built with (SPECCHAT_ISA_<HEADER>); empty: its name's."""
    automatic: bool = True
    """False for a stand-in that runs only where $SPECCHAT_CPU_ISA names it."""

    @property
    def define(self) -> str:
        """The flag that selects its isa/ header."""
        return f"-DSPECCHAT_ISA_{(self.header or self.name).upper()}"

    @property
    def cflags(self) -> tuple[str, ...]:
        return (*COMMON_FLAGS, *self.isa_flags, self.define, f"-I{SOURCE.parent}")

    @property
    def library(self) -> Library:
        return Library(f"specchat_qgemm_{self.name.replace('-', '_')}", SOURCE, self.cflags, link_flags())


AVX512 = Variant(
    "avx512",
    ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c", "fma"),
    ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma"),
    X86,
)
# AVX2 with AVX-VNNI's 256-bit dpbusd (Intel Core 12th gen and later, Core Ultra; AMD Zen 5).
AVXVNNI = Variant(
    "avxvnni", ("avx2", "fma", "f16c", "avx_vnni"), ("-mavx2", "-mfma", "-mf16c", "-mavxvnni"), X86
)
# The same kernels with dpbusd in its EVEX encoding (AVX512-VNNI + VL), everything else AVX2: it
# stands in for avxvnni on a CPU with AVX-512 (isa/avxvnni.h), for tests and timing; never automatic.
AVXVNNI_EVEX = Variant(
    "avxvnni-evex",
    ("avx2", "fma", "f16c", "avx512_vnni", "avx512vl"),
    ("-mavx2", "-mfma", "-mf16c", "-DSPECCHAT_AVXVNNI_EVEX"),
    X86,
    header="avxvnni",
    automatic=False,
)
AVX2 = Variant("avx2", ("avx2", "fma", "f16c"), ("-mavx2", "-mfma", "-mf16c"), X86)
# ARM64 with the int8 matrix multiply (Linux lists it as i8mm; Apple M2 and later, Graviton 3 and 4):
# two rows per instruction in verify passes.
I8MM = Variant("i8mm", ("asimddp", "i8mm"), ("-march=armv8.6-a+i8mm",), ARM64)
# ARM64 with the dot-product instructions (Linux lists them as asimddp; every Apple arm64 CPU has them).
NEON = Variant("neon", ("asimddp",), ("-march=armv8.2-a+dotprod",), ARM64)
# Portable and exact, and many times slower than avx2 (docs/lab/2026-12-03-avx2-and-scalar.md): the
# last resort, never picked silently.
SCALAR = Variant("scalar", (), (), fast=False)
VARIANTS = (AVX512, AVXVNNI, AVXVNNI_EVEX, AVX2, I8MM, NEON, SCALAR)
"""Fastest first."""

REQUIRED_CPU_FLAGS = AVX512.cpu_flags
FLAGS = list(AVX512.cflags)
"""The AVX-512 build's flags (scripts/lab/ab_kernels.py builds variants of the source with them)."""

MACOS_FEATURES = {"i8mm": "hw.optional.arm.FEAT_I8MM"}
"""The sysctl that says whether an Apple CPU has each optional feature a variant needs."""


def _sysctl_says(name: str) -> bool:
    """Whether macOS's integer sysctl ``name`` is 1 (False where it does not exist or cannot be read)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        value, size = ctypes.c_int(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_int))
        found = libc.sysctlbyname(
            name.encode(), ctypes.byref(value), ctypes.byref(size), None, ctypes.c_size_t(0)
        )
    except (OSError, AttributeError):
        return False
    return found == 0 and value.value == 1


def _cpu_flags() -> set[str] | str:
    """The CPU's feature flags, or why they cannot be known."""
    if platform.system() == "Darwin" and platform.machine() in ARM64:
        # every Apple arm64 CPU has the dot product; M2 and later, the int8 matrix multiply
        return {"asimddp"} | {flag for flag, name in MACOS_FEATURES.items() if _sysctl_says(name)}
    if platform.system() != "Linux":
        where = f"{platform.system()} {platform.machine()}"
        return f"they are built for Linux and for macOS on arm64 (this is {where})"
    try:
        return set(Path("/proc/cpuinfo").read_text().split())
    except OSError as err:
        return f"cannot read the CPU's features: {err}"


def missing_for(candidate: Variant) -> str | None:
    """None if this CPU runs ``candidate``, else why not."""
    flags = _cpu_flags()
    if isinstance(flags, str):
        return flags
    if candidate.machines and platform.machine() not in candidate.machines:
        kind = "an x86-64" if candidate.machines == X86 else "an ARM64"
        return f"it needs {kind} CPU (this is {platform.machine()})"
    missing = [flag for flag in candidate.cpu_flags if flag not in flags]
    return f"this CPU lacks {', '.join(missing)}" if missing else None


def choose_variant() -> Variant:
    """The variant :func:`load` runs: ``$SPECCHAT_CPU_ISA``'s, else the fastest this CPU runs.

    The scalar build is the last resort where no fast one runs (:func:`slow_reason` says why).
    Raises :class:`KernelsUnavailable` where the one asked for is unknown or cannot run here, or
    where no variant can (an operating system the builds are not made for).
    """
    asked = os.environ.get(ISA_ENV, "").strip().lower()
    if asked:
        by_name = {v.name: v for v in VARIANTS}
        if asked not in by_name:
            raise KernelsUnavailable(f"{ISA_ENV}={asked}: unknown; use one of {', '.join(by_name)}")
        reason = missing_for(by_name[asked])
        if reason is not None:
            raise KernelsUnavailable(f"{ISA_ENV}={asked}: {reason}")
        return by_name[asked]
    for candidate in runnable():
        return candidate
    raise KernelsUnavailable(missing_for(SCALAR) or "no variant runs here")


def runnable() -> list[Variant]:
    """The variants ``auto`` may run on this CPU, fastest first (the scalar one last)."""
    return [v for v in VARIANTS if v.automatic and missing_for(v) is None]


def slow_reason() -> str | None:
    """Why ``auto`` runs the slow scalar build: no fast variant for this CPU (None where a fast one
    runs, or where $SPECCHAT_CPU_ISA chose the variant)."""
    if os.environ.get(ISA_ENV, "").strip() or any(v.fast for v in runnable()):
        return None
    here = [v for v in VARIANTS if v.fast and v.automatic and platform.machine() in v.machines]
    if not here:
        return f"no fast build for {platform.machine()} CPUs"
    return f"no {here[-1].name} build runs here: {missing_for(here[-1])}"  # the least demanding one


def cpu_supports() -> str | None:
    """None if this CPU runs the kernels (:func:`choose_variant` finds one), else why it cannot."""
    try:
        choose_variant()
    except KernelsUnavailable as err:
        return str(err)
    return None


def variant() -> str:
    """The name of the variant this process runs (or would load): avx512, avxvnni, avx2, i8mm, neon
    or scalar; where the best one did not build, the one :func:`load` fell back to."""
    chosen = choose_variant()
    return _fallen_back.get(chosen.name, chosen.name)


def build_dir(chosen: Variant | None = None) -> Path:
    """Where a variant's library lives: $SPECCHAT_KERNELS_DIR, else the cache folder's kernels/.

    Keyed by the sources, the torch version, the variant and its flags, so an upgrade rebuilds it,
    and by where the source lives: torch's build files name that path, so two installations sharing
    one cache would otherwise rebuild the library each time the other had used it.
    """
    import torch

    from specchat.cache_root import cache_dir

    chosen = chosen or choose_variant()
    headers = sorted((*SOURCE.parent.glob("isa/*.h"), *SOURCE.parent.glob("core/*.h")))
    parts = (
        *(path.read_bytes() for path in (SOURCE, *headers)),
        str(SOURCE.resolve()).encode(),
        torch.__version__.encode(),
        chosen.name.encode(),
        " ".join(chosen.cflags).encode(),
    )
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:12]
    override = os.environ.get(KERNELS_ENV)
    return (Path(override).expanduser() if override else cache_dir() / "kernels") / f"{chosen.name}-{key}"


_loaded: dict[str, ModuleType] = {}
_fallen_back: dict[str, str] = {}
"""A variant that did not build -> the one loaded in its place."""
_loading = threading.Lock()


def load(report: Report | None = None) -> ModuleType:
    """The compiled extension of :func:`choose_variant` (compiled on first use: the times of a build
    are in docs/lab/2026-12-05-kernel-widths.md).

    ``report`` hears the one line worth reading on the way (a damaged library being rebuilt, a
    variant the compiler could not build). Each variant is loaded once per process (tests load
    several side by side); a failure is not remembered, so a later call tries again. Where the
    variant was chosen automatically and does not build (a compiler too old for its instructions,
    such as AVX-VNNI before GCC 11), the next one this CPU runs is built instead.
    """
    chosen = choose_variant()
    with _loading:
        if chosen.name in _loaded:
            return _loaded[chosen.name]
        candidates = [chosen]
        if not os.environ.get(ISA_ENV, "").strip():
            candidates += [v for v in runnable() if v != chosen and v.fast == chosen.fast]
        for index, candidate in enumerate(candidates):
            try:
                module = _loaded.get(candidate.name) or load_library(
                    candidate.library, build_dir(candidate), report
                )
            except BuildFailed as err:
                if index == len(candidates) - 1:
                    raise
                say = report or _warn
                say(f"specchat's {candidate.name} CPU kernels did not build ({err}); trying the next")
                continue
            _loaded[candidate.name] = _loaded[chosen.name] = module
            if candidate != chosen:
                _fallen_back[chosen.name] = candidate.name
            return module
        raise AssertionError("not reached: the last candidate returns or raises")


def _warn(message: str) -> None:
    import logging

    logging.getLogger("specchat.kernels").warning(message)


def is_built() -> bool:
    chosen = choose_variant()
    return chosen.library.path(build_dir(chosen)).exists()
