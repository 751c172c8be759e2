"""Collects the exactness-at-scale figures and prints them at the end of the run, to quote."""

from __future__ import annotations

from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class ScaleResult:
    case: str
    samples: int
    outcomes: int
    """Two-token outcomes with non-zero probability under the target (the chi-square cells)."""
    tv: float
    tv_perfect_median: float
    tv_perfect_p99: float
    p_value: float
    kinds: dict[str, int]
    seconds: float


RESULTS: list[ScaleResult] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not RESULTS:
        return
    terminalreporter.section("exactness at scale: first two tokens vs the target's exact law")
    for r in RESULTS:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(r.kinds.items()))
        terminalreporter.write_line(
            f"{r.case:<7} {r.samples:,} samples over {r.outcomes} outcomes: TV {r.tv:.4f} "
            f"(an exact sampler: median {r.tv_perfect_median:.4f}, 99% below {r.tv_perfect_p99:.4f}), "
            f"chi-square p = {r.p_value:.3f}; the two tokens by kind: {kinds}; {r.seconds:.0f} s"
        )
