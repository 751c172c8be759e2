"""Tokens/s of the same reply decoded headlessly (as `specchat generate` does) and inside the TUI.

Loads the pair once, then alternates the two paths so that machine load hits both alike. The
TUI runs headless (Textual's test driver) but renders every frame as it would on a terminal.

    python scripts/tui_vs_generate.py [--target qwen-coder-1.5b] [--draft qwen-coder-0.5b]
        [--prompt "..."] [--max-new-tokens 96] [--repeats 2]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

import click
import torch

from specchat.config import Settings
from specchat.engine.events import Event, SummaryEvent
from specchat.engine.session import ChatEngine, Controls
from specchat.models import load_pair

PROMPT = "Write a Python function that checks whether a number is prime."


class Recording:
    """Passes the engine's events through to the app and keeps the summary."""

    def __init__(self, engine: ChatEngine) -> None:
        self.engine = engine
        self.summary: SummaryEvent | None = None

    @property
    def available_drafters(self) -> list[str]:
        return self.engine.available_drafters

    def stream_chat(
        self, messages: Sequence[dict[str, str]], controls: Any, cancel: Any = None
    ) -> Iterator[Event]:
        for event in self.engine.stream_chat(messages, controls, cancel):
            if isinstance(event, SummaryEvent):
                self.summary = event
            yield event


def headless(engine: ChatEngine, settings: Settings) -> float:
    controls = Controls(gamma=settings.gamma, max_new_tokens=settings.max_new_tokens, temperature=0.0)
    messages = [{"role": "system", "content": settings.system_prompt}, {"role": "user", "content": PROMPT}]
    summary = [e for e in engine.stream_chat(messages, controls) if isinstance(e, SummaryEvent)][-1]
    return summary.tokens_per_s


async def in_tui(engine: ChatEngine, settings: Settings) -> float:
    from specchat.ui.app import SpecchatApp
    from specchat.ui.widgets.prompt import PromptInput

    recording = Recording(engine)
    app = SpecchatApp(settings, engine=recording, target_name="target", draft_name="draft")
    async with app.run_test(size=(140, 42)) as pilot:
        prompt = app.query_one(PromptInput)
        prompt.focus()
        prompt.text = PROMPT
        await pilot.press("enter")
        while recording.summary is None or app.reply is not None:
            await pilot.pause(0.1)
    assert recording.summary is not None
    return recording.summary.tokens_per_s


@click.command()
@click.option("--target", default="qwen-coder-1.5b")
@click.option("--draft", default="qwen-coder-0.5b")
@click.option("--max-new-tokens", default=96)
@click.option("--gamma", default=4)
@click.option("--repeats", default=2)
def main(target: str, draft: str, max_new_tokens: int, gamma: int, repeats: int) -> None:
    os.environ.setdefault("SPECCHAT_DATA_DIR", tempfile.mkdtemp(prefix="specchat-measure-"))
    torch.set_num_threads(os.cpu_count() or 1)
    target_lm, draft_lm = load_pair(target, draft)
    engine = ChatEngine(target_lm.model, target_lm.tokenizer, draft_lm.model if draft_lm else None)
    settings = Settings(
        target=target, draft=draft, gamma=gamma, max_new_tokens=max_new_tokens, temperature=0.0
    )
    cli_rates: list[float] = []
    tui_rates: list[float] = []
    for _ in range(repeats):
        started = time.perf_counter()
        cli_rates.append(headless(engine, settings))
        tui_rates.append(asyncio.run(in_tui(engine, settings)))
        click.echo(
            f"headless {cli_rates[-1]:.3f} tok/s · TUI {tui_rates[-1]:.3f} tok/s "
            f"({time.perf_counter() - started:.0f} s for both)"
        )
    cli, tui = statistics.median(cli_rates), statistics.median(tui_rates)
    click.echo(f"median: headless {cli:.3f} tok/s, TUI {tui:.3f} tok/s, TUI/headless = {tui / cli:.3f}")


if __name__ == "__main__":
    main()
