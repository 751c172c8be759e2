"""The words for a greedy comparison's outcome, shared by the race, the self-test and the CLI."""

from __future__ import annotations


def greedy_verdict(identical: bool, first_difference: int | None) -> str:
    """``identical``, or where the texts part (``DIFFERENT from token 7``)."""
    return "identical" if identical else f"DIFFERENT from token {first_difference}"
