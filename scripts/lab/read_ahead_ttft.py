"""What reading ahead saves the first token (issue 43): a long pasted text, then a question.

    python scripts/lab/read_ahead_ttft.py [QUESTIONS.jsonl] [CATEGORY] [PROMPTS] [THREADS]

For each of the first PROMPTS questions of CATEGORY (default rag, 3) in the Spec-Bench file
(default ../shared/data/spec_bench_question.jsonl), with the default pair and settings: the user
pastes the question's text but its last sentence, types the last sentence, and presses Enter.
"cold" sends at once; "read ahead" first lets the engine read what the box held after the paste
(ChatEngine.read_ahead, as the chat does while the last sentence is typed), then sends. Both
start from empty caches, take turns, and decode 32 tokens. Prints the time to first token, the
draft's catch-up in the reply's rounds, the read-ahead's own time, and whether the replies are
the same tokens.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

from specchat.config import Settings
from specchat.engine.backend import Controls
from specchat.engine.costs import draft_prefill_ms
from specchat.engine.events import RoundEvent, TokenEvent
from specchat.engine.session import ChatEngine
from specchat.opening import open_backend

SYSTEM = "You are a helpful assistant."


def questions(path: Path, category: str, count: int) -> list[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [row["turns"][0] for row in rows if row["category"] == category][:count]


def split_last_sentence(text: str) -> tuple[str, str]:
    cut = text.rstrip().rfind(". ", 0, len(text.rstrip()) - 2)
    return (text[: cut + 2], text[cut + 2 :]) if cut > 0 else (text, "")


def reply(engine: ChatEngine, text: str, controls: Controls) -> tuple[float, float, list[int]]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
    start = time.perf_counter()
    first = None
    tokens: list[int] = []
    rounds: list[RoundEvent] = []
    for event in engine.stream_chat(messages, controls):
        if isinstance(event, TokenEvent):
            first = first if first is not None else time.perf_counter() - start
            tokens.append(event.token_id)
        elif isinstance(event, RoundEvent):
            rounds.append(event)
    return first or 0.0, (draft_prefill_ms(rounds) or 0.0) / 1000.0, tokens


def main(argv: list[str]) -> None:
    path = Path(argv[0]) if argv else Path("../shared/data/spec_bench_question.jsonl")
    category = argv[1] if len(argv) > 1 else "rag"
    count = int(argv[2]) if len(argv) > 2 else 3
    torch.set_num_threads(int(argv[3]) if len(argv) > 3 else 2)
    engine = open_backend(Settings(), every_drafter=True).backend
    assert isinstance(engine, ChatEngine)
    controls = Controls(drafter="hybrid", schedule="adaptive", max_new_tokens=32)
    print(f"{category}, {count} prompts, {torch.get_num_threads()} threads")
    rows = []
    for text in questions(path, category, count):
        pasted, typed = split_last_sentence(text)
        for way in ("cold", "read ahead"):
            engine.target.reset()
            if engine.draft is not None:
                engine.draft.reset()
            engine.forget_measurements()
            ahead_s = 0.0
            if way == "read ahead":
                began = time.perf_counter()
                known = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": pasted}]
                engine.read_ahead(known, controls, threading.Event())
                ahead_s = time.perf_counter() - began
            ttft, draft_s, tokens = reply(engine, pasted + typed, controls)
            rows.append(
                (
                    way,
                    len(engine.prompt_ids([{"role": "user", "content": text}])),
                    ttft,
                    draft_s,
                    ahead_s,
                    tokens,
                )
            )
            figures = f"TTFT {ttft:6.2f} s  draft catch-up {draft_s:5.2f} s  read ahead {ahead_s:5.2f} s"
            print(f"  {way:>10}: {figures}")
    cold = [r for r in rows if r[0] == "cold"]
    warm = [r for r in rows if r[0] == "read ahead"]
    same = all(c[5] == w[5] for c, w in zip(cold, warm, strict=True))
    print(
        f"median TTFT cold {statistics.median(r[2] for r in cold):.2f} s, after reading ahead "
        f"{statistics.median(r[2] for r in warm):.2f} s; prompts {[r[1] for r in cold]} tokens; "
        f"same replies: {same}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
