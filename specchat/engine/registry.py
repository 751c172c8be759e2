"""The drafter registry: every way of proposing tokens, in one table that everything reads.

The CLI's choices, the settings' validation, the TUI's drafter key and help text, the engine's
drafter construction and the benchmark's methods all come from :data:`DRAFTERS`, so adding a
drafter means adding one entry here (and its class).

Pure Python at import time (no torch): each entry builds its drafter lazily, importing the
engine's torch code only when an engine is actually made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from specchat.engine.params import DRAFT_STOP_BELOW
from specchat.errors import InvalidSettingError

if TYPE_CHECKING:
    import torch

    from specchat.engine.drafters import Drafter
    from specchat.engine.kv import CachedLM


@dataclass
class DrafterKit:
    """What drafters are built from; ``get`` shares one instance of each between entries."""

    target: CachedLM
    draft: CachedLM | None
    vocab_width: int
    device: torch.device
    built: dict[str, Drafter | None] = field(default_factory=dict)

    def get(self, name: str) -> Drafter | None:
        if name not in self.built:
            self.built[name] = drafter_spec(name).build(self)
        return self.built[name]


BenchRole = Literal["sweep", "row", "baseline"]


@dataclass(frozen=True)
class DrafterSpec:
    name: str
    """The id used on the command line, in config files, in events and in saved conversations."""
    label: str
    """How panels and keys show it."""
    summary: str
    """One line for --help, the help screen and the command palette."""
    needs_draft_model: bool
    build: Callable[[DrafterKit], Drafter | None]
    """Makes the drafter (None: nothing is drafted, every round is a plain target step)."""
    bench: BenchRole = "row"
    """How ``specchat bench`` runs it: ``sweep`` (fixed γ sweep plus every γ schedule), ``row``
    (one row, under :attr:`bench_schedule`), or ``baseline`` (the plain row)."""
    bench_schedule: str = "fixed"
    """The γ schedule of its bench row."""


def _model(kit: DrafterKit) -> Drafter | None:
    from specchat.engine.drafters import ModelDrafter

    return ModelDrafter(kit.draft, kit.vocab_width) if kit.draft is not None else None


def _hybrid(kit: DrafterKit) -> Drafter | None:
    from specchat.engine.drafters import ModelDrafter, NgramDrafter
    from specchat.engine.hybrid import HybridDrafter

    lookup, model = kit.get("ngram"), kit.get("model")
    if not isinstance(lookup, NgramDrafter) or not isinstance(model, ModelDrafter):
        return None
    # The hybrid shares both drafters (and the draft's cache): switching costs nothing.
    return HybridDrafter(lookup, model)


def _ngram(kit: DrafterKit) -> Drafter | None:
    from specchat.engine.drafters import NgramDrafter

    return NgramDrafter(kit.vocab_width, kit.device)


def _none(kit: DrafterKit) -> Drafter | None:
    return None


DRAFTERS: tuple[DrafterSpec, ...] = (
    DrafterSpec(
        "model",
        "model",
        "the draft model proposes up to γ tokens a round, fewer where its top choice is under "
        f"{DRAFT_STOP_BELOW}",
        needs_draft_model=True,
        build=_model,
        bench="sweep",
    ),
    DrafterSpec(
        "hybrid",
        "hybrid",
        "prompt lookup when the last tokens occurred before, the draft model otherwise",
        needs_draft_model=True,
        build=_hybrid,
        bench_schedule="adaptive",
    ),
    DrafterSpec(
        "ngram",
        "n-gram",
        "prompt lookup only: copy what followed the last tokens earlier (no draft model)",
        needs_draft_model=False,
        build=_ngram,
    ),
    DrafterSpec(
        "none",
        "none",
        "nothing is drafted: plain decoding by the target",
        needs_draft_model=False,
        build=_none,
        bench="baseline",
    ),
)
DRAFTER_NAMES: tuple[str, ...] = tuple(spec.name for spec in DRAFTERS)


def drafter_spec(name: str) -> DrafterSpec:
    for spec in DRAFTERS:
        if spec.name == name:
            return spec
    raise InvalidSettingError(f"unknown drafter {name!r}: use {', '.join(DRAFTER_NAMES)}.")


def drafters_needing_model() -> tuple[str, ...]:
    return tuple(spec.name for spec in DRAFTERS if spec.needs_draft_model)
