"""Packaged models: find their chunk packages and join the chunks into one verified GGUF.

The chunk packages are located with `find_spec`, never imported: importing is not needed to read a
data file, and some packagers' `__init__` drags in heavy dependencies (see docs/models.md and docs/lab/).
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import IO

from specchat.errors import ModelLoadError, ModelNotFoundError
from specchat.models.cache.paths import MISSING, cache_write_error, gguf_dir
from specchat.models.cache.writes import entry_lock, staged
from specchat.models.names.catalog import PackagedModel
from specchat.models.records import LoadProgress, ProgressCallback, Waiter, emit, notice

BLOCK = 8 << 20  # 8 MiB: large enough to stream at disk speed, small enough to report progress often


def locate_package(package: str) -> Path | None:
    """The folder of an installed package, or None. Tests replace this to point at temp chunks."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def chunk_paths(model: PackagedModel) -> list[Path]:
    """Every chunk file in order, or ModelNotFoundError naming the pip command that installs them."""
    paths = []
    for chunk in model.chunks:
        folder = locate_package(chunk.package)
        path = folder / chunk.relpath if folder is not None else None
        if path is None or not path.is_file():
            dist = chunk.package.replace("_", "-")
            raise ModelNotFoundError(
                f"{model.name} is not installed (package {dist} is missing); "
                f"install it with: {model.pip_hint}"
            )
        paths.append(path)
    return paths


def is_installed(model: PackagedModel) -> bool:
    try:
        chunk_paths(model)
    except ModelNotFoundError:
        return False
    return True


def packaged_gguf(
    model: PackagedModel,
    progress: ProgressCallback | None = None,
    *,
    verify: bool = False,
    wait: Waiter | None = None,
) -> Path:
    """The verified GGUF of a packaged model: shipped whole, or assembled once into the cache.

    An assembled file is trusted by its size and marker, unless `verify` asks to hash it (which
    every conversion does: converting a damaged file would cache damaged weights for good). A file
    found damaged is rebuilt from the chunks, which are hashed as they are joined, and said so.
    """
    paths = chunk_paths(model)
    if model.shipped_whole:
        return _verified_in_place(model, paths[0], progress)
    target = gguf_dir() / model.file
    waiter = wait or Waiter(model.name, progress)
    with entry_lock(target, f"assembling {model.name}", notify=waiter.notify, heartbeat=waiter.heartbeat):
        problem = _assembled_problem(model, target, progress, verify=verify)
        if problem is None:
            return target
        if problem != MISSING:
            damage = f"{model.file} in the model cache is damaged ({problem})"
            notice(progress, model.name, f"{damage}; rebuilding it from the verified chunks")
        return _assemble(model, paths, target, progress)


def sha256_file(path: Path, progress: ProgressCallback | None = None, name: str = "") -> str:
    digest = hashlib.sha256()
    total = path.stat().st_size
    with path.open("rb") as handle:
        while block := handle.read(BLOCK):
            digest.update(block)
            emit(progress, LoadProgress(name, "assemble", handle.tell(), total, f"verifying {name}"))
    return digest.hexdigest()


def marker_path(target: Path) -> Path:
    """Records that `target` was verified, so a start that does not convert skips hashing a gigabyte."""
    return target.with_name(target.name + ".sha256")


def _checksum_error(model: PackagedModel, found: str) -> ModelLoadError:
    return ModelLoadError(
        f"{model.name} is corrupt ({found}, expected sha256 {model.sha256[:12]}…); "
        f"reinstall it with: {model.pip_hint} --force-reinstall"
    )


def _verified_in_place(model: PackagedModel, path: Path, progress: ProgressCallback | None) -> Path:
    # Only reached when no converted copy exists yet, i.e. once: hashing 100 MB then is cheap.
    size = path.stat().st_size
    if size != model.size:
        raise _checksum_error(model, f"{path} has {size} bytes instead of {model.size}")
    actual = sha256_file(path, progress, model.name)
    if actual != model.sha256:
        raise _checksum_error(model, f"{path} has sha256 {actual[:12]}…")
    return path


def _assembled_problem(
    model: PackagedModel, target: Path, progress: ProgressCallback | None, *, verify: bool
) -> str | None:
    """None when `target` is the pinned file; MISSING when absent; else what is wrong with it."""
    if not target.is_file():
        return MISSING
    size = target.stat().st_size
    if size != model.size:
        return f"it has {size:,} bytes instead of {model.size:,}"
    marker = marker_path(target)
    if not verify and marker.is_file() and marker.read_text().strip() == model.sha256:
        return None
    # Asked to, or never verified (e.g. a crash between rename and marker): hash it.
    actual = sha256_file(target, progress, model.name)
    if actual != model.sha256:
        return f"its sha256 is {actual[:12]}… instead of {model.sha256[:12]}…"
    _write_marker(model, target)
    return None


def _write_marker(model: PackagedModel, target: Path) -> None:
    try:
        marker_path(target).write_text(model.sha256 + "\n")
    except OSError as err:
        raise cache_write_error(err, target.parent) from err


def _assemble(
    model: PackagedModel, paths: list[Path], target: Path, progress: ProgressCallback | None
) -> Path:
    """Concatenate into a staged file, hashing as we go, then rename: no half file ever has the name."""
    marker_path(target).unlink(missing_ok=True)
    try:
        with staged(target, folder=False) as tmp, tmp.open("wb") as out:
            actual = _copy_chunks(model, paths, out, progress)
            if actual != model.sha256:
                raise _checksum_error(model, f"its chunks join to sha256 {actual[:12]}…")
    except OSError as err:
        raise cache_write_error(err, target.parent, need=model.size) from err
    _write_marker(model, target)
    return target


def _copy_chunks(
    model: PackagedModel, paths: list[Path], out: IO[bytes], progress: ProgressCallback | None
) -> str:
    digest = hashlib.sha256()
    done = 0
    for index, path in enumerate(paths, start=1):
        message = f"assembling {model.name} chunk {index}/{len(paths)}"
        with path.open("rb") as chunk:
            while block := chunk.read(BLOCK):
                out.write(block)
                digest.update(block)
                done += len(block)
                emit(progress, LoadProgress(model.name, "assemble", done, model.size, message))
    return digest.hexdigest()
