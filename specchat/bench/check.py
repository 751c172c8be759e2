"""`specchat bench --check`: greedy replies of every drafter and schedule against plain decoding.

Speculative decoding is exact: at temperature 0 every configuration must reproduce the target's
own greedy reply token for token. The check decodes each prompt once with the engine's
independent plain loop, then with every drafter the engine offers under every γ schedule, each
run from empty caches, and reports how many replies matched; for each one that did not, where
it first differs and with which tokens. It prints no speeds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specchat.bench.methods import PLAIN, BenchSettings, Method
from specchat.bench.prompts import BenchPrompt
from specchat.bench.run_record import RunRecord, check_greedy
from specchat.bench.runner import run_turns
from specchat.engine.gamma import SCHEDULES
from specchat.engine.session import ChatEngine


def check_methods(engine: ChatEngine, gamma: int) -> list[Method]:
    """Every drafter the engine offers (none aside) under every schedule, named drafter/schedule."""
    drafters = [d for d in engine.available_drafters if d != "none"]
    return [Method(f"{d}/{s}", "specchat", d, s, gamma) for d in drafters for s in SCHEDULES]


@dataclass(frozen=True)
class Mismatch:
    prompt_id: str
    method: str
    index: int
    """Position of the first token that differs (or where the shorter reply ended)."""
    plain: tuple[int, str] | None
    """Plain decoding's token there (id, text), None if its reply had ended."""
    got: tuple[int, str] | None
    """The configuration's token there, None if its reply had ended."""

    def describe(self) -> str:
        def token(t: tuple[int, str] | None) -> str:
            return "end of reply" if t is None else f"{t[0]} {t[1]!r}"

        return (
            f"{self.method} on {self.prompt_id}: first difference at token {self.index}: "
            f"plain {token(self.plain)}, got {token(self.got)}"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "prompt_id": self.prompt_id,
            "method": self.method,
            "index": self.index,
            "plain": list(self.plain) if self.plain else None,
            "got": list(self.got) if self.got else None,
        }


@dataclass(frozen=True)
class CheckResult:
    prompts: tuple[str, ...]
    methods: tuple[str, ...]
    max_new_tokens: int
    records: tuple[RunRecord, ...]
    mismatches: tuple[Mismatch, ...]

    @property
    def compared(self) -> list[RunRecord]:
        """Every configuration's reply (plain's own, the reference, aside)."""
        return [r for r in self.records if r.kind != "plain" and r.matches_plain is not None]

    @property
    def matched(self) -> int:
        return sum(1 for r in self.compared if r.matches_plain)

    @property
    def total(self) -> int:
        return len(self.compared)

    def by_method(self) -> dict[str, tuple[int, int]]:
        """Method → (matched, compared)."""
        out: dict[str, tuple[int, int]] = {}
        for name in self.methods:
            rows = [r for r in self.compared if r.method == name]
            out[name] = (sum(1 for r in rows if r.matches_plain), len(rows))
        return out

    def lines(self) -> list[str]:
        """The report: the count first, then one line per configuration, then every mismatch."""
        head = (
            f"greedy equality with plain decoding: {self.matched}/{self.total} replies matched "
            f"({len(self.prompts)} prompts × {len(self.methods)} configurations, "
            f"up to {self.max_new_tokens} new tokens each)"
        )
        rows = [f"  {name:<20} {ok}/{n}" for name, (ok, n) in self.by_method().items()]
        misses = [f"MISMATCH {m.describe()}" for m in self.mismatches]
        return [head, *rows, *misses]

    def to_json(self) -> dict[str, object]:
        return {
            "matched": self.matched,
            "total": self.total,
            "prompts": list(self.prompts),
            "methods": list(self.methods),
            "max_new_tokens": self.max_new_tokens,
            "by_method": {k: {"matched": a, "total": b} for k, (a, b) in self.by_method().items()},
            "mismatches": [m.to_json() for m in self.mismatches],
        }


def run_check(
    engine: ChatEngine,
    prompts: Sequence[BenchPrompt],
    methods: Sequence[Method],
    max_new_tokens: int,
    *,
    before_run: Callable[[BenchPrompt, Method], None] | None = None,
    progress: Callable[[RunRecord], None] | None = None,
) -> CheckResult:
    settings = BenchSettings(max_new_tokens=max_new_tokens, temperature=0.0)
    records: list[RunRecord] = []
    for prompt in prompts:
        prompt_ids = engine.prompt_ids(prompt.messages)
        for method in [PLAIN, *methods]:
            for record in run_turns(engine, prompt, prompt_ids, method, settings, before_run=before_run):
                records.append(record)
                if progress is not None:
                    progress(record)
    check_greedy(records)
    return CheckResult(
        prompts=tuple(p.id for p in prompts),
        methods=tuple(m.name for m in methods),
        max_new_tokens=max_new_tokens,
        records=tuple(records),
        mismatches=tuple(find_mismatches(engine, records)),
    )


def find_mismatches(engine: ChatEngine, records: Sequence[RunRecord]) -> list[Mismatch]:
    plain = {r.prompt_id: r for r in records if r.kind == "plain"}
    out: list[Mismatch] = []
    for r in records:
        if r.matches_plain is not False or r.first_mismatch is None:
            continue
        reference = plain[r.prompt_id].token_ids
        i = r.first_mismatch
        out.append(
            Mismatch(r.prompt_id, r.method, i, _token(engine, reference, i), _token(engine, r.token_ids, i))
        )
    return out


def _token(engine: ChatEngine, ids: Sequence[int], index: int) -> tuple[int, str] | None:
    if index >= len(ids):
        return None
    return ids[index], str(engine.tokenizer.decode([ids[index]]))
