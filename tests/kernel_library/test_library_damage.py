"""A damaged or read-only kernels folder: no crash, no silent slow start.

These run on any CPU: a tiny extension module stands in for the kernels (whose library needs
AVX-512 to load), built by the same code into a temporary folder. Every start runs in a child
process, because a truncated library kills its process with SIGBUS.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specchat.kernels.library import Library

NAME = "specchat_tiny_library"
SOURCE = f"""
#include <Python.h>
static PyModuleDef module = {{PyModuleDef_HEAD_INIT, "{NAME}", nullptr, -1, nullptr}};
PyMODINIT_FUNC PyInit_{NAME}(void) {{ return PyModule_Create(&module); }}
"""

# A start: load the library from the folder given, saying what happened on stdout.
START = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from specchat.kernels.library import KernelsUnavailable, Library, load_library

    library = Library(sys.argv[1], Path(sys.argv[2]))
    try:
        module = load_library(library, Path(sys.argv[3]), lambda line: print("notice:", line))
    except KernelsUnavailable as err:
        print("unavailable:", err)
        sys.exit(3)
    print("loaded", module.__name__)
    """
)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("source") / "tiny.cpp"
    path.write_text(SOURCE)
    return path


@pytest.fixture(scope="module")
def built(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A good build of the tiny library, with its record: copied by each test, never changed."""
    folder = tmp_path_factory.mktemp("built") / "kernels"
    done = start(source, folder)
    assert done.returncode == 0 and "loaded" in done.stdout, done.stdout + done.stderr
    return folder


@pytest.fixture
def library(source: Path) -> Library:
    return Library(NAME, source)


@pytest.fixture
def folder(built: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "kernels"
    shutil.copytree(built, copy)
    return copy


def start(source: Path, folder: Path, read_only: bool = False) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", START, NAME, str(source), str(folder)]
    if read_only:
        command = read_only_mount(folder) + command
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def read_only_mount(folder: Path) -> list[str]:
    """A command prefix that runs the rest with ``folder`` bind-mounted read-only over itself.

    Tests run as root, where permission bits stop no write: only a read-only mount does.
    """
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && shift && exec "$@"'
    return ["unshare", "--mount", "sh", "-c", script, str(folder), "--"]


def read_only_mounts_work(tmp_path: Path) -> bool:
    probe = tmp_path / "probe"
    probe.mkdir()
    try:
        done = subprocess.run(
            [*read_only_mount(probe), "touch", str(probe / "file")], capture_output=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return b"Read-only" in done.stderr


def notices(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stdout.splitlines() if line.startswith("notice:")]


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every entry's size and modification time, the folder's own included."""
    entries = [folder, *sorted(folder.rglob("*"))]
    return {str(entry): (entry.stat().st_size, entry.stat().st_mtime_ns) for entry in entries}


@pytest.mark.slow
def test_a_truncated_library_is_rebuilt_with_one_line_not_a_bus_error(library: Library, folder: Path) -> None:
    path = library.path(folder)
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    done = start(library.source, folder)
    assert done.returncode == 0, done.stdout + done.stderr  # -7 (SIGBUS) before the fix
    assert "loaded" in done.stdout
    [line] = notices(done)
    assert str(path) in line and "damaged" in line and "rebuilding" in line
    assert path.stat().st_size == len(whole)  # and the next start is a plain load
    again = start(library.source, folder)
    assert again.returncode == 0 and not notices(again)


def test_a_library_with_its_first_bytes_overwritten_is_rebuilt(library: Library, folder: Path) -> None:
    path = library.path(folder)
    with path.open("r+b") as file:
        file.write(b"\xff" * 128)
    done = start(library.source, folder)
    assert done.returncode == 0 and "loaded" in done.stdout, done.stdout + done.stderr
    [line] = notices(done)
    assert "damaged" in line


@pytest.mark.slow
def test_a_truncated_library_from_before_the_records_is_rebuilt(library: Library, folder: Path) -> None:
    library.record_path(folder).unlink(missing_ok=True)  # as an earlier specchat left it
    path = library.path(folder)
    path.write_bytes(path.read_bytes()[:9000])
    done = start(library.source, folder)
    assert done.returncode == 0 and "loaded" in done.stdout, done.stdout + done.stderr
    [line] = notices(done)
    assert "SIGBUS" in line or "loading it failed" in line


@pytest.mark.slow
def test_a_good_library_from_before_the_records_is_recorded_not_rebuilt(
    library: Library, folder: Path
) -> None:
    library.record_path(folder).unlink(missing_ok=True)
    before = library.path(folder).stat().st_mtime_ns
    done = start(library.source, folder)
    assert done.returncode == 0 and "loaded" in done.stdout, done.stdout + done.stderr
    assert not notices(done)
    assert library.path(folder).stat().st_mtime_ns == before
    assert library.record_path(folder).exists()


def test_loading_a_good_build_writes_nothing_into_its_folder(library: Library, folder: Path) -> None:
    before = snapshot(folder)
    done = start(library.source, folder)
    assert done.returncode == 0 and "loaded" in done.stdout, done.stdout + done.stderr
    assert not notices(done)
    assert snapshot(folder) == before


def test_a_good_build_in_a_read_only_folder_is_used_as_it_is(
    library: Library, folder: Path, tmp_path: Path
) -> None:
    if not read_only_mounts_work(tmp_path):
        pytest.skip("no read-only bind mounts here (needs unshare and mount as root)")
    done = start(library.source, folder, read_only=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "loaded" in done.stdout and not notices(done)


def test_a_damaged_library_in_a_read_only_folder_is_named_in_one_line(
    library: Library, folder: Path, tmp_path: Path
) -> None:
    if not read_only_mounts_work(tmp_path):
        pytest.skip("no read-only bind mounts here (needs unshare and mount as root)")
    path = library.path(folder)
    path.write_bytes(path.read_bytes()[:9000])
    done = start(library.source, folder, read_only=True)
    assert done.returncode == 3, done.stdout + done.stderr
    [line] = done.stdout.splitlines()
    assert line.startswith("unavailable:") and str(path) in line and "read-only" in line
    assert "Traceback" not in done.stderr


def test_an_empty_read_only_folder_says_so(library: Library, tmp_path: Path) -> None:
    if not read_only_mounts_work(tmp_path):
        pytest.skip("no read-only bind mounts here (needs unshare and mount as root)")
    empty = tmp_path / "kernels"
    empty.mkdir()
    done = start(library.source, empty, read_only=True)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "read-only" in done.stdout and "no built library" in done.stdout
