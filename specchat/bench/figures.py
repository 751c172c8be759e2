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

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from specchat.bench.costs import Costs
from specchat.bench.methods import Method
from specchat.bench.question_file import TASKS
from specchat.bench.run_record import RunRecord, fastest
from specchat.engine.costs import expected_tokens_per_round
from specchat.engine.events import RoundEvent
from specchat.engine.metrics import StreamStats, positions_tested
from specchat.engine.registry import is_model

ALL = "all"


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
