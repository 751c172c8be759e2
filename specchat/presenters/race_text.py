"""How a race looks at a moment of its replay, as Rich text: shared by `specchat race` and the chat.

The race's lanes were measured one after the other (:func:`specchat.engine.race.run_race`); a
replay shows both at the same clock ``t``, each with the tokens that had arrived by then. Every
string the finish line shows is made here, so the terminal replay, the race screen and the
exports agree. Rich only: no textual, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.style import Style
from rich.table import Table
from rich.text import Text

from specchat.engine.race import LaneName, RaceLane, RaceResult
from specchat.presenters.verdict import greedy_verdict
from specchat.untrusted import visible

REPLAY_NOTE = (
    "Replay of measured runs: decoded one after the other on this machine, each from empty "
    "caches, then played back side by side at the pace each was measured."
)
LANE_TITLES: dict[LaneName, str] = {"plain": "plain decoding", "speculative": "speculative decoding"}


def lane_text(lane: RaceLane, t: float, styles: Mapping[str, Style | str]) -> Text:
    """The tokens of ``lane`` that had arrived ``t`` seconds after it started, by kind."""
    text = Text()
    for token in lane.tokens[: lane.shown_at(t)]:
        text.append(visible(token.text), style=styles.get(token.kind, ""))
    return text


def lane_status(lane: RaceLane, t: float) -> str:
    """The lane's clock line: time, tokens and tokens/s so far (final figures once finished)."""
    shown = lane.shown_at(t)
    if lane.finished_at(t):
        return f"finished in {lane.wall_s:.2f} s · {len(lane.tokens)} tokens · {lane.tokens_per_s:.1f} tok/s"
    rate = lane.rate_at(t)
    if rate is None:
        return f"{t:5.2f} s · reading the prompt…"
    return f"{t:5.2f} s · {shown} tokens · {rate:.1f} tok/s"


def clock(result: RaceResult, t: float) -> str:
    return f"t = {min(t, result.duration_s):.2f} s of {result.duration_s:.2f} s"


def settings_line(result: RaceResult) -> str:
    s = result.settings
    sampling = "greedy (T = 0)" if result.greedy else f"T = {float(s.get('temperature', 0)):g}"
    if s.get("seed") is not None and not result.greedy:
        sampling += f", seed {s['seed']}"
    return (
        f"γ {s.get('gamma')} {s.get('schedule')} · drafter {s.get('drafter')} · {sampling} · "
        f"up to {s.get('max_new_tokens')} tokens"
    )


def speedup_line(result: RaceResult) -> str:
    return (
        f"speed-up {result.speedup:.2f}× (speculative {result.speculative.tokens_per_s:.1f} tok/s "
        f"against plain {result.plain.tokens_per_s:.1f} tok/s, prefill excluded)"
    )


def acceptance_line(result: RaceResult) -> str:
    alpha = "–" if result.alpha is None else f"{result.alpha:.2f}"
    tau = "–" if result.tau is None else f"{result.tau:.2f}"
    rounds = result.speculative.summary.rounds
    return f"α {alpha} (accepted drafts / drafted) · τ {tau} tokens per round over {rounds} rounds"


def exactness_line(result: RaceResult) -> str:
    """At T = 0 the verdict on token-for-token identity; at T > 0 why none is expected."""
    if not result.greedy:
        return (
            f"T = {float(result.settings.get('temperature', 0)):g}: the two lanes are different samples "
            "from the same distribution, so their texts need not match (the self-test checks the "
            "distribution)."
        )
    n = len(result.plain.tokens)
    if result.identical:
        return f"identical token for token: yes, all {n} tokens"
    return (
        f"identical token for token: NO, the lanes differ from token {result.first_difference} "
        "(speculative decoding should reproduce plain decoding exactly at T = 0)"
    )


def finish_lines(result: RaceResult) -> list[str]:
    return [speedup_line(result), acceptance_line(result), exactness_line(result)]


def summary_line(result: RaceResult) -> str:
    """One line for logs and the CLI's end: speed-up, α, τ and the exactness verdict."""
    alpha = "–" if result.alpha is None else f"{result.alpha:.2f}"
    tau = "–" if result.tau is None else f"{result.tau:.2f}"
    if result.greedy:
        verdict = greedy_verdict(result.identical, result.first_difference)
    else:
        verdict = "different samples (T > 0)"
    return (
        f"race: plain {result.plain.tokens_per_s:.1f} tok/s · speculative "
        f"{result.speculative.tokens_per_s:.1f} tok/s · speed-up {result.speedup:.2f}× · "
        f"α {alpha} · τ {tau} · {verdict}"
    )


def race_frame(result: RaceResult, t: float, styles: Mapping[str, Style | str]) -> RenderableType:
    """The whole race at time ``t`` for a terminal: note, clock, both lanes, and the finish
    line once the slower lane is done."""
    lanes = Table.grid(expand=True, padding=(0, 1))
    lanes.add_column(ratio=1)
    lanes.add_column(ratio=1)
    panels = [
        Panel(
            lane_text(lane, t, styles),
            title=LANE_TITLES[lane.name],
            subtitle=lane_status(lane, t),
            border_style="green" if lane.name == "speculative" else "blue",
        )
        for lane in (result.plain, result.speculative)
    ]
    lanes.add_row(*panels)
    parts: list[RenderableType] = [
        Text(REPLAY_NOTE, style="italic"),
        Text(f"{clock(result, t)} · {settings_line(result)}", style="dim"),
        lanes,
    ]
    if t >= result.duration_s:
        parts.append(Text("\n".join(finish_lines(result)), style="bold"))
    return Group(*parts)
