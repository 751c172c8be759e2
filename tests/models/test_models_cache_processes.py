"""The model cache under real processes: signals during conversion, kill -9, two copies at once.

Each case runs `specchat generate` on the tiny GGUF in a subprocess. A small wrapper pauses the
conversion where its files are half written (inside the staged folder), so signals land exactly
there. Nothing half-written may ever be taken for a finished conversion.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from filelock import FileLock

from specchat.models import load_model
from specchat.models.cache import writes as store
from specchat.models.cache.paths import CONVERTED_MARKER, converted_dir
from specchat.models.records import LoadProgress

if sys.platform == "win32":  # pragma: no cover
    pytest.skip("POSIX signals", allow_module_level=True)

# Pauses conversion just after the tokenizer is written into the staged folder, says where, and
# waits there for a signal. The same hook works whatever specchat does around it.
PAUSE_IN_STAGING = """
import sys, time
from transformers import PreTrainedTokenizerBase
original = PreTrainedTokenizerBase.save_pretrained
def paused(self, folder, *args, **kwargs):
    result = original(self, folder, *args, **kwargs)
    print("STAGED", folder, flush=True)
    time.sleep(120)
    return result
PreTrainedTokenizerBase.save_pretrained = paused
from specchat.cli import main
main()
"""

# Holds the conversion's lock, as a slow conversion does, until the file named by $GO exists.
SLOW_CONVERSION = """
import os, time
from specchat.models.gguf import convert
original = convert._read_gguf
def slow(*args, **kwargs):
    print("CONVERTING", flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(os.environ["GO"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return original(*args, **kwargs)
convert._read_gguf = slow
from specchat.cli import main
main()
"""


@pytest.fixture
def env(private_cache: Path, tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "SPECCHAT_CACHE_DIR": str(private_cache),
        "SPECCHAT_CONFIG": str(tmp_path / "config.toml"),
        "SPECCHAT_DATA_DIR": str(tmp_path / "data"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture
def gguf(tiny_gguf: Path, tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    shutil.copy(tiny_gguf, path)
    return path


def generate_args(gguf: Path) -> list[str]:
    return ["generate", "hello", "--target", str(gguf), "--drafter", "none", "--cpu-path", "none",
            "--max-new-tokens", "2"]  # fmt: skip


def start(script: str, gguf: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *generate_args(gguf)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_for_line(
    proc: subprocess.Popen[str], prefix: str, timeout: float = 120, stream: str = "stdout"
) -> str:
    """The first line of `stream` that starts with `prefix` (the lines before it are consumed)."""
    pipe = getattr(proc, stream)
    assert pipe is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([pipe], [], [], 0.5)
        if ready:
            line = pipe.readline()
            if line.startswith(prefix):
                return line.strip()
            if not line and proc.poll() is not None:
                break
    proc.kill()
    raise AssertionError(f"never printed {prefix!r}; stderr: {proc.communicate()[1][-2000:]}")


def partials() -> list[Path]:
    root = converted_dir()
    return [p for p in root.iterdir() if store.PARTIAL in p.name] if root.is_dir() else []


def finished() -> list[Path]:
    root = converted_dir()
    return [p for p in root.iterdir() if not p.name.startswith(".")] if root.is_dir() else []


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "ctrl-c"])
def test_signal_during_conversion_leaves_nothing_behind(signum: int, gguf: Path, env: dict[str, str]) -> None:
    proc = start(PAUSE_IN_STAGING, gguf, env)
    staged = Path(wait_for_line(proc, "STAGED").split(" ", 1)[1])
    assert staged.is_dir() and any(staged.iterdir())  # half written, as a real kill would find it
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)

    said: dict[int, tuple[int, str]] = {
        signal.SIGTERM: (143, "specchat: stopped by SIGTERM."),
        signal.SIGINT: (130, "specchat: interrupted."),
    }
    assert proc.returncode == said[signum][0], stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == said[signum][1]
    assert not staged.exists() and partials() == [] and finished() == []

    # The next start converts from scratch and says nothing about damage.
    events: list[LoadProgress] = []
    load_model(str(gguf), device="cpu", progress=events.append)
    assert not [e for e in events if e.stage == "notice"]
    assert len(finished()) == 1 and (finished()[0] / CONVERTED_MARKER).is_file()


@pytest.mark.slow
def test_kill_9_leftovers_are_swept_at_the_next_start(gguf: Path, env: dict[str, str]) -> None:
    proc = start(PAUSE_IN_STAGING, gguf, env)
    staged = Path(wait_for_line(proc, "STAGED").split(" ", 1)[1])
    proc.kill()
    proc.communicate(timeout=60)
    assert partials() == [staged] and finished() == []  # nothing can clean up after kill -9...

    events: list[LoadProgress] = []
    load_model(str(gguf), device="cpu", progress=events.append)  # ...so the next start does
    said = [e.message for e in events if e.stage == "notice"]
    assert len(said) == 1 and "an interrupted specchat left in the model cache" in said[0]
    assert partials() == [] and len(finished()) == 1


def test_a_live_writers_temporary_is_never_swept(gguf: Path, tiny_gguf: Path) -> None:
    entry = converted_dir() / "other-0123456789ab"
    temporary = converted_dir() / f".{entry.name}{store.PARTIAL}live"
    temporary.mkdir(parents=True)
    (temporary / "model.safetensors").write_bytes(b"half written")
    writer = FileLock(str(store.lock_path(entry)))  # another process writing that entry
    writer.acquire()
    try:
        load_model(str(gguf), device="cpu")
        assert temporary.is_dir()
    finally:
        writer.release()
    load_model(str(gguf), device="cpu")
    assert not temporary.exists()


@pytest.mark.slow
def test_two_copies_convert_once_and_the_second_says_it_waits(
    gguf: Path, env: dict[str, str], tmp_path: Path
) -> None:
    env["GO"] = str(tmp_path / "go")
    first = start(SLOW_CONVERSION, gguf, env)
    wait_for_line(first, "CONVERTING")
    second = subprocess.Popen(
        [sys.executable, "-m", "specchat", *generate_args(gguf)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    holder = f"another specchat (pid {first.pid}) is converting tiny"
    assert wait_for_line(second, f"specchat: {holder}; waiting until it is done", stream="stderr")
    Path(env["GO"]).touch()
    out, err = first.communicate(timeout=300)
    second_out, second_err = second.communicate(timeout=300)

    assert first.returncode == 0 and second.returncode == 0, (err, second_err)
    assert "converting tiny (only once" in err
    assert "converting tiny" not in second_err and "waiting" not in second_err  # said once, above
    assert "Traceback" not in err + second_err
    assert partials() == [] and len(finished()) == 1
    assert second_out == out.replace("CONVERTING\n", "")  # greedy: the same reply from the same weights
