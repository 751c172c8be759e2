"""How good the draft's guesses stay when it reads only the last N tokens (issue 43's window).

    python scripts/lab/window_alpha.py [QUESTIONS.jsonl] [CATEGORIES] [PROMPTS] [WINDOWS] [THREADS]

For PROMPTS questions (default 4) of each category (default rag,summarization) of the Spec-Bench
file, with the default pair: the target's plain greedy reply (128 tokens), then, for each window
N in WINDOWS (default 32,64,128,256,512,0; 0: the whole prompt), one pass of the draft over the
last N prompt tokens and the reply. α here is greedy acceptance per position: the share of the
reply's tokens the draft's argmax predicts after the true text so far (what verification at
T = 0 tests at each drafted position). Prints α and the draft's read time per N.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from specchat.config import Settings
from specchat.engine.backend import Controls
from specchat.engine.events import TokenEvent
from specchat.engine.session import ChatEngine
from specchat.opening import open_backend

SYSTEM = "You are a helpful assistant."


def main(argv: list[str]) -> None:
    path = Path(argv[0]) if argv else Path("../shared/data/spec_bench_question.jsonl")
    categories = (argv[1] if len(argv) > 1 else "rag,summarization").split(",")
    count = int(argv[2]) if len(argv) > 2 else 4
    windows = [int(n) for n in (argv[3] if len(argv) > 3 else "32,64,128,256,512,0").split(",")]
    torch.set_num_threads(int(argv[4]) if len(argv) > 4 else 2)
    engine = open_backend(Settings(), every_drafter=True).backend
    assert isinstance(engine, ChatEngine) and engine.draft is not None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    alphas: dict[int, list[float]] = {n: [] for n in windows}
    reads: dict[int, list[float]] = {n: [] for n in windows}
    lengths = []
    for category in categories:
        for row in [r for r in rows if r["category"] == category][:count]:
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": row["turns"][0]}]
            prompt = engine.prompt_ids(messages)
            plain = engine.stream_plain(prompt, Controls(drafter="none", max_new_tokens=128))
            reply = [e.token_id for e in plain if isinstance(e, TokenEvent)]
            lengths.append(len(prompt))
            for n in windows:
                seen = prompt[-n:] if n else prompt
                engine.draft.reset()
                start = time.perf_counter()
                engine.draft.prefill(seen + reply[:1])  # the read the window costs
                reads[n].append(time.perf_counter() - start)
                logits = engine.draft.logits_after(seen + reply, len(reply) + 1)[:-1]
                hits = (logits.argmax(-1) == torch.tensor(reply)).float().mean().item()
                alphas[n].append(hits)
    print(f"{categories}, {len(lengths)} prompts of {min(lengths)}–{max(lengths)} tokens, 128-token replies")
    for n in windows:
        name = "whole" if n == 0 else str(n)
        print(
            f"  N = {name:>5}: α {statistics.mean(alphas[n]):.3f} (per prompt "
            f"{min(alphas[n]):.2f}–{max(alphas[n]):.2f}), read {statistics.mean(reads[n]) * 1000:6.0f} ms"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
