"""specchat's own CPU kernels: linear layers on GGUF-quantized weights (see qgemm.cpp).

The C++ source is compiled once, on first use, with the compiler PyTorch extensions use, into
the cache folder; later starts check the built library against what was recorded at build time
and load it in milliseconds, from a read-only folder too (see library.py). A damaged library is
rebuilt where its folder can be written. Where the kernels can neither be loaded nor built (no
compiler, no AVX-512 VNNI, a damaged library in a read-only folder), :func:`load` raises
:class:`KernelsUnavailable` with the reason, and callers fall back to the stock int8 path.
"""

from __future__ import annotations

import hashlib
import os
import platform
import threading
from pathlib import Path
from types import ModuleType

from specchat.kernels.library import KernelsUnavailable, Library, Report, load_library

__all__ = ["KernelsUnavailable", "build_dir", "cpu_supports", "is_built", "load"]

SOURCE = Path(__file__).with_name("qgemm.cpp")
REQUIRED_CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c", "fma")
FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma", "-fopenmp"]
QGEMM = Library("specchat_qgemm", SOURCE, tuple(FLAGS), ("-fopenmp",))


def cpu_supports() -> str | None:
    """None if this CPU runs the kernels, else the reason it cannot."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"they are built for x86-64 Linux (this is {platform.system()} {platform.machine()})"
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError as err:
        return f"cannot read the CPU's features: {err}"
    missing = [flag for flag in REQUIRED_CPU_FLAGS if flag not in flags]
    return f"this CPU lacks {', '.join(missing)}" if missing else None


KERNELS_ENV = "SPECCHAT_KERNELS_DIR"


def build_dir() -> Path:
    """Where the built library lives: $SPECCHAT_KERNELS_DIR, else the cache folder's kernels/.

    Keyed by the source, the torch version and the flags, so an upgrade rebuilds it, and by where
    the source lives: torch's build files name that path, so two installations sharing one cache
    would otherwise rebuild the library each time the other had used it.
    """
    import torch

    from specchat.models.cache import cache_dir

    parts = (
        SOURCE.read_bytes(),
        str(SOURCE.resolve()).encode(),
        torch.__version__.encode(),
        " ".join(FLAGS).encode(),
    )
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:12]
    override = os.environ.get(KERNELS_ENV)
    return (Path(override).expanduser() if override else cache_dir() / "kernels") / key


_loaded: list[ModuleType] = []
_loading = threading.Lock()


def load(report: Report | None = None) -> ModuleType:
    """The compiled extension (built on first use: about a minute on 2 cores).

    ``report`` hears the one line worth reading on the way (a damaged library being rebuilt).
    Loaded once per process; a failure is not remembered, so a later call tries again.
    """
    with _loading:
        if not _loaded:
            reason = cpu_supports()
            if reason is not None:
                raise KernelsUnavailable(reason)
            _loaded.append(load_library(QGEMM, build_dir(), report))
        return _loaded[0]


def is_built() -> bool:
    return QGEMM.path(build_dir()).exists()
