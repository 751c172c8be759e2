"""The engine the bench drives: ChatEngine plus the proposed hybrid drafter.

:mod:`specchat.engine.hybrid` (prompt lookup when the text repeats itself, the draft model
otherwise) is not registered in the engine's drafter list yet (that touches the settings and
the UI's drafter cycle); the bench runs it through this subclass so that its figures sit next
to the others. Once ``"hybrid"`` is in :data:`specchat.engine.drafters.DRAFTERS`, the plain
engine serves it and this module reduces to pass-throughs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from specchat.engine.drafters import DRAFTERS, Drafter, ModelDrafter, NgramDrafter
from specchat.engine.hybrid import HybridDrafter
from specchat.engine.session import ChatEngine, Controls

HYBRID = "hybrid"


class BenchEngine(ChatEngine):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._hybrid: HybridDrafter | None = None
        if self.draft is not None:
            self._hybrid = HybridDrafter(
                NgramDrafter(self.vocab_width, self.target.device), ModelDrafter(self.draft, self.vocab_width)
            )

    @property
    def has_hybrid(self) -> bool:
        return self._hybrid is not None

    def drafter(self, name: str) -> Drafter | None:
        if name == HYBRID and HYBRID not in DRAFTERS and self._hybrid is not None:
            return self._hybrid  # type: ignore[return-value]
        return super().drafter(name)


@dataclass
class BenchControls(Controls):
    """Controls that also accept the hybrid drafter (checked as the model drafter would be)."""

    def validate(self) -> None:
        if self.drafter == HYBRID and HYBRID not in DRAFTERS:
            Controls.validate(replace(self, drafter="model"))
            return
        super().validate()
