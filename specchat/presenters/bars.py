"""Horizontal bars drawn in text, to an eighth of a cell (acceptance by position, the self-test's
histograms)."""

from __future__ import annotations

FULL = "█"
EIGHTHS = " ▏▎▍▌▋▊▉"
"""A cell filled to 0/8 … 7/8 from the left."""


def bar(fraction: float, width: int) -> str:
    """A bar of ``fraction`` × ``width`` cells (clamped to 0…1), in eighths of a cell."""
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, rest = divmod(eighths, 8)
    return FULL * full + (EIGHTHS[rest] if rest else "")
