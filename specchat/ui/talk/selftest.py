"""The exactness self-test screen: two histograms that build up live, and how far apart they are.

At T > 0 a thread worker samples the first tokens of a fixed prompt's reply again and again,
by speculative decoding (the current drafter and γ) and by the target alone
(:class:`~specchat.engine.selftest.ExactnessSampler`), and reports twice a second: both
histograms side by side, the total variation distance against the band sampling noise alone
reaches at this sample count, and a chi-square p-value. At T = 0 it decodes a few prompts both
ways and shows whether they are identical token for token. T switches between the two.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Static

from specchat.config import data_dir
from specchat.engine.registry import proposes
from specchat.engine.selftest import (
    GREEDY_PROMPTS,
    SELFTEST_PROMPT,
    ExactnessReport,
    ExactnessSampler,
    GreedyCheck,
    greedy_equality,
    selftest_messages,
)
from specchat.presenters.bars import bar
from specchat.presenters.selftest_text import (
    chi_square_line,
    fit,
    fraction,
    greedy_line,
    settings_line,
    show_label,
    tv_line,
    verdict_line,
)
from specchat.ui.settings.keys import TALK_SCREEN_KEYS, KeySpec, bindings
from specchat.ui.state.commands import CommandDispatch, Commands
from specchat.ui.state.lease import JobEnded, ModelLease, run_job
from specchat.untrusted import json_text

if TYPE_CHECKING:
    from specchat.engine.backend import Controls

SCREEN_SAMPLES = 100_000
"""Samples per lane before the screen stops by itself (the speaker usually stops it first)."""
SCREEN_TOKENS = 1
"""Reply tokens per sample on screen: one round and one target step each, so a real pair on two
cores reaches a telling count within a minute (`specchat selftest --tokens 2` tests the second
position too)."""
SAMPLING_TEMPERATURE = 1.0
"""The temperature T switches to from T = 0."""
REPORT_EVERY_S = 0.5
SHOWN_OUTCOMES = 14
GREEDY_TOKENS = 48
BAR_WIDTH = 24


class SamplesReported(Message):
    def __init__(self, report: ExactnessReport) -> None:
        super().__init__()
        self.report = report


class GreedyChecked(Message):
    def __init__(self, check: GreedyCheck) -> None:
        super().__init__()
        self.check = check


class SelfTestScreen(CommandDispatch, Screen[None]):
    KEY_TABLE: ClassVar[tuple[KeySpec, ...]] = TALK_SCREEN_KEYS
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Back to the chat"),
        Binding("space", "stop", "Stop sampling"),
        Binding("r", "restart", "Restart"),
        Binding("t", "switch_mode", "T = 0 / T > 0"),
        Binding("e", "export", "Export SVG + JSON"),
        # The app-wide keys (help first) and the controls this screen's job runs with.
        *bindings(TALK_SCREEN_KEYS, on_screen=True),
    ]
    DEFAULT_CSS = """
    SelfTestScreen { layout: vertical; }
    SelfTestScreen #selftest-title { height: 1; padding: 0 1; background: $primary 30%; text-style: bold; }
    SelfTestScreen #selftest-about { padding: 0 1; color: $text-muted; }
    SelfTestScreen #histograms { height: 1fr; }
    SelfTestScreen .histogram {
        width: 1fr; height: 1fr; padding: 0 1;
        border: round $primary 60%; border-title-style: bold;
    }
    SelfTestScreen #hist-speculative { border: round $success 70%; }
    SelfTestScreen #selftest-figures { height: auto; padding: 0 1; border-top: solid $primary 50%; }
    """

    def __init__(
        self,
        temperature: float | None = None,
        autostart: bool = True,
        *,
        lease: ModelLease | None = None,
        system_prompt: Callable[[], str | None] = lambda: None,
        commands: Commands | None = None,
    ) -> None:
        """``lease`` runs the test on the models (None: a report shown only); ``system_prompt``
        is read at each run, as the chat's may change while this screen is open; ``commands``
        runs the control keys on the chat's controls, which the next run uses."""
        super().__init__()
        self.commands = commands if commands is not None else Commands()
        """The chat's γ, schedule, drafter and temperature commands (none: keys shown, ignored)."""
        self.lease = lease
        self.system_prompt = system_prompt
        self.temperature = temperature
        """The temperature tested (None: the chat's current one)."""
        self.autostart = autostart
        self.report: ExactnessReport | None = None
        self.checks: list[GreedyCheck] = []
        self.running = False
        self.switch_when_stopped = False
        self.error: str | None = None

    def compose(self) -> ComposeResult:
        yield Static(
            "Exactness self-test: speculative decoding against the target alone", id="selftest-title"
        )
        yield Static(id="selftest-about", markup=False)
        with Horizontal(id="histograms"):
            with VerticalScroll(id="hist-speculative", classes="histogram"):
                yield Static(id="hist-speculative-body", markup=False)
            with VerticalScroll(id="hist-target", classes="histogram"):
                yield Static(id="hist-target-body", markup=False)
        yield Static(id="selftest-figures", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        if self.temperature is None and self.controls is not None:
            self.temperature = self.controls.temperature
        self.draw()
        if self.autostart:
            self.action_restart()

    @property
    def controls(self) -> Controls | None:
        return self.lease.controls if self.lease is not None else None

    @property
    def greedy(self) -> bool:
        return not self.temperature

    # ------------------------------------------------------------------ running

    def action_restart(self) -> None:
        lease = self.lease
        controls = self.controls
        backend = lease.local if lease is not None else None
        if self.running:
            self.notify("Still stopping the last run: press R again in a moment.")
            return
        if lease is None or controls is None or backend is None:
            self.notify("The self-test needs the local models, loaded.", severity="warning")
            return
        if not proposes(controls.drafter):
            self.error = "the drafter is none: nothing is drafted, so there is nothing to test (F5 picks one)"
            self.draw()
            return
        tested = replace(controls, temperature=self.temperature or 0.0)
        system = self.system_prompt()
        if self.greedy:
            job = self.greedy_job(backend, replace(tested, max_new_tokens=GREEDY_TOKENS), system)
        else:
            job = self.sampling_job(backend, tested, system)
        if not run_job(self, lease, "the self-test", job, name="self-test"):
            self.notify(lease.busy_reason() or "The models are busy.", severity="warning")
            return
        self.report, self.checks, self.error = None, [], None
        self.running = True
        self.draw()

    def sampling_job(
        self, backend: Any, controls: Controls, system: str | None
    ) -> Callable[[threading.Event], None]:
        """T > 0: sample both ways in the worker thread, reporting twice a second."""

        def report(found: ExactnessReport) -> None:
            self.post_message(SamplesReported(found))

        def job(cancel: threading.Event) -> None:
            sampler = ExactnessSampler(
                backend,
                selftest_messages(SELFTEST_PROMPT, system),
                controls,
                tokens=SCREEN_TOKENS,
                seed=controls.seed or 0,
            )
            sampler.run(SCREEN_SAMPLES, cancel=cancel, report_every=REPORT_EVERY_S, on_report=report)

        return job

    def greedy_job(
        self, backend: Any, controls: Controls, system: str | None
    ) -> Callable[[threading.Event], None]:
        """T = 0: decode a few prompts both ways in the worker thread, one message per prompt."""

        def job(cancel: threading.Event) -> None:
            checks = greedy_equality(backend, controls, system_prompt=system, cancel=cancel)
            for check in checks:
                self.post_message(GreedyChecked(check))

        return job

    def on_samples_reported(self, message: SamplesReported) -> None:
        self.report = message.report
        self.draw()

    def on_greedy_checked(self, message: GreedyChecked) -> None:
        self.checks.append(message.check)
        self.draw()

    def on_job_ended(self, message: JobEnded) -> None:
        self.running = False
        self.error = message.error
        self.draw()
        if self.switch_when_stopped:
            self.switch_when_stopped = False
            self.action_switch_mode()

    def action_stop(self) -> None:
        if self.running:
            self.workers.cancel_group(self, "talk")  # stops after the sample in progress

    def action_switch_mode(self) -> None:
        if self.running:
            self.switch_when_stopped = True  # the worker stops after its sample; then switch
            self.action_stop()
            return
        if self.greedy:
            current = self.controls.temperature if self.controls is not None else 0.0
            self.temperature = current if current > 0 else SAMPLING_TEMPERATURE
        else:
            self.temperature = 0.0
        self.action_restart()

    def action_close(self) -> None:
        self.workers.cancel_group(self, "talk")
        self.dismiss(None)

    def action_export(self) -> None:
        """The screen as SVG and the result as JSON, into the user data folder's selftests/."""
        if self.greedy:
            data: dict[str, Any] = {
                "type": "selftest", "temperature": 0.0, "checks": [c.to_json() for c in self.checks]
            }  # fmt: skip
        elif self.report is not None:
            data = self.report.to_json()
        else:
            self.notify("Nothing to export yet.")
            return
        folder = data_dir() / "selftests"
        stem = "selftest-" + time.strftime("%Y%m%d-%H%M%S")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            json_path = folder / f"{stem}.json"
            json_path.write_text(json_text(data, indent=1) + "\n", encoding="utf-8")
            svg = self.app.save_screenshot(f"{stem}.svg", str(folder))
        except OSError as err:
            self.notify(f"cannot export the self-test: {err.strerror or err} ({folder})", severity="error")
            return
        self.notify(f"{svg}\n{json_path}", title="self-test exported", timeout=12)

    # ------------------------------------------------------------------ drawing

    def draw(self) -> None:
        self.query_one("#selftest-about", Static).update(self.about())
        spec_body = self.query_one("#hist-speculative-body", Static)
        target_body = self.query_one("#hist-target-body", Static)
        figures = self.query_one("#selftest-figures", Static)
        if self.greedy:
            self.query_one("#hist-speculative").border_title = "greedy: speculative against plain"
            self.query_one("#hist-target").border_title = "replies (plain decoding)"
            spec_body.update("\n".join(greedy_line(c) for c in self.checks) or self.waiting())
            target_body.update(
                Text("\n\n".join(f"{c.prompt}\n  → {c.text.strip()[:300]}" for c in self.checks))
            )
            figures.update(self.greedy_figures())
            return
        report = self.report
        self.query_one("#hist-speculative").border_title = "speculative decoding"
        self.query_one("#hist-target").border_title = "target alone"
        if report is None:
            spec_body.update(self.waiting())
            target_body.update("")
            figures.update(self.error or "")
            return
        spec_body.update(histogram(report, "speculative"))
        target_body.update(histogram(report, "target"))
        lines = [settings_line(report), tv_line(report), chi_square_line(report), verdict_line(report)]
        if self.running:
            lines[0] += f" · {report.samples_per_s:.1f} samples/s · Space stops"
        if self.error:
            lines.append(f"stopped: {self.error}")
        figures.update("\n".join(lines))

    def about(self) -> str:
        controls = self.controls
        drafter = f"drafter {controls.drafter}, γ {controls.gamma}" if controls is not None else ""
        if self.greedy:
            return (
                f"T = 0: {len(GREEDY_PROMPTS)} prompts decoded plainly and speculatively ({drafter}); "
                "exactness means identical token for token. T switches to sampling at T > 0."
            )
        return (
            f'T = {self.temperature:g}: the first token of the reply to "{SELFTEST_PROMPT}", sampled again '
            f"and again by speculative decoding ({drafter}) and by the target alone. T switches to T = 0."
        )

    def waiting(self) -> str:
        if self.error:
            return self.error
        return "sampling…" if self.running else "press R to start"

    def greedy_figures(self) -> str:
        if self.error:
            return f"stopped: {self.error}"
        if not self.checks:
            return "decoding…" if self.running else ""
        same = sum(c.identical for c in self.checks)
        verdict = "identical token for token" if same == len(self.checks) else "NOT all identical"
        done = "" if not self.running else f" (of {len(GREEDY_PROMPTS)} so far)"
        return f"{same} of {len(self.checks)} prompts {verdict}{done}"


def histogram(report: ExactnessReport, lane: str) -> Text:
    """One lane's histogram: outcomes in pooled order, bars on one scale for both lanes."""
    rows = report.rows(SHOWN_OUTCOMES)
    counts = report.speculative if lane == "speculative" else report.target
    total = sum(counts.values())
    top = (
        max(
            (
                max(
                    fraction(r.speculative, sum(report.speculative.values())),
                    fraction(r.target, sum(report.target.values())),
                )
                for r in rows
            ),
            default=1.0,
        )
        or 1.0
    )
    text = Text()
    text.append(f"{total} samples\n", style="dim")
    width = min(max((cell_len(show_label(r.label)) for r in rows), default=0), 18)
    for row in rows:
        count = row.speculative if lane == "speculative" else row.target
        share = fraction(count, total)
        text.append(fit(show_label(row.label), width) + " ", style="bold")
        text.append(
            f"{bar(share / top, BAR_WIDTH):<{BAR_WIDTH}}", style="green" if lane == "speculative" else "cyan"
        )
        text.append(f" {share:6.1%} {count:>6}\n")
    hidden = len(set(report.speculative) | set(report.target)) - len(rows)
    if hidden > 0:
        text.append(f"… {hidden} rarer outcomes\n", style="dim")
    return text
