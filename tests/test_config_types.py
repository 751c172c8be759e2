"""Settings that are numbers refuse true/false, budgets have a ceiling, and the config file is
read only when it is a file of sane size."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specchat.config import (
    MAX_NEW_TOKENS_LIMIT,
    NUMBER_SETTINGS,
    SERVER_TIMEOUT_LIMIT,
    Settings,
    load_settings,
    update_config_file,
)
from specchat.errors import InvalidSettingError
from specchat.files import CONFIG_LIMIT


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config.toml"
    monkeypatch.setenv("SPECCHAT_CONFIG", str(path))
    for name in Settings.model_fields:
        monkeypatch.delenv(f"SPECCHAT_{name.upper()}", raising=False)
    return path


@pytest.mark.parametrize("name", NUMBER_SETTINGS)
@pytest.mark.parametrize("word", ["true", "false"])
def test_a_boolean_in_the_file_is_not_a_number(config_file: Path, name: str, word: str) -> None:
    config_file.write_text(f"{name} = {word}\n", encoding="utf-8")
    with pytest.raises(InvalidSettingError) as caught:
        load_settings()
    message = str(caught.value)
    assert f"{name} = {word} in {config_file}" in message
    assert "number, not true or false" in message


@pytest.mark.parametrize("name", NUMBER_SETTINGS)
def test_a_boolean_passed_as_a_flag_is_not_a_number(config_file: Path, name: str) -> None:
    with pytest.raises(InvalidSettingError, match="not true or false"):
        load_settings({name: True})


@pytest.mark.parametrize("name", ["gamma", "max_new_tokens", "temperature", "server_timeout"])
def test_a_boolean_word_in_a_variable_is_not_a_number(
    config_file: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(f"SPECCHAT_{name.upper()}", "true")
    with pytest.raises(InvalidSettingError, match=f"SPECCHAT_{name.upper()}=true"):
        load_settings()


def test_the_largest_budget_is_accepted_and_one_more_is_not(config_file: Path) -> None:
    assert load_settings({"max_new_tokens": MAX_NEW_TOKENS_LIMIT}).max_new_tokens == MAX_NEW_TOKENS_LIMIT
    config_file.write_text(f"max_new_tokens = {10**20}\n", encoding="utf-8")
    with pytest.raises(InvalidSettingError) as caught:
        load_settings()
    message = str(caught.value)
    assert f"max_new_tokens = {10**20}" in message
    assert f"from 1 to {MAX_NEW_TOKENS_LIMIT:,}" in message


def test_a_budget_beyond_the_ceiling_from_a_flag_names_the_flag(config_file: Path) -> None:
    with pytest.raises(InvalidSettingError, match=r"--max-new-tokens 1000001 .* from 1 to 1,000,000"):
        load_settings({"max_new_tokens": MAX_NEW_TOKENS_LIMIT + 1})


def test_a_server_timeout_the_socket_cannot_wait_is_refused(config_file: Path) -> None:
    assert load_settings({"server_timeout": SERVER_TIMEOUT_LIMIT}).server_timeout == SERVER_TIMEOUT_LIMIT
    config_file.write_text("server_timeout = 1e10\n", encoding="utf-8")
    with pytest.raises(InvalidSettingError, match=r"server_timeout = 10000000000\.0 .* at most 86,400"):
        load_settings()


def test_numbers_still_read_as_numbers(config_file: Path) -> None:
    config_file.write_text("gamma = 3\ntemperature = 1\ntop_k = 40\nseed = 0\n", encoding="utf-8")
    settings = load_settings()
    assert (settings.gamma, settings.temperature, settings.top_k, settings.seed) == (3, 1.0, 40, 0)
    assert load_settings({"server_verify_tls": False}).server_verify_tls is False


def test_a_config_that_is_a_device_is_refused_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    link = tmp_path / "config.toml"
    link.symlink_to("/dev/zero")
    monkeypatch.setenv("SPECCHAT_CONFIG", str(link))
    started = time.monotonic()
    with pytest.raises(InvalidSettingError) as caught:
        load_settings()
    assert time.monotonic() - started < 5
    assert "it is a device (/dev/zero), not a file" in str(caught.value)
    with pytest.raises(InvalidSettingError, match="not a file"):
        update_config_file({"gamma": 3})  # the settings screen saving must not read it either


def test_a_config_over_the_limit_is_refused(config_file: Path) -> None:
    config_file.write_text("# padding\n" * (CONFIG_LIMIT // 10 + 1), encoding="utf-8")
    with pytest.raises(InvalidSettingError, match="too large"):
        load_settings()


def test_a_deeply_nested_config_is_one_line(config_file: Path) -> None:
    config_file.write_text("gamma = " + "[" * 100_000 + "\n", encoding="utf-8")
    with pytest.raises(InvalidSettingError, match="nest too deeply"):
        load_settings()


def test_deeply_nested_keys_in_the_environment_are_one_line(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECCHAT_KEYS", "[" * 100_000)
    with pytest.raises(InvalidSettingError, match="SPECCHAT_KEYS"):
        load_settings()


@pytest.mark.spawns
@pytest.mark.parametrize(("signal_number", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_config_fifo_with_no_writer_still_ends_on_a_signal(
    tmp_path: Path, signal_number: int, status: int
) -> None:
    """A pipe is still read (SPECCHAT_CONFIG=<(…)), so the wait for a writer (a poll, limited to
    specchat.files.FIFO_WAIT_S) must stay interruptible: SIGTERM or Ctrl+C ends it with
    specchat's own line and status."""
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    env = {**os.environ, "SPECCHAT_CONFIG": str(fifo), "SPECCHAT_DATA_DIR": str(tmp_path / "data")}
    process = subprocess.Popen(
        [sys.executable, "-m", "specchat", "generate", "hi"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_until_blocked_on(fifo, process.pid)
        process.send_signal(signal_number)
        _, err = process.communicate(timeout=10)
    finally:
        process.kill()
    assert process.returncode == status, err
    assert b"Traceback" not in err


POLL = {"x86_64": ("7", "271"), "aarch64": ("73",)}
"""poll() and ppoll(): the FIFO's wait for a writer (nothing else polls before loading)."""


def _wait_until_blocked_on(fifo: Path, pid: int, timeout: float = 30.0) -> None:
    """Until the process sits in poll() on the FIFO for a while."""
    import platform

    numbers = POLL.get(platform.machine())
    if numbers is None:
        pytest.skip("poll's syscall number is not known for this machine")
    deadline = time.monotonic() + timeout
    since: float | None = None
    while time.monotonic() < deadline:
        try:
            current = Path(f"/proc/{pid}/syscall").read_text().split()[:1]
        except OSError:
            current = []
        if current and current[0] in numbers:
            since = since or time.monotonic()
            if time.monotonic() - since > 0.3:
                return
        else:
            since = None
        time.sleep(0.05)
    raise AssertionError(f"the process never waited on {fifo}")


def test_a_negative_draft_window_is_one_line_naming_the_range(config_file: Path) -> None:
    assert load_settings({"draft_window": 0}).draft_window == 0  # no window: the draft reads all
    config_file.write_text("draft_window = -5\n", encoding="utf-8")
    with pytest.raises(InvalidSettingError, match=r"draft_window = -5 .* from 0 \(none\)"):
        load_settings()
