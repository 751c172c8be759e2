"""Settings: defaults chosen on the bench, then file < environment < flags, and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from specchat.config import Settings, load_settings, save_settings
from specchat.errors import InvalidSettingError


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config.toml"
    monkeypatch.setenv("SPECCHAT_CONFIG", str(path))
    for name in Settings.model_fields:
        monkeypatch.delenv(f"SPECCHAT_{name.upper()}", raising=False)
    return path


def test_defaults_are_what_the_bench_chose(config_file: Path) -> None:
    settings = load_settings()
    assert (settings.drafter, settings.schedule) == ("hybrid", "adaptive")
    assert settings.cpu_path == "auto"
    assert (settings.target, settings.draft) == ("qwen-coder-1.5b", "qwen-coder-0.5b")


def test_file_then_environment_then_flags(config_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_settings(Settings(gamma=2, drafter="ngram", cpu_path="none"))
    assert load_settings().gamma == 2
    monkeypatch.setenv("SPECCHAT_GAMMA", "3")
    assert load_settings().gamma == 3
    settings = load_settings({"gamma": 5, "drafter": None})
    assert (settings.gamma, settings.drafter, settings.cpu_path) == (5, "ngram", "none")


@pytest.mark.parametrize(
    ("overrides", "word"),
    [({"drafter": "oracle"}, "drafter"), ({"schedule": "magic"}, "schedule"), ({"gamma": 0}, "gamma")],
)
def test_bad_values_name_the_setting(config_file: Path, overrides: dict[str, object], word: str) -> None:
    with pytest.raises(InvalidSettingError, match=word):
        load_settings(overrides)


def test_a_broken_file_is_one_clear_error(config_file: Path) -> None:
    config_file.write_text("gamma = [", encoding="utf-8")
    with pytest.raises(InvalidSettingError, match="cannot read config file"):
        load_settings()
