"""Where the kernels are built: one folder per source file, so installations sharing a cache
do not rebuild each other's library."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import specchat.kernels as kernels


def test_the_same_source_in_two_places_builds_in_two_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = kernels.build_dir()
    copy = tmp_path / "elsewhere" / kernels.SOURCE.name
    copy.parent.mkdir()
    shutil.copy(kernels.SOURCE, copy)
    monkeypatch.setattr(kernels, "SOURCE", copy)
    assert kernels.build_dir() != here
    assert kernels.build_dir().parent == here.parent  # still under the one kernels folder
    assert kernels.build_dir() == kernels.build_dir()  # and stable
