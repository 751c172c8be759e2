"""The bench's γ sweeps and list options, as the command line writes them.

Torch-free, so the CLI builds its help and checks its options without loading the numeric
stack (``specchat generate --server`` imports the command group, bench included).
"""

from __future__ import annotations

from specchat.bench import BenchError
from specchat.params import GAMMA_MAX

QUICK_GAMMAS = "1,2,3,4"
FULL_GAMMAS = "1,2,3,4,5,6,8"
QUICK_HF_GAMMAS = "2,3"


def parse_gammas(text: str, what: str) -> tuple[int, ...]:
    """ "1,2,4" as sorted distinct γ values from 1 to GAMMA_MAX; a usage error names ``what``."""
    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError as err:
        raise BenchError(f"{what} must be a comma-separated list of whole numbers (got {text!r}).") from err
    if any(v < 1 or v > GAMMA_MAX for v in values):
        raise BenchError(f"{what} must be between 1 and {GAMMA_MAX} (got {text!r}).")
    return tuple(values)


def comma_list(text: str | None) -> list[str] | None:
    """ "code, math" as ["code", "math"]; None or nothing given: None."""
    names = [part.strip() for part in (text or "").split(",") if part.strip()]
    return names or None
