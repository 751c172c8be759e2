"""Unexpected errors: one line that names the log file; the traceback is in the log (rotated)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from specchat import logs, opening
from specchat.cli import main


@pytest.fixture(autouse=True)
def no_debug() -> Iterator[None]:
    logs.set_debug(False)
    yield
    logs.set_debug(False)


def boom(*args: object, **kwargs: object) -> None:
    raise RuntimeError("the disk controller said no\nsecond line of detail")


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_an_unexpected_error_is_one_line_and_its_traceback_is_logged(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(opening, "open_backend", boom)
    code, out, err = run("generate", "hello", "--drafter", "ngram")
    log = tmp_path / "data" / "logs" / "specchat.log"
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [
        f"specchat: unexpected error: RuntimeError: the disk controller said no (details in {log}; "
        "--debug prints them)."
    ]
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "in boom" in text
    assert "second line of detail" in text


@pytest.mark.parametrize("where", [("--debug", "generate"), ("generate", "--debug")])
def test_debug_also_prints_the_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, where: tuple[str, str]
) -> None:
    monkeypatch.setattr(opening, "open_backend", boom)
    args = (
        [*where, "hello", "--drafter", "ngram"] if where[0] == "--debug" else ["generate", "hello", "--debug"]
    )
    code, _, err = run(*args)
    assert code == 1
    assert "Traceback (most recent call last)" in err and "in boom" in err
    assert err.strip().splitlines()[-1].startswith("specchat: unexpected error: RuntimeError")


def test_the_log_rotates(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(logs, "MAX_BYTES", 4000)
    for n in range(60):
        try:
            raise ValueError(f"failure number {n} " + "x" * 200)
        except ValueError as err:
            logs.log_unexpected("testing", err)
    folder = tmp_path / "data" / "logs"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["specchat.log", "specchat.log.1", "specchat.log.2", "specchat.log.3"]
    assert "failure number 59" in (folder / "specchat.log").read_text()


def test_an_unwritable_log_still_gives_the_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = tmp_path / "data-is-a-file"
    blocker.write_text("")
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(blocker))
    monkeypatch.setattr(opening, "open_backend", boom)
    code, _, err = run("generate", "hello", "--drafter", "ngram")
    assert code == 1
    assert "RuntimeError: the disk controller said no (no log could be written" in err


@pytest.mark.slow
def test_a_closed_output_pipe_ends_quietly(tiny_folders: tuple[Path, Path], tmp_path: Path) -> None:
    """`specchat generate … | head -1`: the reader goes away; no error, no traceback."""
    import os
    import subprocess
    import sys

    target, draft = tiny_folders
    command = [sys.executable, "-m", "specchat", "generate", "abc abc", "--target", str(target)]
    command += ["--draft", str(draft), "--max-new-tokens", "200", "--format", "jsonl", "--cpu-path", "none"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy())
    assert process.stdout is not None and process.stderr is not None
    process.stdout.readline()
    process.stdout.close()
    err = process.stderr.read().decode()
    assert process.wait(60) == 141
    assert "Traceback" not in err and "error" not in err, err


def test_debug_keeps_tracebacks_for_the_chat_to_print_after_it_closes() -> None:
    logs.debug_tracebacks()
    logs.set_debug(True)
    try:
        raise OSError("no such device")
    except OSError as err:
        logs.log_unexpected("the reply failed", err)
    kept = logs.debug_tracebacks()
    assert len(kept) == 1 and "OSError: no such device" in kept[0] and "Traceback" in kept[0]
    assert logs.debug_tracebacks() == [], "printed once"
