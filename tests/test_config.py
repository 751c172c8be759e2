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


HAND_WRITTEN = """\
# specchat settings, written by hand
gamma = 3          # three drafts: my machine's sweet spot
drafter = "model"

# colours
theme = "specchat-dark"

[keys]
# F-keys are awkward on this laptop
gamma_up = "ctrl+up"
"""


def test_remembering_a_choice_keeps_the_users_comments_and_layout(config_file: Path) -> None:
    from specchat.ui.settings.remembered import remember

    config_file.write_text(HAND_WRITTEN, encoding="utf-8")
    remember("theme", "specchat-light")
    assert config_file.read_text(encoding="utf-8") == HAND_WRITTEN.replace(
        'theme = "specchat-dark"', 'theme = "specchat-light"'
    )
    remember("system_prompt", 'Say "hi".\nThen stop.')
    lines = config_file.read_text(encoding="utf-8").splitlines()
    added = [line for line in lines if line.startswith("system_prompt")]
    assert len(added) == 1 and lines.index(added[0]) < lines.index("[keys]")
    lines.remove(added[0])
    assert lines == HAND_WRITTEN.replace("specchat-dark", "specchat-light").splitlines()
    settings = load_settings()
    assert settings.system_prompt == 'Say "hi".\nThen stop.' and settings.theme == "specchat-light"
    assert settings.keys == {"gamma_up": "ctrl+up"} and settings.gamma == 3


def test_saving_settings_keeps_comments_too(config_file: Path) -> None:
    config_file.write_text(HAND_WRITTEN, encoding="utf-8")
    save_settings(load_settings().model_copy(update={"gamma": 5}))
    text = config_file.read_text(encoding="utf-8")
    assert "gamma = 5          # three drafts: my machine's sweet spot" in text
    assert "# F-keys are awkward on this laptop" in text
    assert load_settings().gamma == 5
