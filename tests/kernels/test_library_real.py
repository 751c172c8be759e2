"""The real kernels library, damaged or in a read-only folder.

tests/kernel_library/ covers every branch with a tiny extension on any CPU; these check the same
on the real library where its CPU runs it (the folder's conftest skips them elsewhere).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import specchat.kernels as kernels
from specchat.kernels import KERNELS_ENV, choose_variant
from tests.kernel_library.test_library_damage import read_only_mount, read_only_mounts_work

START = (
    "import specchat.kernels as k\n"
    "module = k.load(lambda line: print('notice:', line))\n"
    "print('loaded', hasattr(module, 'QMat'))\n"
)


@pytest.fixture
def copied(tmp_path: Path) -> Path:
    """A copy of the shared build (built and recorded first if need be), where $KERNELS_ENV will find it."""
    kernels.load()
    folder = tmp_path / "kernels" / kernels.build_dir().name
    shutil.copytree(kernels.build_dir(), folder)
    return folder


def start(folder: Path, read_only: bool = False) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", START]
    if read_only:
        command = read_only_mount(folder) + command
    env = {**os.environ, KERNELS_ENV: str(folder.parent)}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)


def test_the_real_library_loads_as_it_is_from_a_read_only_folder(copied: Path, tmp_path: Path) -> None:
    if not read_only_mounts_work(tmp_path):
        pytest.skip("no read-only bind mounts here (needs unshare and mount as root)")
    done = start(copied, read_only=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["loaded True"]


@pytest.mark.slow
def test_a_truncated_real_library_is_rebuilt_not_a_bus_error(copied: Path) -> None:
    path = choose_variant().library.path(copied)
    whole = path.stat().st_size
    with path.open("r+b") as file:
        file.truncate(whole // 2)
    done = start(copied)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "loaded True"
    assert any("damaged" in line for line in done.stdout.splitlines() if line.startswith("notice:"))
