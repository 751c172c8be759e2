"""From run records to figures: per method and category, the best configuration, the targets.

The headline ratio is the total wait: our plain decoding's total wait over the method's, summed
over the same prompts (> 1: the user waits less). A run's total wait is its whole wall time,
from Enter to the last token: the target's prefill, the draft model's catch-up, decoding. It is
reported beside its parts (target prefill, draft prefill, time to first token, decoding) and
judged per category by the guard (:func:`guard`): a method whose total wait in a category is
below :data:`GUARD_RATIO` of our plain's is flagged.

Speedups compare decoding speed over the same prompts: each run's decoded tokens over the
decoding time measured in that run (its wall time less its own target prefill for specchat, so
a draft model's prefill counts against speculation; from the first streamed tokens for the
peers). A group with a run whose duration was not measured gets no speed, and the report says
which run and why (:func:`refusals`). The end-to-end rate (prefill included) is reported next
to it. α, τ and per-position acceptance are pooled from the engine's own events with its
:class:`~specchat.engine.metrics.StreamStats`. The prediction is the seed formula
E[T](α, γ) / (γ·c + v(γ)) applied round by round: α is the group's acceptance per tested
position, c and v(γ) come from the rounds' own timings or the cost probe (for the n-gram
drafter, c is its measured lookup time over a target step).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass

from specchat.bench.costs import Costs
from specchat.bench.llamacpp_peer import PLAIN_ROW as LLAMA_PLAIN
from specchat.bench.llamacpp_peer import SPECULATIVE_ROW as LLAMA_SPECULATIVE
from specchat.bench.question_file import TASKS
from specchat.bench.runner import Method, RunRecord, fastest
from specchat.engine.events import RoundEvent
from specchat.engine.gamma import positions_tested
from specchat.engine.metrics import StreamStats, expected_tokens_per_round
from specchat.engine.registry import is_model

ALL = "all"

TARGETS = {
    "measured_over_predicted": 0.9,
    "vs_hf_assisted": 1.2,
    "adaptive_min_category": 1.0,
    "adaptive_overall": 1.5,
}


@dataclass(frozen=True)
class Group:
    method: str
    category: str
    kind: str
    runs: int
    tokens: int
    wall_s: float
    tok_s: float | None
    """Decoding speed (decoded tokens over decoding time, both from each run): speedups are
    ratios of these. None when a run's duration was not measured (see ``refused``)."""
    e2e_tok_s: float | None
    """Tokens over the whole wall time, prefill included."""
    speedup: float | None
    alpha: float | None
    alpha_iid: float | None
    tau: float | None
    per_position: tuple[float | None, ...]
    mean_gamma: float | None
    predicted: float | None
    """The seed formula with c and v(γ) as these runs measured them (see :func:`predict`)."""
    predicted_probe: float | None
    """The same with c and v(γ) from the cost probe, measured before the runs."""
    measured_over_predicted: float | None
    greedy_equal: bool | None
    mismatches: int
    refused: tuple[str, ...] = ()
    """Runs whose decoding time could not be used, each with the reason: no speed is given."""
    wait_ratio: float | None = None
    """The headline: our plain's total wait over this method's, summed over the same prompts
    (> 1: faster). None where our plain did not run every one of them."""
    total_wait_s: float | None = None
    """Mean total wait per reply: from Enter to the last token (the run's wall time)."""
    target_prefill_ms: float | None = None
    """Mean target prefill per reply (None where a run cannot separate it: Hugging Face)."""
    draft_prefill_ms: float | None = None
    """Mean draft-model catch-up per reply (:attr:`RunRecord.draft_prefill_ms`; 0 for plain,
    None for the peers)."""
    ttft_ms: float | None = None
    """Mean time to first token per reply (:attr:`RunRecord.ttft_s`)."""
    decode_s: float | None = None
    """Mean decoding time per reply (``decode_wall_s``: for specchat, total wait less target prefill)."""

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def round_events(records: Sequence[RunRecord]) -> list[RoundEvent]:
    return [e for r in records for e in r.round_events]


def pooled_stats(records: Sequence[RunRecord]) -> StreamStats:
    """The engine's running figures over several replies: their rounds pooled, their tokens summed."""
    stats = StreamStats(tokens=sum(r.tokens for r in records))
    stats.extend(round_events(records))
    return stats


def plain_step_ms(records: Sequence[RunRecord]) -> float | None:
    """Mean milliseconds of one plain decoding step, from plain runs' round events."""
    steps = [e.verify_ms for r in records if r.kind == "plain" for e in r.round_events]
    return sum(steps) / len(steps) if steps else None


def predict(
    records: Sequence[RunRecord], costs: Costs, plain_ms: float | None = None, *, in_situ: bool = True
) -> float | None:
    """Predicted speedup over plain for these runs: the seed formula applied round by round.

    Each round that drafted d tokens is expected to yield E[T](α, d) tokens for d·c + v(d)
    plain steps, with α the pooled acceptance per tested position of its drafter. ``in_situ``
    takes c and v(d) from the runs' own RoundEvents (draft_ms per drafted token and verify_ms by
    width, over ``plain_ms``, the plain runs' step on the same prompts); otherwise c and v come
    from the cost probe (a lookup's c is always its measured time: the probe has no lookups).
    """
    if not records or any(r.kind not in ("plain", "specchat") for r in records):
        return None
    if all(r.kind == "plain" for r in records):
        return 1.0
    log = round_events(records)
    step = plain_ms if in_situ and plain_ms else costs.target_ms
    alpha: dict[str, float] = {}
    c: dict[str, float] = {}
    for source in {e.drafter for e in log}:
        rows = [e for e in log if e.drafter == source and e.drafted > 0]
        tested = sum(positions_tested(e) for e in rows)
        drafted = sum(e.drafted for e in rows)
        alpha[source] = sum(e.accepted for e in rows) / tested if tested else 0.0
        measured_c = sum(e.draft_ms for e in rows) / drafted / step if drafted else 0.0
        c[source] = costs.c if (not in_situ and is_model(source) and costs.c is not None) else measured_c
    widths: dict[int, list[float]] = {}
    for e in log:
        widths.setdefault(e.drafted, []).append(e.verify_ms)

    def v(width: int) -> float:
        if not in_situ:
            return costs.v(width)
        if width == 0:
            return 1.0
        return sum(widths[width]) / len(widths[width]) / step

    tokens = cost = 0.0
    for e in log:
        tokens += expected_tokens_per_round(alpha[e.drafter], e.drafted)
        cost += e.drafted * c[e.drafter] + v(e.drafted)
    return tokens / cost if cost else None


def predicted_curve(alpha: float, costs: Costs, gammas: Sequence[int]) -> dict[int, float]:
    """The formula at fixed γ: E[T](α, γ) / (γ·c + v(γ))."""
    c = costs.c or 0.0
    return {g: expected_tokens_per_round(alpha, g) / (g * c + costs.v(g)) for g in gammas}


def decode_rate(records: Sequence[RunRecord]) -> float | None:
    """Decoded tokens over decoding time, summed over runs; None if any run's time is unusable."""
    if any(r.tok_s is None for r in records):
        return None
    tokens = sum(r.decode_tokens for r in records)
    seconds = sum(r.decode_wall_s or 0.0 for r in records)
    # No decoding step at all (every reply ended with its first token): no rate to give.
    return tokens / seconds if tokens and seconds > 0 else None


def report_categories(records: Sequence[RunRecord]) -> list[str]:
    """The records' categories in order of appearance, then any task they make up together.

    Spec-Bench reports MT-Bench's eight categories as one task, ``mt_bench``
    (:data:`~specchat.bench.question_file.TASKS`): where a question file brings two or more of
    them, that column is added, so the table lines up with Spec-Bench's published one.
    """
    categories = list(dict.fromkeys(r.category for r in records))
    present = set(categories)
    for task, members in TASKS.items():
        if task not in present and len(members & present) >= 2:
            categories.append(task)
    return categories


def in_category(record: RunRecord, category: str) -> bool:
    """Whether ``record`` counts towards ``category`` (ALL, a task of several, or its own)."""
    if category == ALL or category == record.category:
        return True
    members = TASKS.get(category)
    return members is not None and record.category in members


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _mean(values: Iterable[float | None], scale: float = 1.0) -> float | None:
    """The mean of ``values`` times ``scale``; None when there are none or any is unknown."""
    present = list(values)
    if not present or any(v is None for v in present):
        return None
    return sum(v for v in present if v is not None) / len(present) * scale


def wait_ratio(rows: Sequence[RunRecord], baseline: Sequence[RunRecord]) -> float | None:
    """``baseline``'s total wait over ``rows``' total wait, each summed over ``rows``' prompts,
    each of ``rows`` taken at the length of the baseline's reply to its prompt
    (:meth:`RunRecord.wait_for`: the same wall time where the texts are the same, as at T = 0).

    With our plain runs as the baseline this is the headline ratio: > 1, the user waits less
    than with plain decoding. None unless the baseline covers every prompt of ``rows``, or
    where a side took no time.
    """
    prompts = {r.prompt_id for r in rows}
    matching = {r.prompt_id: r for r in baseline if r.prompt_id in prompts}
    if not rows or set(matching) != prompts:
        return None
    method_s = sum(r.wait_for(matching[r.prompt_id].tokens) for r in rows)
    baseline_s = sum(r.total_wait_s for r in matching.values())
    return baseline_s / method_s if method_s > 0 and baseline_s > 0 else None


def group(records: Sequence[RunRecord], method: str, category: str, costs: Costs) -> Group | None:
    """Figures for one method over one category (or all), from the fastest repeat of each run.

    The greedy check covers every repeat.
    """
    checked = [r for r in records if r.method == method and in_category(r, category)]
    records = fastest(records)
    rows = [r for r in records if r.method == method and in_category(r, category)]
    if not rows:
        return None
    prompts = {r.prompt_id for r in rows}
    plain = [r for r in records if r.kind == "plain" and r.prompt_id in prompts]
    refused = tuple(f"{r.describe()}: {r.timing_problem}" for r in rows if r.timing_problem)
    tok_s = decode_rate(rows)
    plain_rate = decode_rate(plain) if plain else None
    speedup = tok_s / plain_rate if tok_s is not None and plain_rate else None
    step = plain_step_ms(plain)
    predicted = predict(rows, costs, step)
    checked = [r for r in checked if r.matches_plain is not None]
    stats = pooled_stats(rows)
    wall = sum(r.wall_s for r in rows)
    return Group(
        method=method,
        category=category,
        kind=rows[0].kind,
        runs=len(rows),
        tokens=stats.tokens,
        wall_s=wall,
        tok_s=tok_s,
        e2e_tok_s=stats.tokens / wall if wall > 0 else None,
        speedup=speedup,
        alpha=stats.alpha if rows[0].kind != "llamacpp" else peer_alpha(rows),
        alpha_iid=_ratio(stats.accepted, sum(r.tested for r in rows)),
        tau=stats.tau,
        per_position=stats.per_position,
        mean_gamma=_ratio(stats.drafted, stats.rounds) if rows[0].kind == "specchat" else None,
        predicted=predicted,
        predicted_probe=predict(rows, costs, step, in_situ=False),
        measured_over_predicted=speedup / predicted if speedup is not None and predicted else None,
        greedy_equal=all(bool(r.matches_plain) for r in checked) if checked else None,
        mismatches=sum(1 for r in checked if not r.matches_plain),
        refused=refused,
        wait_ratio=wait_ratio(rows, plain),
        total_wait_s=wall / len(rows),
        target_prefill_ms=_mean(r.prefill_ms for r in rows),
        draft_prefill_ms=_mean(r.draft_prefill_ms for r in rows),
        ttft_ms=_mean((r.ttft_s for r in rows), 1000.0),
        decode_s=_mean(r.decode_wall_s for r in rows),
    )


def peer_alpha(records: Sequence[RunRecord]) -> float | None:
    """llama.cpp's acceptance over these runs, from its own draft counts."""
    drafted = sum(r.peer_timings.draft_n or 0 for r in records if r.peer_timings)
    accepted = sum(r.peer_timings.draft_n_accepted or 0 for r in records if r.peer_timings)
    return accepted / drafted if drafted else None


def refusals(records: Sequence[RunRecord]) -> list[str]:
    """Every run (of those the report uses) whose speed was refused, with the reason."""
    return [f"{r.describe()}: {r.timing_problem}" for r in fastest(records) if r.timing_problem]


def all_groups(records: Sequence[RunRecord], methods: Sequence[Method], costs: Costs) -> list[Group]:
    categories = report_categories(records)
    out: list[Group] = []
    for method in methods:
        for category in [ALL, *categories]:
            g = group(records, method.name, category, costs)
            if g is not None:
                out.append(g)
    return out


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
            f"{prompt}: {_fmt(ratio, suffix='×')}" for prompt, ratio in self.prompts[:GUARD_SHOWN_PROMPTS]
        )
        more = len(self.prompts) - GUARD_SHOWN_PROMPTS
        listed = f"{worst}, … {more} more" if more > 0 else worst
        return (
            f"⚑ {self.method} · {self.category}: {_floored(self.ratio)} our plain ({self.measure}), "
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


def _floored(ratio: object) -> str:
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


def event_costs(records: Sequence[RunRecord]) -> dict[str, object]:
    """c and v(γ) as the runs' own events saw them (a cross-check of the probe)."""
    records = fastest(records)
    step_ms = plain_step_ms(records)
    if not step_ms:
        return {}
    fixed = [r for r in records if is_model(r.drafter) and r.schedule == "fixed" and r.kind == "specchat"]
    log = round_events(fixed)
    drafted = sum(e.drafted for e in log)
    by_gamma: dict[int, list[RoundEvent]] = {}
    for r in fixed:
        by_gamma.setdefault(r.gamma, []).extend(r.round_events)
    v = {
        str(g): round(sum(e.verify_ms for e in events) / len(events) / step_ms, 4)
        for g, events in sorted(by_gamma.items())
        if events
    }
    return {
        "plain_step_ms": round(step_ms, 3),
        "c": round(sum(e.draft_ms for e in log) / drafted / step_ms, 4) if drafted else None,
        "v": v,
    }


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


def to_json(
    records: Sequence[RunRecord],
    methods: Sequence[Method],
    costs: Costs,
    meta: dict[str, object],
) -> dict[str, object]:
    return {
        "meta": meta,
        "costs": {"probe": costs.to_json(), "events": event_costs(records)},
        "summary": summarize(records, methods, costs),
        "groups": [g.to_json() for g in all_groups(records, methods, costs)],
        "records": [r.to_json() for r in records],
    }


# ---------------------------------------------------------------------------------------- tables
def _fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def _speed(g: Group) -> str:
    """tok/s, or "refused" where a run's duration was not measured (the reason is printed below)."""
    return "refused" if g.refused else _fmt(g.tok_s)


def _equal(value: bool | None) -> str:
    return "–" if value is None else ("yes" if value else "NO")


def _wait(g: Group) -> str:
    """The headline ratio, marked where the guard flags it."""
    if g.wait_ratio is None:
        return "–"
    flag = " ⚑" if g.kind in GUARDED_KINDS and g.wait_ratio < GUARD_RATIO else ""
    return f"{g.wait_ratio:.2f}×{flag}"


WAIT_LEGEND = (
    "wait ×: our plain's total wait (Enter to last token) ÷ the method's, same prompts; "
    "speedup: decode tok/s ÷ our plain's; > 1 is faster"
)


def render_tables(records: Sequence[RunRecord], methods: Sequence[Method], costs: Costs) -> list[object]:
    """rich renderables: the per-method table, where each method's wait goes, and the total-wait
    and decode-speedup by category tables."""
    from rich.markup import escape
    from rich.table import Table

    groups = all_groups(records, methods, costs)
    categories = report_categories(records)
    overall = [g for g in groups if g.category == ALL]
    main = Table(title="specchat bench · all prompts", title_justify="left", caption=WAIT_LEGEND)
    columns = (
        "method", "wait ×", "speedup", "tok/s", "e2e", "α", "τ", "γ̄", "predicted", "meas/pred", "= ref",
    )  # fmt: skip
    for column in columns:
        main.add_column(column, justify="left" if column == "method" else "right")
    for g in overall:
        main.add_row(
            g.method,
            _wait(g),
            _fmt(g.speedup, suffix="×"),
            _speed(g),
            _fmt(g.e2e_tok_s),
            _fmt(g.alpha),
            _fmt(g.tau),
            _fmt(g.mean_gamma, ".1f"),
            _fmt(g.predicted, suffix="×"),
            _fmt(g.measured_over_predicted),
            _equal(g.greedy_equal),
        )
    waits = Table(title="where the wait goes · mean per reply", title_justify="left")
    for column in ("method", *WAIT_COLUMNS):
        waits.add_column(column, justify="left" if column == "method" else "right")
    for g in overall:
        waits.add_row(g.method, *_wait_cells(g))
    index = {(g.method, g.category): g for g in groups}

    def by_category(title: str, plain_cell: Callable[[Group], str], cell: Callable[[Group], str]) -> object:
        table = Table(title=title, title_justify="left")
        table.add_column("method")
        for category in categories:
            table.add_column(escape(category), justify="right")  # a question file's name, not markup
        for g in overall:
            cells = []
            for category in categories:
                cg = index.get((g.method, category))
                cells.append("–" if cg is None else plain_cell(cg) if g.kind == "plain" else cell(cg))
            table.add_row(g.method, *cells)
        return table

    wait_by_cat = by_category(
        f"total wait: our plain ÷ method, by category (seconds per reply in the plain row; "
        f"⚑ below {GUARD_RATIO})",
        lambda cg: _fmt(cg.total_wait_s),
        _wait,
    )
    by_cat = by_category(
        "speedup over plain by category (tok/s in the plain row)",
        _speed,
        lambda cg: "refused" if cg.refused else _fmt(cg.speedup, suffix="×"),
    )
    return [main, waits, wait_by_cat, by_cat]


WAIT_COLUMNS = ("prefill ms", "draft prefill ms", "TTFT ms", "decode s", "total wait s")
"""The parts of a reply's wait: target prefill, the draft's catch-up, time to first token,
decoding, and the whole (prefill and decoding add up to it)."""


def _wait_cells(g: Group) -> list[str]:
    return [
        _fmt(g.target_prefill_ms, ".1f"),
        _fmt(g.draft_prefill_ms, ".1f"),
        _fmt(g.ttft_ms, ".1f"),
        _fmt(g.decode_s, ".3f"),
        _fmt(g.total_wait_s, ".3f"),
    ]


def render_detail(records: Sequence[RunRecord], methods: Sequence[Method], costs: Costs) -> object:
    """Every (method, category) row: total wait against plain and its parts, tok/s, α, τ,
    speedup, predicted, measured/predicted."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="per method and category", title_justify="left", caption=WAIT_LEGEND)
    columns = (
        "method", "category", "wait ×", "speedup", "tok/s", *WAIT_COLUMNS,
        "α", "τ", "predicted", "probe", "meas/pred", "= ref",
    )  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column in ("method", "category") else "right")
    for g in all_groups(records, methods, costs):
        if g.category == ALL:
            continue
        table.add_row(
            g.method,
            escape(g.category),
            _wait(g),
            _fmt(g.speedup, suffix="×"),
            _speed(g),
            *_wait_cells(g),
            _fmt(g.alpha),
            _fmt(g.tau),
            _fmt(g.predicted, suffix="×"),
            _fmt(g.predicted_probe, suffix="×"),
            _fmt(g.measured_over_predicted),
            _equal(g.greedy_equal),
        )
    return table


def headline(summary: dict[str, object], costs: Costs) -> list[str]:
    """A few plain lines under the tables: the costs, the shortest total wait, the best decoding
    speed, the targets and the guard's flags."""

    def f(key: str, spec: str = ".2f") -> str:
        value = summary.get(key)
        return "–" if value is None else f"{value:{spec}}"

    c = costs.c
    v = ", ".join(f"v({g})={costs.v(g):.2f}" for g in sorted(costs.verify_ms))
    ratios = summary.get("total_wait_ratio")
    best_wait = ratios.get(summary.get("best")) if isinstance(ratios, dict) else None
    lines = [
        f"costs: target step {costs.target_ms:.1f} ms, draft step "
        f"{_fmt(costs.draft_ms, '.1f')} ms, c={_fmt(c, '.3f')}; {v}",
        f"shortest wait: {summary.get('best_total_wait')} at {f('best_total_wait_ratio')}× our plain's "
        f"total wait ({f('plain_total_wait_s', '.3f')} s a reply)",
        f"best: {summary.get('best')} at {f('best_tok_s')} tok/s = {f('speedup_vs_plain')}× plain "
        f"({f('plain_tok_s')} tok/s; total wait {_fmt(best_wait, suffix='×')}), "
        f"predicted {f('predicted_speedup')}× "
        f"(from the probe's c and v: {f('predicted_speedup_probe')}×), "
        f"measured/predicted {f('measured_over_predicted')} (probe: {f('measured_over_predicted_probe')})",
        f"vs Hugging Face assisted ({summary.get('best_hf_assisted')}, {f('hf_assisted_tok_s')} tok/s): "
        f"{f('vs_hf_assisted')}×",
    ]
    adaptive = summary.get("adaptive")
    if isinstance(adaptive, dict):
        lines.append(
            f"adaptive: total wait {_fmt(adaptive.get('total_wait_ratio'), suffix='×')} overall, worst "
            f"category {_fmt(adaptive.get('min_category_total_wait_ratio'), suffix='×')}; decode "
            f"{_fmt(adaptive.get('speedup_vs_plain'), suffix='×')} overall, "
            f"worst category {_fmt(adaptive.get('min_category_speedup'), suffix='×')}"
        )
    llama = summary.get("llama_cpp")
    if isinstance(llama, dict):
        lines.append(
            f"vs llama.cpp plain ({_fmt(llama.get('plain_tok_s'))} tok/s): specchat plain "
            f"{_fmt(llama.get('specchat_plain_vs_llama_plain'), suffix='×')}, defaults ({DEFAULTS}) "
            f"{_fmt(llama.get('defaults_vs_llama_plain'), suffix='×')} overall (total wait "
            f"{_fmt(llama.get('defaults_vs_llama_plain_total_wait'), suffix='×')}), worst category "
            f"{_fmt(llama.get('defaults_vs_llama_plain_min_category'), suffix='×')}; llama.cpp speculative "
            f"{_fmt(llama.get('speculative_tok_s'))} tok/s (α {_fmt(llama.get('speculative_alpha'))})"
        )
    targets = summary.get("targets")
    if isinstance(targets, dict):
        marks = {True: "met", False: "NOT met", None: "n/a"}
        lines.append("targets: " + "; ".join(f"{k}: {marks[v]}" for k, v in targets.items()))
    refused = summary.get("refused")
    if isinstance(refused, list) and refused:
        lines.append(f"refused {len(refused)} speed figure(s); no tok/s is given for:")
        lines += [f"  {line}" for line in refused]
    lines += guard_lines(summary)
    return lines


def guard_lines(summary: dict[str, object]) -> list[str]:
    """The guard's verdict and one line per flag (total wait; then decoding speed, not judged)."""
    found = summary.get("guard")
    if not isinstance(found, dict):
        return []
    flags, decodes = found.get("flags") or [], found.get("decode_flags") or []
    assert isinstance(flags, list) and isinstance(decodes, list)
    if not flags:
        lines = [
            f"guard: every specchat method's total wait ≥ {GUARD_RATIO}× our plain's, in every "
            "category and over all prompts"
        ]
    else:
        lines = [f"guard: {len(flags)} total-wait flag(s), each below {GUARD_RATIO}× our plain's:"]
        lines += [str(flag["line"]) for flag in flags]
    by_method: dict[str, list[str]] = {}
    for flag in decodes:
        by_method.setdefault(str(flag["method"]), []).append(f"{flag['category']} {_floored(flag['ratio'])}")
    if by_method:
        lines.append(f"decode tok/s below {GUARD_RATIO}× our plain's (reported; the guard judges the wait):")
        lines += [f"  {method}: {', '.join(cells)}" for method, cells in by_method.items()]
    return lines
