"""The benchmark's prompt set, shipped in the package as prompts.json, and the extra prompts
of the greedy-equality check (check_prompts.json, same categories)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

from specchat.bench import BenchError

Message = dict[str, str]


@dataclass(frozen=True, slots=True)
class BenchPrompt:
    id: str
    category: str
    messages: tuple[Message, ...]
    quick: bool = False


def categories() -> list[str]:
    return list(_load()["categories"])


def load_prompts(
    *,
    quick: bool = False,
    only: Sequence[str] | None = None,
    per_category: int | None = None,
    check: bool = False,
) -> list[BenchPrompt]:
    """The prompts in file order: all of them, the quick subset, or some categories.

    ``per_category`` keeps the first n prompts of each category (quick ones first). ``check``
    adds the greedy-equality check's own prompts after the bench's.
    """
    data = _load()
    known = list(data["categories"])
    wanted = list(only) if only else known
    unknown = [c for c in wanted if c not in known]
    if unknown:
        raise BenchError(f"unknown category {', '.join(unknown)}: use {', '.join(known)}.")
    rows = data["prompts"] + (_load("check_prompts.json")["prompts"] if check else [])
    prompts = [
        BenchPrompt(p["id"], p["category"], tuple(p["messages"]), bool(p.get("quick", False)))
        for p in rows
        if p["category"] in wanted and (p.get("quick", False) or not quick)
    ]
    if per_category is not None:
        kept: list[BenchPrompt] = []
        for category in wanted:
            rows = sorted((p for p in prompts if p.category == category), key=lambda p: not p.quick)
            kept.extend(rows[:per_category])
        order = {p.id: i for i, p in enumerate(prompts)}
        prompts = sorted(kept, key=lambda p: order[p.id])
    if not prompts:
        raise BenchError("no prompts selected: check --categories.")
    return prompts


def _load(name: str = "prompts.json") -> dict:  # type: ignore[type-arg]
    text = resources.files("specchat.bench").joinpath(name).read_text(encoding="utf-8")
    return json.loads(text)  # type: ignore[no-any-return]
