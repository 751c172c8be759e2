"""The benchmark's prompts: the set shipped in the package (prompts.json), the extra prompts
of the greedy-equality check (check_prompts.json, same categories), or the field's question
files (:mod:`specchat.bench.question_file`: Spec-Bench's and MT-Bench's ``question.jsonl``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from specchat.bench import BenchError
from specchat.bench.prompt_record import BenchPrompt, Message
from specchat.bench.question_file import read_questions

__all__ = ["BenchPrompt", "Message", "categories", "load_prompts"]


def categories() -> list[str]:
    return list(_load()["categories"])


def load_prompts(
    *,
    quick: bool = False,
    only: Sequence[str] | None = None,
    per_category: int | None = None,
    check: bool = False,
    path: Path | None = None,
) -> list[BenchPrompt]:
    """The prompts in file order: all of them, the quick subset, or some categories.

    ``per_category`` keeps the first n prompts of each category (quick ones first). ``check``
    adds the greedy-equality check's own prompts after the bench's. ``path`` reads a question
    file instead of the shipped set (its quick subset: the first question of each category).
    """
    if path is not None:
        candidates = read_questions(path)
        known = list(dict.fromkeys(p.category for p in candidates))
    else:
        data = _load()
        known = list(data["categories"])
        rows = data["prompts"] + (_load("check_prompts.json")["prompts"] if check else [])
        candidates = [
            BenchPrompt(p["id"], p["category"], tuple(p["messages"]), bool(p.get("quick", False)))
            for p in rows
        ]
    wanted = list(only) if only else known
    unknown = [c for c in wanted if c not in known]
    if unknown:
        raise BenchError(f"unknown category {_listed(unknown)}: use {_listed(known)}.")
    prompts = [p for p in candidates if p.category in wanted and (p.quick or not quick)]
    if per_category is not None:
        kept: list[BenchPrompt] = []
        for category in wanted:
            of_category = sorted((p for p in prompts if p.category == category), key=lambda p: not p.quick)
            kept.extend(of_category[:per_category])
        order = {p.id: i for i, p in enumerate(prompts)}
        prompts = sorted(kept, key=lambda p: order[p.id])
    if not prompts:
        raise BenchError("no prompts selected: check --categories.")
    return prompts


def _listed(names: Sequence[str], limit: int = 12) -> str:
    """Category names for a message: shown safely, and not a thousand of them."""
    from specchat.untrusted import clipped, visible

    shown = ", ".join(visible(name) for name in names[:limit])
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return clipped(shown) + more


def _load(name: str = "prompts.json") -> dict:  # type: ignore[type-arg]
    text = resources.files("specchat.bench").joinpath(name).read_text(encoding="utf-8")
    return json.loads(text)  # type: ignore[no-any-return]
