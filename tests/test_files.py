"""files.write_atomic: the one way specchat replaces a file (config, saved chats, kernel records)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specchat import files
from specchat.files import write_atomic


def test_the_file_is_replaced_whole_and_synced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", recording_fsync)
    target = tmp_path / "deep" / "settings.toml"
    write_atomic(target, "old")
    write_atomic(target, b"new \xe2\x9c\x93")
    assert target.read_text(encoding="utf-8") == "new ✓"
    assert len(synced) == 2
    assert [p.name for p in target.parent.iterdir()] == ["settings.toml"]


def test_two_writers_never_share_a_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fixed temporary name lets one writer rename the other's half-written file into place."""
    seen: list[str] = []
    real_replace = os.replace

    def recording_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        seen.append(str(src))
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", recording_replace)
    write_atomic(tmp_path / "a", "1")
    write_atomic(tmp_path / "a", "2")
    assert len(set(seen)) == 2


def test_a_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "chat.json"
    write_atomic(target, "kept")

    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", no_space)
    with pytest.raises(OSError, match="No space"):
        write_atomic(target, "lost")
    assert target.read_text() == "kept"
    assert [p.name for p in tmp_path.iterdir()] == ["chat.json"]


def test_a_fifo_nobody_writes_to_is_refused_after_its_wait(tmp_path: Path) -> None:
    import os
    import time

    from specchat.files import _read_fifo

    fifo = tmp_path / "prompt"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(OSError, match=r"a pipe \(FIFO\) that sent nothing for 0.5 s"):
        _read_fifo(fifo, 100, wait=0.5)
    assert time.monotonic() - started < 5


def test_a_fifo_with_a_writer_is_read_whole(tmp_path: Path) -> None:
    import os
    import threading

    from specchat.files import read_user_file

    fifo = tmp_path / "prompt"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb") as handle:
            handle.write(b"hello ")
            handle.flush()
            handle.write(b"there")

    writer = threading.Thread(target=write)
    writer.start()
    assert read_user_file(fifo, 100) == b"hello there"
    writer.join()
