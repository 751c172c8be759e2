"""The adaptive schedule's notes: why it chose the latest γ, in a few words with its figures.

Wording only: every figure is handed in by the decision (:mod:`specchat.engine.gamma.adaptive`),
which reads it from its estimates (:mod:`specchat.engine.gamma.estimates`).
"""

from __future__ import annotations

from specchat.engine.costs import CostModel, expected_tokens_per_round
from specchat.engine.gamma.catch_up import CatchUp

NOTED_READ = 32
"""A draft's catch-up of at least this many tokens is named in the round's note."""
TIMING_PLAIN = "plain: timing plain steps, the yardstick every cost is measured against"


def duration(ms: float) -> str:
    return f"{ms:.0f} ms" if ms < 1000.0 else f"{ms / 1000.0:.1f} s"


def describe(catch_up: CatchUp) -> str:
    """The trade in words: "the draft would first read 800 tokens (~5.2 s); …"."""
    read = f"the last {catch_up.reads} of {catch_up.behind}" if catch_up.window else f"{catch_up.reads}"
    text = f"the draft would first read {read} tokens (~{duration(catch_up.cost_ms)})"
    if catch_up.gain_ms is not None:
        win = f"can win at most ~{duration(catch_up.gain_ms)} in {catch_up.horizon} tokens"
        text += f"; drafting at {catch_up.speedup:.2f}× {win}"
    return text


def reading(catch_up: CatchUp) -> str:
    """A note's tail for a round that first reads a long way (empty for a routine round)."""
    if catch_up.reads < NOTED_READ or catch_up.cost_ms == 0.0:
        return ""
    return f"; {describe(catch_up)}"


def figures(drafter: str, alpha: float, model: CostModel, gamma: int) -> str:
    """The estimates a decision rests on, named by the drafter they describe: a hybrid's parts
    have their own (a lookup's c is near 0, a draft model's far from it), and the theory panel
    beside the note may show the other part's (the one that drafted last)."""
    return f"{drafter}: α {alpha:.2f}, c {model.c:.2f}, v({gamma}) {model.v(gamma):.2f}"


def first_draft(gamma: int, drafter: str, catch_up: CatchUp) -> str:
    return f"γ {gamma}: a first {drafter} draft, to measure α and its cost" + reading(catch_up)


def predicted(
    gamma: int, speedup: float, drafter: str, alpha: float, model: CostModel, catch_up: CatchUp
) -> str:
    why = figures(drafter, alpha, model, gamma)
    return f"γ {gamma}: predicted {speedup:.2f}× ({why})" + reading(catch_up)


def measuring(gamma: int, evidence: float, min_evidence: float, catch_up: CatchUp) -> str:
    tested = f"{evidence:.0f} of {min_evidence:.0f} positions tested"
    return f"γ {gamma}: measuring α before judging it ({tested})" + reading(catch_up)


def probe(gamma: int, window: int | None) -> str:
    read = f", from the last {window} tokens" if window else ""
    why = "has the text or the machine changed?"
    return f"γ {gamma}: a probe while drafting is off{read} ({why})"


def why_off(predicted: dict[int, float], drafter: str, alpha: float, model: CostModel) -> str:
    """Why drafting is off: what the best γ would cost against the tokens it would bring."""
    best = max(predicted, key=lambda g: predicted[g])
    cost = best * model.c + model.v(best)
    earned = expected_tokens_per_round(alpha, best)
    return (
        f"plain: drafting cannot pay; at best γ {best}, γ·c + v = {cost:.2f} steps bring "
        f"E[T] = {earned:.2f} tokens ({predicted[best]:.2f}×; {figures(drafter, alpha, model, best)})"
    )


def why_not_sure(predicted: dict[int, float], alpha: float, low: float, at_low: float) -> str:
    """Why drafting stays off although α's estimate says it would pay: coming back on needs
    even α's lower bound to pay, and the probes have not yet tested enough positions."""
    return (
        f"plain: drafting cannot pay for sure yet; {max(predicted.values()):.2f}× at α "
        f"{alpha:.2f}, {at_low:.2f}× at its 95 % lower bound {low:.2f} (probes measure α)"
    )


def why_not_catch_up(whole: CatchUp, part: CatchUp | None) -> str:
    """Why a drafter far behind does not draft: neither reading all it is behind on nor (where
    there is one) only the window would pay."""
    why = f"plain: {describe(whole)}"
    if part is not None:
        why += f"; reading only the last {part.reads} (~{duration(part.cost_ms)}) would not pay either"
    return why
