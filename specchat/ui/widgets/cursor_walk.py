"""Where the inspector's cursor goes: the tokens on screen in order, and a move among them.

Pure functions of the replies, so the inspector (:mod:`specchat.ui.widgets.inspector`) keeps
only the cursor and what it shows.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specchat.ui.widgets.transcript import AssistantMessage

Cursor = tuple[int, int]
"""(reply index, token index) of the inspected token."""


def positions(replies: Iterable[AssistantMessage]) -> Iterable[tuple[int, int, int]]:
    """(reply, token, round) of every visible token, in order (folded reasoning is not)."""
    for reply_index, reply in enumerate(replies):
        for token_index, token in enumerate(reply.tokens.tokens):
            if token.text and reply.tokens.shows(token_index):
                yield reply_index, token_index, token.round


def last_position(replies: list[AssistantMessage]) -> Cursor | None:
    """The last visible token of the last reply that has one."""
    for reply_index, reply in reversed(list(enumerate(replies))):
        tokens = reply.tokens.tokens
        for token_index in range(len(tokens) - 1, -1, -1):
            if tokens[token_index].text and reply.tokens.shows(token_index):
                return reply_index, token_index
    return None


def moved_cursor(
    positions: list[tuple[int, int, int]], cursor: Cursor, unit: str, step: int
) -> Cursor | None:
    """Where a move takes the cursor (None: nowhere to go)."""
    here = next((i for i, (r, t, _) in enumerate(positions) if (r, t) >= cursor), len(positions) - 1)
    if not positions:
        return None
    if unit == "token":
        target = here + step
    elif unit == "end":
        same = [i for i, (r, _, _) in enumerate(positions) if r == cursor[0]]
        target = same[0] if step < 0 else same[-1]
    else:  # round: the first token of the previous or next round
        reply, _, round_no = positions[here]
        key = (reply, round_no)
        target = here
        if step > 0:
            while target < len(positions) and positions[target][0::2] == key:
                target += 1
        else:
            while target > 0 and positions[target][0::2] == key:
                target -= 1
            before = positions[target][0::2]
            while target > 0 and positions[target - 1][0::2] == before:
                target -= 1
    if not 0 <= target < len(positions):
        return None
    reply, token, _ = positions[target]
    return reply, token
