"""The bench's report as people and programs read it: rich tables, the headline lines under
them, and the JSON record. Every figure comes from :mod:`specchat.bench.figures` and
:mod:`specchat.bench.summary`; this module only writes them out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specchat.bench.costs import Costs
from specchat.bench.figures import ALL, Group, all_groups, event_costs, report_categories
from specchat.bench.methods import Method
from specchat.bench.run_record import RunRecord
from specchat.bench.summary import DEFAULTS, GUARD_RATIO, GUARDED_KINDS, floored, summarize


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
        by_method.setdefault(str(flag["method"]), []).append(f"{flag['category']} {floored(flag['ratio'])}")
    if by_method:
        lines.append(f"decode tok/s below {GUARD_RATIO}× our plain's (reported; the guard judges the wait):")
        lines += [f"  {method}: {', '.join(cells)}" for method, cells in by_method.items()]
    return lines
