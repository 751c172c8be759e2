"""Decoding parameters, torch-free: the sampling settings, the largest γ and the draft model's
stop threshold.

The front ends (``specchat.engine.backend``'s Controls, the CLI, the UI), the engine (sampling,
drafters) and the models (which passes are verify passes) all need these; living at the
package's root, below every layer, none of them need import another for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from specchat.errors import InvalidSettingError

GAMMA_MAX = 16
"""The most tokens a round drafts (the γ schedules and the drafters keep within it)."""
DRAFT_WINDOW = 512
"""A draft model that would first have to read more than this many tokens (a long prompt, a
pasted document) reads only the last this many when reading them all would not pay (0: never a
window). What the draft reads changes only how good its guesses are, never the text; answers
drawn from a whole document are guessed much worse from a shorter window (α by window:
docs/lab/2026-12-07-never-slower.md)."""
DRAFT_STOP_BELOW = 0.5
"""The draft model ends a round after a position where its most likely token had less than this
probability (the token it drew there is still proposed; 0: never stop early)."""


def check_sampling(temperature: float, top_k: int | None, top_p: float) -> None:
    """The one check of sampling settings, for Controls and SamplingParams alike."""
    if not 0.0 <= temperature < float("inf"):
        raise InvalidSettingError(f"temperature must be a finite number, 0 or more (got {temperature}).")
    if not 0.0 < top_p <= 1.0:
        raise InvalidSettingError(f"top-p must be in (0, 1] (got {top_p}).")
    if top_k is not None and top_k < 1:
        raise InvalidSettingError(f"top-k must be 1 or more (got {top_k}).")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0
    """0 means greedy: argmax, and verification by exact match."""
    top_k: int | None = None
    top_p: float = 1.0

    def __post_init__(self) -> None:
        check_sampling(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
