"""The drafter registry: every way of proposing tokens, in one table that everything reads.

The CLI's choices, the settings' validation, the TUI's drafter key and help text, the engine's
drafter construction and the benchmark's methods all come from :data:`DRAFTERS`, so adding a
drafter means adding one entry here (and its class). What the rest of the code asks of a
drafter (is its q a model's distribution or a lookup's one-hot row? does it propose as other
drafters? may it stop short of γ?) is a property of its entry, never a comparison with its name.

Pure Python at import time (no torch): each entry builds its drafter lazily, importing the
engine's torch code only when an engine is actually made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from specchat.errors import InvalidSettingError
from specchat.params import DRAFT_STOP_BELOW

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
DrafterKind = Literal["model", "lookup", "combined", "none"]


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
    kind: DrafterKind = "model"
    """What proposes: ``model``, a draft model (q is the distribution it sampled from, at T = 0
    its own softmax; it stops short of γ where it is unsure); ``lookup``, copied earlier text (q
    is a one-hot row, no probability of its own; it proposes fewer than γ where the text runs
    out); ``combined``, each round one of :attr:`parts` proposes and the round carries that
    part's name; ``none``, nothing is drafted."""
    parts: tuple[str, ...] = ()
    """For a ``combined`` drafter, the entries it proposes as; the first is assumed until a
    round says which one drafted."""

    @property
    def is_lookup(self) -> bool:
        return self.kind == "lookup"

    @property
    def is_model(self) -> bool:
        return self.kind == "model"

    @property
    def drafts(self) -> bool:
        """Whether it proposes anything (``none`` does not)."""
        return self.kind != "none"

    def figures_of(self, last_part: str | None) -> str | None:
        """Whose measured figures (α, costs) describe this drafter: itself; for a combined one
        the part that drafted last (``last_part``), else its first part; None when it drafts
        nothing."""
        if self.kind == "combined":
            return last_part if last_part in self.parts else self.parts[0]
        return self.name if self.drafts else None


def _model(kit: DrafterKit) -> Drafter | None:
    from specchat.engine.drafters import ModelDrafter, read_share

    if kit.draft is None:
        return None
    share = read_share(kit.draft.model.config, kit.target.model.config)
    return ModelDrafter(kit.draft, kit.vocab_width, read_share=share)


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
        kind="model",
    ),
    DrafterSpec(
        "hybrid",
        "hybrid",
        "prompt lookup when the last tokens occurred before, the draft model otherwise",
        needs_draft_model=True,
        build=_hybrid,
        bench_schedule="adaptive",
        kind="combined",
        parts=("model", "ngram"),
    ),
    DrafterSpec(
        "ngram",
        "n-gram",
        "prompt lookup only: copy what followed the last tokens earlier (no draft model)",
        needs_draft_model=False,
        build=_ngram,
        kind="lookup",
    ),
    DrafterSpec(
        "none",
        "none",
        "nothing is drafted: plain decoding by the target",
        needs_draft_model=False,
        build=_none,
        bench="baseline",
        kind="none",
    ),
)
DRAFTER_NAMES: tuple[str, ...] = tuple(spec.name for spec in DRAFTERS)


_added: list[DrafterSpec] = []
"""Entries registered at run time (:func:`registered`), after the built-in ones."""


def drafters() -> tuple[DrafterSpec, ...]:
    """Every entry, the built-in table then those registered at run time, read at each call."""
    return (*DRAFTERS, *_added)


@contextmanager
def registered(spec: DrafterSpec) -> Iterator[DrafterSpec]:
    """``spec`` is an entry for the duration of the block (a test, a plugin trying a drafter).

    Code that reads the registry through :func:`drafters`, :func:`find_drafter` and
    :func:`drafter_spec` sees it; the import-time name lists (:data:`DRAFTER_NAMES`, the CLI's
    choices) list the built-in table only.
    """
    if any(entry.name == spec.name for entry in drafters()):
        raise ValueError(f"a drafter named {spec.name!r} is registered already")
    _added.append(spec)
    try:
        yield spec
    finally:
        _added.remove(spec)


def find_drafter(name: str) -> DrafterSpec | None:
    """The entry of ``name``, or None for a name the registry does not know (a server's drafter,
    a conversation saved by another version)."""
    return next((spec for spec in drafters() if spec.name == name), None)


def drafter_spec(name: str) -> DrafterSpec:
    spec = find_drafter(name)
    if spec is None:
        names = ", ".join(spec.name for spec in drafters())
        raise InvalidSettingError(f"unknown drafter {name!r}: use {names}.")
    return spec


def is_lookup(name: str) -> bool:
    """Whether the drafter ``name`` (a round's, a setting's) copies text: its q is a one-hot row."""
    spec = find_drafter(name)
    return spec is not None and spec.is_lookup


def is_model(name: str) -> bool:
    """Whether the drafter ``name`` is a draft model: q is what it sampled from, and a draft
    shorter than γ ended where it was unsure."""
    spec = find_drafter(name)
    return spec is not None and spec.is_model


def proposes(name: str) -> bool:
    """Whether a round stamped ``name`` had a drafter (not ``none``); an unknown name counts."""
    spec = find_drafter(name)
    return spec is None or spec.drafts


def plain_drafter() -> str:
    """The name of the entry that drafts nothing: a plain-decoding reference run asks for it."""
    return next(spec.name for spec in drafters() if spec.kind == "none")
