"""One drafter registry that the engine, the settings, the CLI and the TUI all read."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from specchat.bench.methods import build_methods
from specchat.cli import main
from specchat.config import Settings
from specchat.engine.events import DraftTrace, RoundEvent
from specchat.engine.gamma import AdaptiveGamma, sure_positions
from specchat.engine.registry import (
    DRAFTER_NAMES,
    DRAFTERS,
    DrafterKit,
    DrafterSpec,
    drafter_spec,
    find_drafter,
    registered,
)
from specchat.engine.session import ChatEngine
from specchat.errors import InvalidSettingError
from specchat.testing.tiny_models import TinyPair
from specchat.ui.settings import keys
from specchat.ui.state.live import LiveStats
from specchat.ui.talk.theory_tracker import TheoryTracker
from specchat.ui.widgets.inspector import own_draft, own_note


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


def test_a_new_entry_is_picked_up_by_the_engine(pair: TinyPair) -> None:
    from specchat.engine import registry

    def build(kit: registry.DrafterKit) -> object:
        return kit.get("ngram")

    extra = DrafterSpec("lookup2", "lookup 2", "a second lookup", needs_draft_model=False, build=build)  # type: ignore[arg-type]
    with registry.registered(extra):
        engine = ChatEngine(pair.target, pair.tokenizer, pair.draft)
    assert "lookup2" in engine.available_drafters
    assert registry.find_drafter("lookup2") is None, "the registration ends with its block"


def _round(drafter: str, gamma: int, drafted: int, accepted: int) -> RoundEvent:
    return RoundEvent(1, gamma, drafted, accepted, 1.0, 10.0, drafter)


def test_a_registered_drafter_flows_through_by_its_kind() -> None:
    """One entry, no edits elsewhere: the theory tracker, the inspector's wording, the bench's
    rows and the γ advisor ask the entry's kind, never compare names."""
    echo = DrafterSpec(
        "echo", "echo", "copies the last token", needs_draft_model=False, build=_nothing, kind="lookup"
    )
    mind = DrafterSpec(
        "mind", "mind", "a second draft model", needs_draft_model=True, build=_nothing, kind="model"
    )
    mix = DrafterSpec(
        "mix",
        "mix",
        "echo, else mind",
        needs_draft_model=True,
        build=_nothing,
        kind="combined",
        parts=("mind", "echo"),
    )
    with registered(echo), registered(mind), registered(mix):
        # The theory panel: a drafter's own figures; a combined one's last part, its first before any round.
        tracker = TheoryTracker(LiveStats())
        assert [tracker.drafter_for(name) for name in ("echo", "mind", "mix", "none")] == [
            "echo",
            "mind",
            "mind",
            None,
        ]
        tracker.observe_round(_round("echo", 4, 2, 1))
        assert tracker.drafter_for("mix") == "echo"
        assert tracker.view(4, "mix").drafter == "echo"

        # The inspector: a lookup's q is a one-hot row, so it has no own probability to show.
        greedy = DraftTrace(7, "x", 0.9, 1.0, 0.9, None, "accepted", p_draft_own=0.8)
        assert own_draft(greedy, "echo") is None
        assert "lookup copies earlier text" in own_note(greedy, "echo")
        assert own_draft(greedy, "mind") == 0.8 and "lookup" not in own_note(greedy, "mind")

        # The bench: a lookup's row runs at the lookup γ; combined rows go with hybrid=False.
        methods = {m.name: m for m in build_methods([2], ngram_gamma=3, start_gamma=5)}
        assert (methods["echo"].gamma, methods["mix"].gamma, methods["mind"].gamma) == (3, 5, 5)
        assert {"mix", "hybrid"}.isdisjoint(m.name for m in build_methods([2], hybrid=False))
        assert [m.name for m in build_methods([2], has_draft=False)] == ["plain", "ngram", "echo"]

        # The γ advisor: a model's draft shorter than γ stopped where it was unsure; a lookup's ran out.
        assert sure_positions(_round("mind", 4, 2, 2)) == (1, 1)
        assert sure_positions(_round("echo", 4, 2, 2)) == (2, 2)
        schedule = AdaptiveGamma(4)
        schedule.observe(_round("echo", 4, 2, 1))
        schedule.observe(_round("none", 0, 0, 0))
        assert schedule.drafter == "echo", "a plain round leaves the estimates on the last drafter"
    assert find_drafter("echo") is None and find_drafter("mix") is None


def _nothing(kit: DrafterKit) -> None:
    return None
