"""How the exactness self-test reads, as plain strings: shared by `specchat selftest` and the chat.

The statistics come from :class:`specchat.engine.selftest.ExactnessReport`; this module only
words them, so the terminal and the self-test screen say the same thing. No textual, no torch.
"""

from __future__ import annotations

from rich.cells import cell_len, set_cell_size

from specchat.engine.selftest import SIGNIFICANCE, ExactnessReport, GreedyCheck
from specchat.presenters.bars import bar
from specchat.presenters.verdict import greedy_verdict

SHOWN_OUTCOMES = 12


def show_label(label: str) -> str:
    """An outcome's text with its whitespace visible (a reply often starts with a space or newline)."""
    return '"' + label.replace("\n", "\\n").replace("\t", "\\t") + '"'


def fit(text: str, cells: int) -> str:
    """``text`` cut or padded to exactly ``cells`` terminal cells (wide characters count two)."""
    return set_cell_size(text, cells)


def fraction(count: int, total: int) -> float:
    return count / total if total else 0.0


def progress_line(report: ExactnessReport, target: int) -> str:
    return (
        f"{report.samples}/{target} samples per lane · {noise_phrase(report)} · "
        f"{p_phrase(report)} · {report.samples_per_s:.0f} samples/s"
    )


def noise_phrase(report: ExactnessReport) -> str:
    return f"TV {report.tv:.4f} (noise band {report.noise_band:.4f})"


def p_phrase(report: ExactnessReport) -> str:
    if report.p_value is None:
        return "χ² p –"
    return f"χ² p {report.p_value:.3f}"


def tv_line(report: ExactnessReport) -> str:
    p = (
        ""
        if report.tv_p_value is None
        else f"; noise alone gives a TV this large {report.tv_p_value:.0%} of the time"
    )
    return (
        f"total variation distance {report.tv:.4f}: sampling noise alone reaches {report.noise_band:.4f} "
        f"at {report.samples} samples per lane (95th percentile, mean {report.noise_mean:.4f}){p}"
    )


def chi_square_line(report: ExactnessReport) -> str:
    if report.p_value is None:
        return "chi-square: needs at least two outcomes seen often enough (about 5 each)"
    return f"chi-square {report.chi2:.2f} on {report.dof} degrees of freedom: p = {report.p_value:.3f}"


def verdict_line(report: ExactnessReport) -> str:
    if report.consistent:
        return (
            f"verdict: consistent with exactness (neither test significant at p < {SIGNIFICANCE:g}): "
            "the two histograms look like samples of one distribution"
        )
    reasons = []
    if report.tv_p_value is not None and report.tv_p_value < SIGNIFICANCE:
        reasons.append(f"TV beyond sampling noise, p = {report.tv_p_value:.3f}")
    if report.p_value is not None and report.p_value < SIGNIFICANCE:
        reasons.append(f"chi-square p = {report.p_value:.4f}")
    return f"verdict: DIFFERENT distributions ({'; '.join(reasons)}): speculative sampling is not exact here"


def settings_line(report: ExactnessReport) -> str:
    s = report.settings
    return (
        f"T = {float(s.get('temperature', 0)):g}, γ {s.get('gamma')}, drafter {s.get('drafter')}, "
        f"first {report.tokens} token{'s' if report.tokens != 1 else ''} of the reply; "
        f"{report.samples} samples per lane in {report.elapsed_s:.1f} s"
    )


def histogram_lines(report: ExactnessReport, limit: int = SHOWN_OUTCOMES, width: int = 20) -> list[str]:
    rows = report.rows(limit)
    if not rows:
        return []
    n_spec, n_target = sum(report.speculative.values()), sum(report.target.values())
    label_width = min(24, max(cell_len(show_label(r.label)) for r in rows))
    lines = [f"{'outcome':<{label_width}}  {'speculative':<{width + 14}}  target"]
    for row in rows:
        label = fit(show_label(row.label), label_width)
        spec, target = cell(row.speculative, n_spec, width), cell(row.target, n_target, width)
        lines.append(f"{label}  {spec}  {target}")
    hidden = len(set(report.speculative) | set(report.target)) - len(rows)
    if hidden > 0:
        lines.append(f"… and {hidden} rarer outcomes")
    return lines


def cell(count: int, total: int, width: int) -> str:
    share = fraction(count, total)
    return f"{count:>7} {share:6.1%} {bar(share, width):<{width}}"


def report_lines(report: ExactnessReport) -> list[str]:
    return [
        *histogram_lines(report),
        "",
        settings_line(report),
        tv_line(report),
        chi_square_line(report),
        verdict_line(report),
    ]


def greedy_line(check: GreedyCheck) -> str:
    verdict = greedy_verdict(check.identical, check.first_difference)
    return f"{verdict}: {len(check.plain_ids)} tokens · {check.prompt}"
