"""The bench's summary of a run: the headline figures (the shortest total wait, the best
decoding speed against plain, against Hugging Face assisted and against llama.cpp, the adaptive
schedule per category), the targets, and the guard's flags (:func:`guard`). Computed from the
groups of :mod:`specchat.bench.figures`; written out by :mod:`specchat.bench.report`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specchat.bench.costs import Costs
from specchat.bench.figures import (
    ALL,
    Group,
    all_groups,
    group,
    in_category,
    refusals,
    report_categories,
    wait_ratio,
)
from specchat.bench.llamacpp_peer import PLAIN_ROW as LLAMA_PLAIN
from specchat.bench.llamacpp_peer import SPECULATIVE_ROW as LLAMA_SPECULATIVE
from specchat.bench.methods import Method
from specchat.bench.run_record import RunRecord, fastest

TARGETS = {
    "measured_over_predicted": 0.9,
    "vs_hf_assisted": 1.2,
    "adaptive_min_category": 1.0,
    "adaptive_overall": 1.5,
}


GUARD_RATIO = 0.97
"""The guard's bound: a method whose total wait in a category is below this fraction of our
plain's (plain's wait ÷ the method's < 0.97, i.e. over 3 % slower) is flagged. Above run-to-run
noise on a quiet machine, below the losses worth knowing about."""

GUARDED_KINDS = ("specchat",)
"""What the guard judges: specchat's own methods. The peers are compared, not guarded."""

GUARD_SHOWN_PROMPTS = 5
"""Prompts named on a flag's line (its worst first); the JSON holds them all."""


@dataclass(frozen=True)
class GuardFlag:
    """One method in one category below :data:`GUARD_RATIO` of our plain."""

    method: str
    category: str
    measure: str
    """"total wait" (what the guard judges) or "decode tok/s" (reported beside it)."""
    ratio: float
    prompts: tuple[tuple[str, float | None], ...]
    """Every prompt of the category with its own ratio, the worst first (None: not measured)."""

    def line(self) -> str:
        worst = ", ".join(
            f"{prompt}: {'–' if ratio is None else f'{ratio:.2f}×'}"
            for prompt, ratio in self.prompts[:GUARD_SHOWN_PROMPTS]
        )
        more = len(self.prompts) - GUARD_SHOWN_PROMPTS
        listed = f"{worst}, … {more} more" if more > 0 else worst
        return (
            f"⚑ {self.method} · {self.category}: {floored(self.ratio)} our plain ({self.measure}), "
            f"below {GUARD_RATIO} — {len(self.prompts)} prompt(s), worst first: {listed}"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "method": self.method,
            "category": self.category,
            "measure": self.measure,
            "ratio": self.ratio,
            "threshold": GUARD_RATIO,
            "line": self.line(),
            "prompts": [{"prompt": prompt, "ratio": ratio} for prompt, ratio in self.prompts],
        }


def floored(ratio: object) -> str:
    """A flagged ratio to three places, rounded down: 0.9695 must not read as 0.970 "below 0.97"."""
    return f"{math.floor(float(ratio) * 1000) / 1000:.3f}×"  # type: ignore[arg-type]


def _per_prompt(records: Sequence[RunRecord], g: Group, measure: str) -> tuple[tuple[str, float | None], ...]:
    """Each prompt of ``g`` with its own ratio to our plain on that prompt, the worst first."""
    best = fastest(records)
    plain = {r.prompt_id: r for r in best if r.kind == "plain"}
    ratios: list[tuple[str, float | None]] = []
    for r in best:
        if r.method != g.method or not in_category(r, g.category):
            continue
        if measure == "total wait":
            ratio = wait_ratio([r], [plain[r.prompt_id]]) if r.prompt_id in plain else None
        else:
            base = plain[r.prompt_id].tok_s if r.prompt_id in plain else None
            ratio = r.tok_s / base if r.tok_s is not None and base else None
        ratios.append((r.prompt_id, ratio))
    return tuple(sorted(ratios, key=lambda item: (item[1] is None, item[1] or 0.0)))


def guard(records: Sequence[RunRecord], groups: Sequence[Group]) -> tuple[list[GuardFlag], list[GuardFlag]]:
    """Every specchat method in every category (and over all prompts) whose total-wait ratio to
    our plain is below :data:`GUARD_RATIO`, and, reported apart, those whose decoding speed is.

    Only what was measured is judged: a category our plain did not cover, or a refused speed,
    raises no flag. Sampling (T > 0) is judged the same way; only the greedy check needs T = 0.
    """
    waits: list[GuardFlag] = []
    decodes: list[GuardFlag] = []
    for g in groups:
        if g.kind not in GUARDED_KINDS:
            continue
        for ratio, measure, flags in (
            (g.wait_ratio, "total wait", waits),
            (g.speedup, "decode tok/s", decodes),
        ):
            if ratio is not None and ratio < GUARD_RATIO:
                prompts = _per_prompt(records, g, measure)
                flags.append(GuardFlag(g.method, g.category, measure, ratio, prompts))
    return waits, decodes


def summarize(records: Sequence[RunRecord], methods: Sequence[Method], costs: Costs) -> dict[str, object]:
    """The headline: every method's total wait against our plain's, the guard's flags, the best
    specchat configuration against plain and against HF assisted."""
    groups = all_groups(records, methods, costs)
    overall = {g.method: g for g in groups if g.category == ALL}
    categories = report_categories(records)
    plain = overall.get("plain")
    spec = [g for g in overall.values() if g.kind == "specchat" and g.speedup is not None]
    hf_assisted = [g for name, g in overall.items() if g.kind == "hf" and name != "hf-plain"]
    best = max(spec, key=lambda g: g.speedup or 0.0, default=None)
    best_hf = max((g for g in hf_assisted if g.tok_s is not None), key=lambda g: g.tok_s or 0.0, default=None)
    waited = [g for g in overall.values() if g.kind == "specchat" and g.wait_ratio is not None]
    best_wait = max(waited, key=lambda g: g.wait_ratio or 0.0, default=None)
    summary: dict[str, object] = {
        "plain_tok_s": plain.tok_s if plain else None,
        "plain_total_wait_s": plain.total_wait_s if plain else None,
        "total_wait_ratio": {name: g.wait_ratio for name, g in overall.items()},
        "best_total_wait": best_wait.method if best_wait else None,
        "best_total_wait_ratio": best_wait.wait_ratio if best_wait else None,
        "best": best.method if best else None,
        "best_tok_s": best.tok_s if best else None,
        "speedup_vs_plain": best.speedup if best else None,
        "predicted_speedup": best.predicted if best else None,
        "measured_over_predicted": best.measured_over_predicted if best else None,
        "predicted_speedup_probe": best.predicted_probe if best else None,
        "measured_over_predicted_probe": (
            best.speedup / best.predicted_probe if best and best.speedup and best.predicted_probe else None
        ),
        "alpha": best.alpha if best else None,
        "tau": best.tau if best else None,
        "best_hf_assisted": best_hf.method if best_hf else None,
        "hf_assisted_tok_s": best_hf.tok_s if best_hf else None,
        "vs_hf_assisted": (
            best.tok_s / best_hf.tok_s if best and best.tok_s and best_hf and best_hf.tok_s else None
        ),
    }
    if best is not None and best.method.startswith("fixed-"):
        same = overall.get(f"hf-assisted-{best.method.removeprefix('fixed-')}")
        summary["vs_hf_assisted_same_gamma"] = (
            best.tok_s / same.tok_s if best.tok_s and same and same.tok_s else None
        )
    adaptive = overall.get("adaptive")
    if adaptive is not None:
        index = {g.category: g for g in groups if g.method == "adaptive"}
        by_cat = {c: index[c].speedup if c in index else None for c in categories}
        wait_by_cat = {c: index[c].wait_ratio if c in index else None for c in categories}
        present = [v for v in by_cat.values() if v is not None]
        present_waits = [v for v in wait_by_cat.values() if v is not None]
        summary["adaptive"] = {
            "speedup_vs_plain": adaptive.speedup,
            "min_category_speedup": min(present) if present else None,
            "by_category": by_cat,
            "measured_over_predicted": adaptive.measured_over_predicted,
            "total_wait_ratio": adaptive.wait_ratio,
            "min_category_total_wait_ratio": min(present_waits) if present_waits else None,
            "by_category_total_wait_ratio": wait_by_cat,
        }
    greedy = {name: g.greedy_equal for name, g in overall.items() if g.kind != "plain"}
    summary["greedy_equal"] = greedy
    if LLAMA_PLAIN in overall:
        summary["llama_cpp"] = _versus_llama_cpp(records, overall, categories, costs)
    summary["refused"] = refusals(records)
    summary["targets"] = _targets(summary)
    waits, decodes = guard(records, groups)
    summary["guard"] = {
        "threshold": GUARD_RATIO,
        "measure": "total wait",
        "kinds": list(GUARDED_KINDS),
        "passed": not waits,
        "flags": [f.to_json() for f in waits],
        "decode_flags": [f.to_json() for f in decodes],
    }
    return summary


DEFAULTS = "hybrid"
"""The method that runs what `chat` and `generate` run by default (hybrid drafter, adaptive γ)."""


def _versus_llama_cpp(
    records: Sequence[RunRecord], overall: dict[str, Group], categories: Sequence[str], costs: Costs
) -> dict[str, object]:
    """specchat's plain decoding and its defaults against llama.cpp's plain decoding."""

    def ratio(a: Group | None, b: Group | None) -> float | None:
        return a.tok_s / b.tok_s if a and b and a.tok_s is not None and b.tok_s else None

    llama_plain = overall[LLAMA_PLAIN]
    llama_spec = overall.get(LLAMA_SPECULATIVE)
    defaults = overall.get(DEFAULTS)
    by_category = {
        c: ratio(group(records, DEFAULTS, c, costs), group(records, LLAMA_PLAIN, c, costs))
        for c in categories
    }
    present = [v for v in by_category.values() if v is not None]
    llama_rows = [r for r in fastest(records) if r.method == LLAMA_PLAIN]
    default_rows = [r for r in fastest(records) if r.method == DEFAULTS]
    return {
        "plain_tok_s": llama_plain.tok_s,
        "speculative_tok_s": llama_spec.tok_s if llama_spec else None,
        "speculative_alpha": llama_spec.alpha if llama_spec else None,
        "specchat_plain_vs_llama_plain": ratio(overall.get("plain"), llama_plain),
        "defaults_vs_llama_plain": ratio(defaults, llama_plain),
        "defaults_vs_llama_speculative": ratio(defaults, llama_spec),
        "defaults_vs_llama_plain_by_category": by_category,
        "defaults_vs_llama_plain_min_category": min(present) if present else None,
        "defaults_vs_llama_plain_total_wait": wait_ratio(default_rows, llama_rows) if default_rows else None,
    }


def _targets(summary: dict[str, object]) -> dict[str, bool | None]:
    def at_least(value: object, bound: float) -> bool | None:
        return None if value is None else bool(float(value) >= bound)  # type: ignore[arg-type]

    adaptive = summary.get("adaptive") or {}
    assert isinstance(adaptive, dict)
    targets = {
        "measured_over_predicted >= 0.9": at_least(summary.get("measured_over_predicted"), 0.9),
        "vs_hf_assisted >= 1.2": at_least(summary.get("vs_hf_assisted"), 1.2),
        "adaptive >= 1.0 in every category": at_least(adaptive.get("min_category_speedup"), 1.0),
        "adaptive >= 1.5 overall": at_least(adaptive.get("speedup_vs_plain"), 1.5),
    }
    llama = summary.get("llama_cpp")
    if isinstance(llama, dict):
        targets.update(
            {
                "plain >= 0.9x llama.cpp plain": at_least(llama.get("specchat_plain_vs_llama_plain"), 0.9),
                "defaults >= 1.5x llama.cpp plain": at_least(llama.get("defaults_vs_llama_plain"), 1.5),
                "defaults >= 1.0x llama.cpp plain in every category": at_least(
                    llama.get("defaults_vs_llama_plain_min_category"), 1.0
                ),
            }
        )
    return targets
