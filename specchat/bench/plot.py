"""The benchmark plot: tokens/s and speedup against γ, measured and predicted."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from specchat.bench import BenchError
from specchat.bench.costs import Costs
from specchat.bench.figures import ALL, all_groups, predicted_curve
from specchat.bench.llamacpp_peer import PLAIN_ROW as LLAMA_PLAIN
from specchat.bench.llamacpp_peer import SPECULATIVE_ROW as LLAMA_SPECULATIVE
from specchat.bench.methods import Method
from specchat.bench.run_record import RunRecord
from specchat.engine.registry import DRAFTERS

_ROW_COLOURS = ("tab:purple", "tab:brown", "tab:pink", "tab:gray")
_LINES = {
    "heuristic": ("tab:orange", ":"),
    "adaptive": ("tab:green", ":"),
    # One line per single-row drafter of the registry, so a new drafter is plotted unasked.
    **{
        spec.name: (_ROW_COLOURS[i % len(_ROW_COLOURS)], ":")
        for i, spec in enumerate(s for s in reversed(DRAFTERS) if s.bench == "row")
    },
    LLAMA_PLAIN: ("tab:olive", "-."),
    LLAMA_SPECULATIVE: ("tab:cyan", "-."),
}
"""Methods drawn as horizontal lines (not functions of γ): colour and line style."""


def write_plot(
    path: Path,
    records: Sequence[RunRecord],
    methods: Sequence[Method],
    costs: Costs,
    *,
    title: str = "specchat bench",
) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:  # pragma: no cover - matplotlib is a dev/bench extra
        raise BenchError("--plot needs matplotlib: pip install 'specchat[bench]'.") from err

    overall = {g.method: g for g in all_groups(records, methods, costs) if g.category == ALL}
    # Groups whose speed was refused (a duration not measured) are left out of the plot.
    overall = {name: g for name, g in overall.items() if g.tok_s is not None}
    plain = overall.get("plain")
    plain_tok_s = (plain.tok_s or 0.0) if plain else 0.0
    sweep = sorted(
        ((m.sweep_gamma, overall[m.name]) for m in methods if m.sweep_gamma and m.name in overall),
        key=lambda pair: pair[0] or 0,
    )
    hf = sorted(
        ((m.gamma, overall[m.name]) for m in methods if m.kind == "hf" and m.gamma and m.name in overall),
        key=lambda pair: pair[0],
    )
    gammas = [g for g, _ in sweep] or [1]
    fine = list(range(1, max(gammas) + 1))
    fixed = [r for r in records if r.method.startswith("fixed-")]
    tested = sum(r.tested for r in fixed)
    alpha = sum(r.accepted for r in fixed) / tested if tested else None

    fig, (ax_rate, ax_speed) = plt.subplots(1, 2, figsize=(11, 4.2))
    predicted = [(g, x.predicted) for g, x in sweep if x.predicted is not None]
    if predicted:
        xs, ys = [g for g, _ in predicted], [p for _, p in predicted]
        label = "predicted (this run's α, c, v)"
        ax_rate.plot(xs, [plain_tok_s * y for y in ys], "x--", color="tab:blue", label=label)
        ax_speed.plot(xs, ys, "x--", color="tab:blue", label=label)
    if alpha is not None:
        curve = predicted_curve(alpha, costs, fine)
        label = f"predicted (probe c, v; α={alpha:.2f})"
        ax_rate.plot(fine, [plain_tok_s * curve[g] for g in fine], ":", color="tab:gray", label=label)
        ax_speed.plot(fine, [curve[g] for g in fine], ":", color="tab:gray", label=label)
    for points, style, color, label in (
        (sweep, "o-", "tab:blue", "specchat"),
        (hf, "s-", "tab:red", "HF assisted"),
    ):
        if points:
            xs = [g for g, _ in points]
            ax_rate.plot(xs, [x.tok_s for _, x in points], style, color=color, label=label)
            ax_speed.plot(xs, [x.speedup or 0 for _, x in points], style, color=color, label=label)
    if plain:
        ax_rate.axhline(plain_tok_s, color="black", lw=1, label="plain")
    ax_speed.axhline(1.0, color="black", lw=1, label="plain")
    for name, (color, style) in _LINES.items():
        g = overall.get(name)
        if g is None or g.tok_s is None:
            continue
        ax_rate.axhline(g.tok_s, color=color, lw=1, ls=style, label=name)
        ax_speed.axhline(g.speedup or 0, color=color, lw=1, ls=style, label=name)
    ax_rate.set(xlabel="γ (drafted tokens per round)", ylabel="tokens / s", title="tokens per second")
    ax_speed.set(xlabel="γ (drafted tokens per round)", ylabel="× plain", title="speedup over plain")
    for ax in (ax_rate, ax_speed):
        ax.set_xticks(fine)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    try:
        fig.savefig(path, dpi=120)
    except OSError as err:
        raise BenchError(f"cannot write the plot to {path}: {err.strerror or err}.") from err
    finally:
        plt.close(fig)
    return path
