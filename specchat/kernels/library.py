"""Building a C++ extension into its cache folder and loading it from there."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType


class KernelsUnavailable(RuntimeError):
    """The kernels cannot run here; the message says why."""


@dataclass(frozen=True)
class Library:
    """One extension module: its name (``PyInit_<name>``), its source and how it is compiled."""

    name: str
    source: Path
    cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()

    def path(self, folder: Path) -> Path:
        return folder / f"{self.name}.so"


def load_library(library: Library, folder: Path) -> ModuleType:
    """The extension built in ``folder`` (built there first if need be)."""
    return _build(library, folder)


def _build(library: Library, folder: Path) -> ModuleType:
    from torch.utils import cpp_extension

    folder.mkdir(parents=True, exist_ok=True)
    try:
        return cpp_extension.load(
            name=library.name,
            sources=[str(library.source)],
            extra_cflags=list(library.cflags),
            extra_ldflags=list(library.ldflags),
            build_directory=str(folder),
            verbose=bool(os.environ.get("SPECCHAT_KERNELS_VERBOSE")),
        )
    except (OSError, RuntimeError, ImportError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise KernelsUnavailable(f"building them failed ({first})") from err
