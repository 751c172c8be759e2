"""Render SVG screenshots of the real specchat app into screenshots/.

    .venv/bin/python scripts/screenshots.py            # writes screenshots/*.svg
    .venv/bin/python scripts/screenshots.py --race R.json --selftest S.json   # measured ones

The app runs headless at a fixed size, driven by the real engine over tiny seeded models,
so every run draws the same pictures. To make the replies readable, the script first
teaches a tiny character-level Llama one short conversation (a few seconds on one CPU
thread, seeded); the draft is a noisy copy of it, so some drafts are accepted and some
corrected, as with a real pair. Timings come from a fixed cost model
(``specchat.testing.scripted_engines.FixedTimings``: 1.5 ms per drafted token plus 12 ms per verify
pass), so the tokens/s figures are illustrative, not measurements. The demo race's arrival
times come from a cost model too (``race_with_fixed_times``), unless ``--race`` names a race
that was measured (``specchat race --json``, or E on the race screen): the app then shows that
measurement; ``--selftest`` does the same for the self-test.

The talk-mode pictures (``talk-*.svg``: step mode, rejected drafts, the token inspector,
replay) come from the real default pair: ``--real`` renders only those, at T = 0.7 with a fixed
seed and the model drafter at fixed γ = 4. It loads the real models, so run it under
``flock /tmp/specchat-heavy.lock`` on a shared machine; its timings are measured on whatever
machine runs it. ``--talk-tiny`` renders the same pictures from the tiny pair instead (no real
models needed).

Nothing touches your config or saved conversations: both go to a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
THEMES = ("specchat-dark", "specchat-light", "specchat-projector", "specchat-colorblind")

SYSTEM = "you are a helpful assistant."
TURNS = (
    (
        "what is speculative decoding?",
        "speculative decoding makes a big model answer faster without changing what it says.\n\n"
        "1. a small draft model guesses the next few tokens.\n"
        "2. the big target model checks every guess in one pass.\n"
        "3. it keeps the guesses it agrees with, and fixes the first one it does not.\n\n"
        "when the draft guesses well, you get several tokens for the price of one.",
    ),
    (
        "is the answer the same as without it?",
        "yes. every token is checked by the target, and a rejected guess is replaced by a token "
        "drawn from what the target wants, so the reply follows the target's own distribution. "
        "only the speed changes.",
    ),
)
DRAFT_NOISE = 0.4
SEED = 0


def train_demo_pair(seed: int = SEED) -> Any:
    """A tiny target that has learned the demo conversation by heart, and a noisy draft."""
    import torch

    from specchat.testing.tiny_models import TinyPair, make_model, make_tokenizer, perturbed_copy

    torch.manual_seed(seed)
    tokenizer = make_tokenizer()
    sequences = [torch.tensor([ids]) for ids in training_sequences(tokenizer)]
    target = make_model(len(tokenizer), seed, hidden_size=96, layers=2, max_positions=1024)
    target.train()
    optimiser = torch.optim.AdamW(target.parameters(), lr=3e-3)
    for _ in range(600):
        loss = sum(target(input_ids=batch, labels=batch).loss for batch in sequences)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        if loss.item() < 0.01:
            break
    target.eval()
    draft = perturbed_copy(target, DRAFT_NOISE, seed + 1)
    return TinyPair(target=target, draft=draft, tokenizer=tokenizer)


def training_sequences(tokenizer: Any) -> list[list[int]]:
    """For each reply: the conversation before it (through the chat template), the reply, </s>."""
    messages = [{"role": "system", "content": SYSTEM}]
    sequences = []
    for question, answer in TURNS:
        messages.append({"role": "user", "content": question})
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        reply = list(tokenizer(answer, add_special_tokens=False)["input_ids"])
        sequences.append(prompt + reply + [tokenizer.eos_token_id])
        messages.append({"role": "assistant", "content": answer})
    return sequences


async def shoot(
    engine: Any,
    path: Path,
    size: tuple[int, int],
    script: Callable[[Any, Any], Awaitable[None]],
    names: tuple[str, str] = ("tiny-target", "tiny-draft"),
    **settings: Any,
) -> None:
    from specchat.config import Settings
    from specchat.ui.app import SpecchatApp

    # Fixed γ shows every token kind at a steady rhythm: the mechanism, for talks and the README.
    values: dict[str, Any] = {
        "temperature": 0.0, "seed": 1, "max_new_tokens": 400, "gamma": 4,
        "schedule": "fixed", "drafter": "model",
    }  # fmt: skip
    values["system_prompt"] = SYSTEM
    values.update(settings)
    app = SpecchatApp(Settings(**values), backend=engine, target_name=names[0], draft_name=names[1])
    async with app.run_test(size=size) as pilot:
        await script(app, pilot)
        app.refresh_panels(force=True)
        await pilot.pause()
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()
        path.write_text(app.export_screenshot(title="specchat"), encoding="utf-8")
        engine.release()
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


async def send_and_wait(app: Any, pilot: Any, text: str) -> None:
    from specchat.ui.widgets.prompt import PromptInput

    prompt = app.query_one(PromptInput)
    prompt.focus()
    prompt.text = text
    await pilot.press("enter")
    await wait(pilot, lambda: app.reply is None and app.conversation.turns[-1].role == "assistant")


def key(binding: str) -> str:
    """The default key of one of the app's bindings (by its id in specchat.ui.settings.keys)."""
    from specchat.ui.settings.keys import KEYS_BY_ID

    return KEYS_BY_ID[binding].key


async def wait(pilot: Any, condition: Callable[[], bool], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("timed out waiting for the app")
        await pilot.pause(0.02)


def demo_race(pair: Any, prompt: str) -> Any:
    """A race on the demo pair, its arrival times from a cost model (the picture repeats)."""
    from specchat.engine.backend import Controls
    from specchat.engine.race import run_race
    from specchat.engine.session import ChatEngine
    from specchat.testing.scripted_engines import race_with_fixed_times

    engine = ChatEngine(pair.target, pair.tokenizer, pair.draft)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
    result = run_race(engine, messages, Controls(gamma=4, drafter="model", max_new_tokens=160, seed=1))
    return race_with_fixed_times(result)


def demo_selftest() -> Any:
    """2000 samples each way at T = 1 (seeded); the elapsed time is fixed.

    On an untrained tiny pair: the demo target knows its one conversation too well, and
    samples nearly one outcome; an untrained one spreads its first tokens over dozens.
    """
    from dataclasses import replace

    from specchat.engine.backend import Controls
    from specchat.engine.selftest import ExactnessSampler, selftest_messages
    from specchat.engine.session import ChatEngine
    from specchat.testing.tiny_models import make_tiny_pair

    pair = make_tiny_pair(SEED)
    engine = ChatEngine(pair.target, pair.tokenizer, pair.draft)
    controls = Controls(gamma=4, drafter="model", temperature=1.0)
    sampler = ExactnessSampler(engine, selftest_messages(), controls, tokens=1, seed=0)
    return replace(sampler.run(2000), elapsed_s=20.0)


async def render_all(
    pair: Any, out: Path, size: tuple[int, int], race_result: Any = None, selftest_report: Any = None
) -> None:
    from specchat.engine.session import ChatEngine
    from specchat.testing.scripted_engines import FixedTimings, PausingEngine

    def engine(pause_after: int | None = None) -> PausingEngine:
        return PausingEngine(FixedTimings(ChatEngine(pair.target, pair.tokenizer, pair.draft)), pause_after)

    (q1, _), (q2, _) = TURNS

    async def mid_reply(app: Any, pilot: Any) -> None:
        eng = app.backend
        await send_and_wait(app, pilot, q1)
        eng.pause_after = 14
        from specchat.ui.widgets.prompt import PromptInput

        prompt = app.query_one(PromptInput)
        prompt.text = q2
        await pilot.press("enter")
        await wait(pilot, eng.paused.is_set)
        await wait(pilot, lambda: app.reply is not None and len(app.reply.rounds) == len(eng.rounds))

    async def finished(app: Any, pilot: Any) -> None:
        await pilot.press(key("rejected"))  # a theme's picture shows every style, rejected drafts too
        await send_and_wait(app, pilot, q1)
        await send_and_wait(app, pilot, q2)

    async def markdown(app: Any, pilot: Any) -> None:
        await send_and_wait(app, pilot, q1)
        await pilot.press(key("view"))
        await pilot.pause()

    async def help_screen(app: Any, pilot: Any) -> None:
        await pilot.press(key("help"))
        await pilot.pause()

    async def saved(app: Any, pilot: Any) -> None:
        # The conversations the shots above saved: one per length, with fixed dates.
        keep: dict[int, Any] = {}
        for info in app.store.saved():
            if info.turns % 2 == 0 and info.turns not in keep:
                keep[info.turns] = info
            else:
                info.path.unlink()
        for day, info in enumerate(sorted(keep.values(), key=lambda i: i.turns), start=1):
            data = json.loads(info.path.read_text(encoding="utf-8"))
            data["created"] = data["updated"] = f"2025-06-0{day}T09:30:00+00:00"
            info.path.write_text(json.dumps(data), encoding="utf-8")
        await pilot.press(key("open"))
        await pilot.pause()

    async def theory(app: Any, pilot: Any) -> None:
        from specchat.ui.talk.theory import TheoryPanel

        await send_and_wait(app, pilot, q1)
        await pilot.press(key("theory"))
        await wait(pilot, lambda: app.theory_tracker.plain_rate is not None and app.talk_task is None)
        app.main_screen.query_one(TheoryPanel).update_figures(force=True)

    async def race(app: Any, pilot: Any) -> None:
        from specchat.ui.talk.race import RaceScreen

        result = race_result or demo_race(pair, q1)
        await app.push_screen(RaceScreen(result.prompt, result=result, palette=app.palette))

    async def selftest(app: Any, pilot: Any) -> None:
        from specchat.ui.talk.selftest import SelfTestScreen

        screen = SelfTestScreen(temperature=1.0, autostart=False, lease=app.lease)
        await app.push_screen(screen)
        screen.report = selftest_report or demo_selftest()
        screen.draw()

    await shoot(engine(), out / "talk-theory.svg", size, theory)
    await shoot(engine(), out / "talk-race.svg", size, race)
    await shoot(engine(), out / "talk-selftest.svg", size, selftest)
    await shoot(engine(), out / "chat-mid-reply.svg", size, mid_reply)
    for theme in THEMES:
        await shoot(
            engine(), out / f"theme-{theme.removeprefix('specchat-')}.svg", size, finished, theme=theme
        )
    await shoot(engine(), out / "markdown-view.svg", size, markdown)
    await shoot(engine(), out / "help.svg", size, help_screen)
    await shoot(engine(), out / "conversations.svg", size, saved)


PRIME = "Write a Python function that checks whether a number is prime."
TALK_QUESTION = {"tiny": TURNS[0][0], "real": PRIME}
NAMES = {"tiny": ("tiny-target", "tiny-draft"), "real": ("qwen-coder-1.5b", "qwen-coder-0.5b")}
TALK_SETTINGS = {"tiny": {"temperature": 1.0, "seed": 2}, "real": {"temperature": 0.7, "seed": 7}}


async def shoot_talk(
    engine: Callable[..., Any], out: Path, size: tuple[int, int], pair: str = "tiny"
) -> None:
    """The pictures of docs/talk-mode.md's "One round, up close": one round, seen four ways."""
    question = TALK_QUESTION[pair]
    talk = {**TALK_SETTINGS[pair], "max_new_tokens": 160}

    async def step_mode(app: Any, pilot: Any) -> None:
        # Step to the first round (after the third) whose drafts were not all accepted.
        await pilot.press(key("rejected"))  # a talk shows the rejected drafts (off for chatting)
        await pilot.press(key("step_mode"))
        await send_only(app, pilot, question)
        for rounds in range(1, 30):

            def paused_after(n: int = rounds) -> bool:
                return bool(app.live.step.paused and len(app.reply.rounds) == n)

            await wait(pilot, paused_after)
            if rounds >= 3 and app.reply.rounds[-1].rejected:
                break
            await pilot.press(key("step"))
        app.clear_notifications()

    async def inspector(app: Any, pilot: Any) -> None:
        await pilot.press(key("rejected"))
        await send_and_wait(app, pilot, question)
        tokens = app.conversation.turns[-1].tokens
        index = next((i for i, t in enumerate(tokens) if t.kind == "correction" and t.text and i > 8), None)
        app.main_screen.inspector.inspect_token(0, index if index is not None else len(tokens) - 1)
        await pilot.pause()

    async def replay(app: Any, pilot: Any) -> None:
        from specchat.ui.talk.replay import ReplayScreen

        await pilot.press(key("rejected"))
        await send_and_wait(app, pilot, question)
        await pilot.press(key("open"))
        await pilot.pause()
        await pilot.press("r")
        await wait(pilot, lambda: isinstance(app.screen, ReplayScreen))
        await pilot.press("space")
        screen = app.screen
        for _ in range(30):  # to the first round from the fifth on with a rejected draft
            await pilot.press("n")
            await pilot.pause()
            step = screen.live.step
            if step.round is not None and step.round.round >= 4 and step.round.rejected:
                break

    names = NAMES[pair]
    await shoot(engine(), out / "talk-step.svg", size, step_mode, names, **talk)
    await shoot(engine(), out / "talk-inspector.svg", size, inspector, names, **talk)
    await shoot(engine(), out / "talk-replay.svg", size, replay, names, **talk)


async def send_only(app: Any, pilot: Any, text: str) -> None:
    from specchat.ui.widgets.prompt import PromptInput

    prompt = app.query_one(PromptInput)
    prompt.focus()
    prompt.text = text
    await pilot.press("enter")


async def render_tiny_talk(pair: Any, out: Path, size: tuple[int, int]) -> None:
    from specchat.engine.session import ChatEngine
    from specchat.testing.scripted_engines import FixedTimings, PausingEngine

    chat = ChatEngine(pair.target, pair.tokenizer, pair.draft)
    await shoot_talk(lambda: PausingEngine(FixedTimings(chat)), out, size)


async def render_real_talk(out: Path, size: tuple[int, int]) -> None:
    """The talk pictures from the real default pair (measured timings, not the cost model)."""
    from specchat.config import Settings
    from specchat.engine.session import ChatEngine
    from specchat.models import load_for_decoding
    from specchat.testing.scripted_engines import PausingEngine

    settings = Settings()
    loaded = load_for_decoding(settings.target, settings.draft, cpu_path=settings.cpu_path)
    chat = ChatEngine(loaded.target, loaded.tokenizer, loaded.draft)
    await shoot_talk(lambda: PausingEngine(chat), out, size, pair="real")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "screenshots")
    parser.add_argument("--size", default="120x36", help="terminal columns x rows (default 120x36)")
    parser.add_argument(
        "--race", type=Path, help="a race saved by `specchat race --json` to show instead of the demo race"
    )
    parser.add_argument(
        "--selftest", type=Path, help="a self-test saved by `specchat selftest --json` (or E on its screen)"
    )
    parser.add_argument("--real", action="store_true", help="talk pictures only, from the real default pair")
    parser.add_argument("--talk-tiny", action="store_true", help="talk pictures only, from the tiny pair")
    args = parser.parse_args()
    columns, rows = (int(n) for n in args.size.lower().split("x"))
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ["TZ"] = "UTC"  # the conversation list shows local times
    time.tzset()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SPECCHAT_DATA_DIR"] = str(Path(tmp) / "data")
        os.environ["SPECCHAT_CONFIG"] = str(Path(tmp) / "config.toml")
        if args.real:
            asyncio.run(render_real_talk(args.out, (columns, rows)))
            return 0
        import torch

        torch.set_num_threads(1)  # deterministic, and quick for models this small
        pair = train_demo_pair()
        race = None
        if args.race is not None:
            from specchat.engine.race import RaceResult

            race = RaceResult.from_json(json.loads(args.race.read_text(encoding="utf-8")))
        report = None
        if args.selftest is not None:
            from specchat.engine.selftest import report_from_json

            report = report_from_json(json.loads(args.selftest.read_text(encoding="utf-8")))
        if args.talk_tiny:
            asyncio.run(render_tiny_talk(pair, args.out, (columns, rows)))
        else:
            asyncio.run(render_all(pair, args.out, (columns, rows), race, report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
