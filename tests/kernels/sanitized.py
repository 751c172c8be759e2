"""specchat's CPU kernels built with AddressSanitizer and UndefinedBehaviorSanitizer, for tests that
run hostile inputs through them (tests/corpus/test_hostile_models.py).

The library is the same source as the shipped one (qgemm.cpp and core/), built with the variant
this CPU runs plus ``-fsanitize=address,undefined``, into its own folder of the kernels cache
(keyed by the sources and flags, so it is built once per change: a few minutes). A process loads
it with the sanitizers' runtime first: ``LD_PRELOAD`` names libasan (python itself is not
instrumented), see :func:`sanitizer_environment`.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from types import ModuleType

from specchat import kernels
from specchat.kernels.library import Library, load_library

SANITIZE = ("-fsanitize=address,undefined", "-fno-omit-frame-pointer")
NAME = "specchat_qgemm_sanitized"


def sanitized_library() -> tuple[Library, Path]:
    variant = kernels.choose_variant()
    # -O0 after the variant's -O3: the instrumented torch headers compile faster (608 s against 800 s
    # at -O1, both on a 2-core VM under a load of 9), and the tiny models the tests run need no speed.
    library = Library(
        NAME, kernels.SOURCE, (*variant.cflags, "-O0", "-g1", *SANITIZE), (*kernels.link_flags(), *SANITIZE)
    )
    sources = sorted(
        (kernels.SOURCE, *kernels.SOURCE.parent.glob("core/*.h"), *kernels.SOURCE.parent.glob("isa/*.h"))
    )
    key = hashlib.sha256(b"\0".join([*(p.read_bytes() for p in sources), " ".join(library.cflags).encode()]))
    import torch

    key.update(torch.__version__.encode())
    return library, kernels.build_dir(variant).parent / f"sanitized-{variant.name}-{key.hexdigest()[:12]}"


def load_sanitized() -> ModuleType:
    """The sanitized library, built first if need be (call it in a process started with
    :func:`sanitizer_environment`: loading it into any other process fails)."""
    library, folder = sanitized_library()
    return load_library(library, folder)


def runtime(name: str) -> str | None:
    """The sanitizer runtime shared library the compiler links against, if it has one."""
    try:
        found = subprocess.run(
            ["gcc", f"-print-file-name={name}"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = found.stdout.strip()
    return path if os.path.isabs(path) and Path(path).exists() else None


def sanitizer_environment() -> dict[str, str] | None:
    """Variables for a child python that loads the sanitized library; None where gcc has no ASan
    runtime. libstdc++ is preloaded after libasan: python does not link it, and ASan's interceptor
    of C++ throws must find it when it starts (else the first exception aborts). Leak detection is
    off (python's own allocations are never freed at exit); the first error of either sanitizer
    ends the process with its report on stderr."""
    asan, cxx = runtime("libasan.so"), runtime("libstdc++.so.6")
    if asan is None or cxx is None:
        return None
    return {
        "LD_PRELOAD": f"{asan} {cxx}",
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:halt_on_error=1:exitcode=86",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:exitcode=87",
    }
