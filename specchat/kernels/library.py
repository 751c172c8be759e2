"""Building a C++ extension into its cache folder, and loading it from there only once it is known good.

A shared library is memory-mapped when it is loaded: one cut short on disk (a full disk, a copy
interrupted) kills the process with SIGBUS the moment a missing page is touched, which no
``except`` can catch. So the size and SHA-256 of each library are recorded beside it when it is
built, and compared (a few milliseconds) before every load. A library from before these records
is loaded once in a child process instead, and recorded if it survives.

A library that matches its record is imported directly, without torch's build machinery: that
machinery writes a lock file and ninja's state into the folder even when nothing needs building,
so it fails in a read-only folder that holds a perfectly good build.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

from specchat.errors import gist
from specchat.files import write_atomic
from specchat.untrusted import clipped, visible

Report = Callable[[str], None]
"""Where a line worth reading goes (the loader turns it into a loading notice)."""

PROBE_TIMEOUT_S = 300
"""A child that only imports torch and the library; generous because other work may share the CPU."""

# What the child runs: the same import as :func:`import_library`, spelled out so the child needs
# nothing but torch (specchat may be importable here only through the working directory).
_PROBE = (
    "import sys, importlib.util, torch\n"
    "spec = importlib.util.spec_from_file_location(sys.argv[1], sys.argv[2])\n"
    "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
)


class KernelsUnavailable(RuntimeError):
    """The kernels cannot run here; the message says why."""


class BuildFailed(KernelsUnavailable):
    """The compiler did not build the library (another variant may still build)."""


@dataclass(frozen=True)
class Library:
    """One extension module: its name (``PyInit_<name>``), its source and how it is compiled."""

    name: str
    source: Path
    cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()

    def path(self, folder: Path) -> Path:
        return folder / f"{self.name}.so"

    def record_path(self, folder: Path) -> Path:
        return folder / f"{self.name}.record.json"


@dataclass(frozen=True)
class Fingerprint:
    size: int
    sha256: str


def _log(message: str) -> None:
    logging.getLogger("specchat.kernels").warning(message)


def load_library(library: Library, folder: Path, report: Report | None = None) -> ModuleType:
    """The extension built in ``folder``: checked, then imported; built (or rebuilt) first if need be.

    Raises :class:`KernelsUnavailable` with a one-line reason where it can be neither loaded nor built.
    """
    path = library.path(folder)
    if path.exists():
        problem = damage(library, folder)
        if problem is None:
            return import_library(library.name, path)
        if not _writable(folder):
            raise KernelsUnavailable(f"{_shown(path)} is damaged ({problem}) and its folder is read-only")
        say = report or _log
        say(f"specchat's CPU kernels in {_shown(path)} are damaged ({problem}): rebuilding them (a minute)")
        _discard_build(library, folder)
    elif folder.is_dir() and not _writable(folder):
        raise KernelsUnavailable(f"{_shown(folder)} is read-only and holds no built library")
    module = _build(library, folder)
    _write_record(library, folder)
    return module


def damage(library: Library, folder: Path) -> str | None:
    """Why the built library must not be loaded into this process, or None if it may."""
    path = library.path(folder)
    expected = _read_record(library, folder)
    if expected is None:
        # Built by a specchat from before the records: a child takes the risk of loading it.
        problem = _fails_in_child(library.name, path)
        if problem is None:
            _write_record(library, folder)
        return problem
    size = path.stat().st_size
    if size != expected.size:
        return f"{size:,} bytes where {expected.size:,} were built"
    if fingerprint(path).sha256 != expected.sha256:
        return "its bytes differ from those built"
    return None


def fingerprint(path: Path) -> Fingerprint:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return Fingerprint(path.stat().st_size, digest.hexdigest())


def import_library(name: str, path: Path) -> ModuleType:
    """Import the extension module at ``path``, as torch's build machinery itself does once built."""
    import torch  # noqa: F401  (the library links torch's own libraries, found once torch is loaded)

    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise KernelsUnavailable(f"{_shown(path)} is not a loadable library")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as err:
        reason = visible(clipped(gist(str(err)) or "ImportError"))
        raise KernelsUnavailable(f"loading {_shown(path)} failed ({reason})") from err
    return module


def _fails_in_child(name: str, path: Path) -> str | None:
    """None if a child process loads the library, else what went wrong there."""
    command = [sys.executable, "-c", _PROBE, name, str(path)]
    try:
        child = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"loading it in a child process took over {PROBE_TIMEOUT_S} s"
    except OSError as err:
        return f"a child process to check it could not start ({err.strerror})"
    if child.returncode < 0:
        return f"loading it killed a child process with {_signal_name(-child.returncode)}"
    if child.returncode != 0:
        lines = child.stderr.strip().splitlines()
        said = visible(clipped(lines[-1])) if lines else f"exit status {child.returncode}"
        return f"loading it failed: {said}"
    return None


def _shown(path: Path) -> str:
    """A path for a one-line message (it may come from an environment variable)."""
    return visible(str(path))


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _read_record(library: Library, folder: Path) -> Fingerprint | None:
    """The recorded fingerprint; None where there is none or it cannot be read (then the child decides)."""
    try:
        data = json.loads(library.record_path(folder).read_text())
        return Fingerprint(int(data["size"]), str(data["sha256"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_record(library: Library, folder: Path) -> None:
    """Record the library's fingerprint; written whole or not at all, so a reader never sees half."""
    found = asdict(fingerprint(library.path(folder)))
    # A folder we cannot write: the library still loads, through the child check next time.
    with contextlib.suppress(OSError):
        write_atomic(library.record_path(folder), json.dumps(found) + "\n")


def _discard_build(library: Library, folder: Path) -> None:
    """Remove the library, its record and its object files, so the rebuild starts from the source.

    The object files go too: whatever damaged the library may have damaged them, and a library
    linked from them again would fail the same way on every start.
    """
    library.record_path(folder).unlink(missing_ok=True)
    library.path(folder).unlink(missing_ok=True)
    for stale in folder.glob("*.o"):
        stale.unlink(missing_ok=True)


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK)


def _build(library: Library, folder: Path) -> ModuleType:
    from torch.utils import cpp_extension

    compiler = cpp_extension.get_cxx_compiler()  # torch's choice: $CXX, else c++ (cl on Windows)
    if shutil.which(compiler) is None:
        raise KernelsUnavailable(
            f"they are compiled on first use, and the C++ compiler {visible(clipped(compiler, 80))!r} "
            "was not found: install one (Debian/Ubuntu: apt install g++; Fedora: dnf install gcc-c++; "
            "macOS: xcode-select --install) or name it in CXX"
        )
    _put_ninja_on_path()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return cpp_extension.load(
            name=library.name,
            sources=[str(library.source)],
            extra_cflags=list(library.cflags),
            extra_ldflags=list(library.ldflags),
            build_directory=str(folder),
            verbose=bool(os.environ.get("SPECCHAT_KERNELS_VERBOSE")),
        )
    except (OSError, RuntimeError, ImportError) as err:
        reason = gist(str(err)) or type(err).__name__
        raise BuildFailed(f"building them failed ({reason})") from err


def _put_ninja_on_path() -> None:
    """torch runs ``ninja`` from PATH; the ninja wheel (a dependency) puts it beside the venv's
    python, which is not on PATH when specchat is run as ``.venv/bin/specchat``."""
    try:
        import ninja
    except ImportError:  # a system ninja, if any, is what torch finds
        return
    path = os.environ.get("PATH", "")
    if ninja.BIN_DIR not in path.split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, path]) if path else ninja.BIN_DIR
