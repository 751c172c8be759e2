"""Where the model cache lives, how it is laid out, and one clear line when it cannot be used.

Layout: ``<root>/<kind>/<entry>``. A *kind* is any visible folder under the root (``gguf``: packaged
models assembled from their chunks; ``converted``: GGUF files saved as safetensors; more may come),
and an *entry* is one file or folder in it. Name an entry after the model it belongs to (the
packaged name, then ``-`` and anything; or the assembled file's name): `specchat models` then
lists and clears it under that model without knowing the kind. Hidden names are the cache's own
bookkeeping: ``.locks/`` at the root, and ``.<entry>.partial-<random>`` beside an entry while it is
being written (see specchat.models.cache.writes).
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

# Re-exported: the model cache's callers know them from here.
from specchat.cache_root import CACHE_ENV as CACHE_ENV
from specchat.cache_root import cache_dir as cache_dir
from specchat.errors import ModelLoadError

PARTIAL = ".partial-"
"""Marks a temporary beside an entry: ``.<entry>.partial-<random>``."""
LOCKS = ".locks"

_READ_ONLY = {errno.EACCES, errno.EPERM, errno.EROFS}
_NOT_A_FOLDER = {errno.EEXIST, errno.ENOTDIR}
_FULL = {errno.ENOSPC, errno.EDQUOT}


class CacheError(ModelLoadError):
    """The cache folder cannot be written (a file in the way, read-only, full)."""


def public_mode(mode: int) -> int:
    """`mode` less the process umask: what a plainly created file or folder would get."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


def gguf_dir() -> Path:
    """Packaged models assembled from their chunks."""
    return cache_dir() / "gguf"


def converted_dir() -> Path:
    """GGUF models dequantized once and saved as safetensors, so later starts take seconds."""
    return cache_dir() / "converted"


MISSING = "missing"
"""Said of a cache entry that was never written: not damage, just work to do."""

CONVERTED_MARKER = "specchat.json"
"""Written last into a converted folder: its presence means the conversion finished."""


ENTRY_NAME_LIMIT = 80
"""Characters of a model's name kept in its cache entries' names (the rest is a hash)."""
_UNSAFE = re.compile(r"[^\w.+-]+")


def safe_entry_name(name: str) -> str:
    """``name`` fit to name a folder: letters, digits, ``. _ + -`` only (a file's name may hold a
    slash, a control sequence, or start with the dot that marks the cache's own bookkeeping), and
    at most ENTRY_NAME_LIMIT characters. What the cache lists is then safe to print as it is."""
    safe = _UNSAFE.sub("_", name).lstrip(".")[:ENTRY_NAME_LIMIT]
    return safe or "model"


def is_converted(folder: Path) -> bool:
    return (folder / CONVERTED_MARKER).is_file()


def kind_dirs() -> list[Path]:
    """Every kind of thing cached, found on disk: a new kind shows up without being declared."""
    root = cache_dir()
    try:
        return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:  # no cache yet, or not a folder: nothing is cached
        return []


def ensure_dir(folder: Path) -> Path:
    """Create `folder` (and its parents) or raise CacheError with what to do about it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise cache_write_error(err, folder) from err
    if not folder.is_dir():
        raise cache_write_error(OSError(errno.EEXIST, os.strerror(errno.EEXIST)), folder)
    return folder


def cache_write_error(err: OSError, path: Path, *, need: int | None = None) -> CacheError:
    """One line for an OSError met while writing under the cache: what is wrong and what to do."""
    fix = f"set {CACHE_ENV} to a folder specchat can write to"
    if err.errno in _NOT_A_FOLDER:
        blocker = _file_in_the_way(path)
        return CacheError(
            f"cannot use the model cache: {blocker} is a file, not a folder; move it away or {fix}"
        )
    if err.errno in _READ_ONLY:
        return CacheError(
            f"cannot write to the model cache at {cache_dir()} ({err.strerror or 'read-only'}); "
            f"make it writable or {fix}"
        )
    if err.errno in _FULL:
        wanted = f" with {human_bytes(need)} free" if need else ""
        return CacheError(
            f"the disk holding the model cache ({cache_dir()}) is full ({err.strerror or 'no space'}); "
            f"free some space, see what `specchat models` can clear, or set {CACHE_ENV} to a folder "
            f"on a disk{wanted}"
        )
    return CacheError(f"cannot write {path} ({err.strerror or err}); {fix}")


def human_bytes(size: float) -> str:
    """1.1 GB, 491 MB, 323 KB, 17 B: decimal units, as disks are sold and `df -H` shows."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}" if size < 10 * scale else f"{size / scale:,.0f} {unit}"
    return f"{size:.0f} B"


def _file_in_the_way(path: Path) -> Path:
    """The first of `path` and its parents that exists and is not a folder (else `path`)."""
    for candidate in [*reversed(path.parents), path]:
        if candidate.exists() and not candidate.is_dir():
            return candidate
    return path
