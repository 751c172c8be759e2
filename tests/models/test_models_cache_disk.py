"""A model cache that cannot be written: a file in its place, read-only, a full disk.

Each case gets one line saying what to do, exit status 2, no traceback, and nothing half-written
left behind or loaded. Simulated in-process (so they run everywhere), and for real on tiny tmpfs
mounts in a private user + mount namespace where the system allows one (`unshare -rm`).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from specchat.cli import main
from specchat.models.cache.paths import converted_dir, gguf_dir
from specchat.models.names import assemble
from specchat.models.names.catalog import PackagedModel

FIX = "set SPECCHAT_CACHE_DIR to a folder specchat can write to"


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECCHAT_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path / "data"))


def generate(target: str) -> tuple[int, str, str]:
    args = ["generate", "hello", "--target", target, "--drafter", "none", "--cpu-path", "none",
            "--max-new-tokens", "2"]  # fmt: skip
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def one_line_error(code: int, stderr: str) -> str:
    """The error line: the last on stderr (progress lines may come before it), no traceback."""
    assert code == 2, stderr
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("specchat: "), stderr
    return last


def nothing_cached(root: Path) -> None:
    written = [p for p in root.rglob("*") if p.is_file() and ".locks" not in p.parts] if root.is_dir() else []
    assert written == [], written


def all_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("target", ["packaged", "gguf"])
def test_cache_folder_is_a_file(
    target: str,
    tiny_packaged: PackagedModel,
    tiny_gguf: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache should be\n")
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(blocker))
    code, out, err = generate(tiny_packaged.name if target == "packaged" else str(tiny_gguf))
    line = one_line_error(code, err)
    assert line == (
        f"specchat: cannot use the model cache: {blocker} is a file, not a folder; "
        f"move it away or {FIX}"
    )
    assert out == "" and blocker.read_text() == "a file where the cache should be\n"


def test_a_kind_folder_is_a_file(tiny_packaged: PackagedModel, private_cache: Path) -> None:
    (private_cache / "gguf").write_text("oops")
    line = one_line_error(*generate(tiny_packaged.name)[::2])
    assert f"{private_cache / 'gguf'} is a file, not a folder" in line and FIX in line


def make_read_only(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every attempt to create or write a file or folder under `root` fails as on a read-only
    mount. (chmod would not stop a test running as root.)"""
    real_mkdir, real_open = os.mkdir, os.open
    prefix = str(root.resolve())

    def inside(path: object) -> bool:
        return os.path.abspath(os.fsdecode(path)).startswith(prefix)  # type: ignore[arg-type]

    def read_only(path: object) -> OSError:
        return OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))  # type: ignore[arg-type]

    def mkdir(path: object, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        if inside(path):
            if os.path.isdir(os.fsdecode(path)):  # type: ignore[arg-type]
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fsdecode(path))  # type: ignore[arg-type]
            raise read_only(path)
        real_mkdir(path, mode, dir_fd=dir_fd)  # type: ignore[arg-type]

    def open_(path: object, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if inside(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise read_only(path)
        return real_open(path, flags, mode, dir_fd=dir_fd)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os, "open", open_)


def test_read_only_empty_cache(tiny_gguf: Path, private_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_read_only(private_cache, monkeypatch)
    line = one_line_error(*generate(str(tiny_gguf))[::2])
    assert line == (
        f"specchat: cannot write to the model cache at {private_cache} (Read-only file system); "
        f"make it writable or {FIX}"
    )
    nothing_cached(private_cache)


def test_read_only_cache_that_holds_the_model_still_works(
    tiny_packaged: PackagedModel, private_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, first, _ = generate(tiny_packaged.name)
    assert code == 0
    before = all_files(private_cache)
    make_read_only(private_cache, monkeypatch)
    code, again, err = generate(tiny_packaged.name)
    assert code == 0 and again == first and "Traceback" not in err
    assert all_files(private_cache) == before


def test_full_disk_while_assembling(
    tiny_packaged: PackagedModel, private_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_copy = assemble._copy_chunks

    def copy_until_full(model, paths, out, progress):
        real_copy(model, paths[:1], out, progress)  # the first chunk fits, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(assemble, "_copy_chunks", copy_until_full)
    line = one_line_error(*generate(tiny_packaged.name)[::2])
    assert line == (
        f"specchat: the disk holding the model cache ({private_cache}) is full (No space left on device); "
        f"free some space, see what `specchat models` can clear, or set SPECCHAT_CACHE_DIR to a folder "
        f"on a disk with {tiny_packaged.size / 1e3:.0f} KB free"
    )
    nothing_cached(private_cache)


def test_full_disk_while_saving_the_conversion(
    tiny_gguf: Path, private_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers.modeling_utils
    from safetensors import SafetensorError

    def full(*args: object, **kwargs: object) -> None:
        # What safetensors raises on a full disk (seen on a real 100 KB tmpfs).
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full)
    line = one_line_error(*generate(str(tiny_gguf))[::2])
    assert "is full (No space left on device)" in line and "SPECCHAT_CACHE_DIR" in line
    nothing_cached(private_cache)


# ---------------------------------------------------------------- real mounts, where allowed


def _can_unshare() -> bool:
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt 2>/dev/null || "
         "mount -t tmpfs -o size=64k tmpfs \"$TMPDIR\""],
        capture_output=True, env={**os.environ, "TMPDIR": "/tmp"},
    )  # fmt: skip
    return probe.returncode == 0


needs_mounts = pytest.mark.skipif(not _can_unshare(), reason="no user+mount namespaces here (unshare -rm)")


def run_on_tmpfs(mount: Path, options: str, gguf: Path, setup: str = "") -> subprocess.CompletedProcess[str]:
    """`specchat generate` with its cache on a fresh tmpfs mounted at `mount` (private to it)."""
    mount.mkdir(parents=True, exist_ok=True)
    specchat = (
        f"{sys.executable} -m specchat generate hello --target {gguf} --drafter none --cpu-path none "
        "--max-new-tokens 2"
    )
    script = f"set -e; mount -t tmpfs -o {options} tmpfs {mount}; {setup} exec {specchat}"
    env = {**os.environ, "SPECCHAT_CACHE_DIR": str(mount / "cache")}
    return subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, env=env)


@pytest.mark.slow
@needs_mounts
def test_real_full_disk(tiny_gguf: Path, tmp_path: Path) -> None:
    # 200 KB: room for the lock files and some of the conversion's 300 KB, not all of it.
    done = run_on_tmpfs(tmp_path / "mnt", "size=200k", tiny_gguf, setup="")
    line = one_line_error(done.returncode, done.stderr)
    assert "is full (No space left on device)" in line and "SPECCHAT_CACHE_DIR" in line


@pytest.mark.slow
@needs_mounts
def test_real_read_only_mount(tiny_gguf: Path, tmp_path: Path) -> None:
    done = run_on_tmpfs(tmp_path / "mnt", "size=1m,ro", tiny_gguf)
    line = one_line_error(done.returncode, done.stderr)
    assert "cannot write to the model cache" in line and "Read-only file system" in line


@pytest.mark.slow
@needs_mounts
def test_real_read_only_mount_holding_the_conversion(tiny_gguf: Path, tmp_path: Path) -> None:
    mount = tmp_path / "mnt"
    convert_first = (
        f"SPECCHAT_CACHE_DIR={mount}/cache {sys.executable} -m specchat generate hello --target {tiny_gguf} "
        f"--drafter none --cpu-path none --max-new-tokens 2 >/dev/null 2>&1; mount -o remount,ro {mount};"
    )
    done = run_on_tmpfs(mount, "size=4m", tiny_gguf, setup=convert_first)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "converting" not in done.stderr
    assert not converted_dir().exists() and not gguf_dir().exists()  # all of it happened on the mount
