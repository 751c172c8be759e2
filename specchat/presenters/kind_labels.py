"""The four token kinds in words and terminal colours: one table for the CLI and the TUI."""

from __future__ import annotations

from specchat.engine.events import TokenKind

KIND_LABELS: dict[TokenKind, str] = {
    "accepted": "accepted draft",
    "correction": "correction",
    "bonus": "bonus",
    "target": "target only",
}
"""How panels, the inspector and the help screen name each kind."""
KIND_HELP: dict[TokenKind, str] = {
    "accepted": "the drafter proposed it and the target agreed: it cost no target step of its own",
    "correction": "the target rejected a draft here and sampled this token from the residual instead",
    "bonus": "every draft passed, so the target's verify pass gave one more token for free",
    "target": "nothing was drafted this round (drafter off or no n-gram match): a plain target token",
}
"""One line per kind for the help screen."""
LEGEND_LABELS: dict[TokenKind, str] = {**KIND_LABELS, "correction": "residual correction"}
"""The legend of `generate --format ansi`: with no help screen beside it, a correction says where
it came from."""
KIND_STYLES: dict[str, str] = {
    "accepted": "green",
    "correction": "bold red",
    "bonus": "bold cyan",
    "target": "default",
}
"""Colours of the kinds in the terminal commands (--format ansi, the race); the TUI takes its
colours from the theme instead."""
