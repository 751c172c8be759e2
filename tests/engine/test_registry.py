"""One drafter registry that the engine, the settings, the CLI and the TUI all read."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from specchat.cli import main
from specchat.config import Settings
from specchat.engine.registry import DRAFTER_NAMES, DRAFTERS, DrafterSpec, drafter_spec
from specchat.engine.session import ChatEngine
from specchat.errors import InvalidSettingError
from specchat.testing import TinyPair
from specchat.ui import keys


def test_engine_offers_every_registered_drafter(engine: ChatEngine) -> None:
    assert engine.available_drafters == list(DRAFTER_NAMES)
    assert engine.capabilities.drafters == DRAFTER_NAMES


def test_without_a_draft_model_only_drafters_that_need_none_remain(pair: TinyPair) -> None:
    engine = ChatEngine(pair.target, pair.tokenizer)
    assert engine.available_drafters == [s.name for s in DRAFTERS if not s.needs_draft_model]
    with pytest.raises(InvalidSettingError, match="not available"):
        engine.drafter("model")


def test_unknown_names_get_the_registrys_list() -> None:
    with pytest.raises(InvalidSettingError, match=", ".join(DRAFTER_NAMES)):
        drafter_spec("telepathy")


def test_settings_cli_and_keys_read_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in DRAFTER_NAMES:
        assert Settings(drafter=name).drafter == name
    with pytest.raises(ValueError, match="unknown drafter"):
        Settings(drafter="telepathy")
    help_text = CliRunner().invoke(main, ["generate", "--help"]).output
    for spec in DRAFTERS:
        assert spec.name in help_text
    drafter_key = next(k for k in keys.APP_KEYS if k.id == "drafter")
    assert all(spec.label in drafter_key.description for spec in DRAFTERS)


def test_a_new_entry_is_picked_up_by_the_engine(pair: TinyPair, monkeypatch: pytest.MonkeyPatch) -> None:
    from specchat.engine import registry

    def build(kit: registry.DrafterKit) -> object:
        return kit.get("ngram")

    extra = DrafterSpec("lookup2", "lookup 2", "a second lookup", needs_draft_model=False, build=build)  # type: ignore[arg-type]
    monkeypatch.setattr(registry, "DRAFTERS", (*registry.DRAFTERS, extra))
    monkeypatch.setattr("specchat.engine.session.DRAFTERS", registry.DRAFTERS)
    engine = ChatEngine(pair.target, pair.tokenizer, pair.draft)
    assert "lookup2" in engine.available_drafters
