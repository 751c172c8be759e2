"""How often is the target's greedy token the draft's first, second or third choice?

    python scripts/lab/draft_choices.py [PER_CATEGORY] [TOKENS]

For each bench prompt (PER_CATEGORY per category, default 2) the target decodes TOKENS tokens
plainly (default 96); the draft then reads the prompt and that reply in one pass (teacher
forcing) and its top three ids at every position are compared with the target's token. Printed
per category: the draft's first choice right, its second right when the first is wrong (what a
sibling leaf of a token tree would catch), the share of positions where the draft's top
probability is under 0.5 and how its choices fare there, and the share of the target's tokens
past the draft's narrow head (which a narrow head can never propose). Default pair, default CPU
path, 2 threads.
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict

import torch

from specchat.bench.prompts import load_prompts
from specchat.engine.backend import Controls
from specchat.engine.events import TokenEvent
from specchat.engine.kv import CachedLM
from specchat.engine.session import ChatEngine
from specchat.models.loading.loader import load_for_decoding


def count_choices(per_category: int, tokens: int) -> dict[str, Counter[str]]:
    pair = load_for_decoding("qwen-coder-1.5b", "qwen-coder-0.5b", cpu_path="auto")
    assert pair.draft is not None
    engine = ChatEngine(pair.target, pair.tokenizer, pair.draft)
    draft = CachedLM(pair.draft)
    narrow = getattr(pair.draft, "narrow_head", None) or draft.vocab_width
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for prompt in load_prompts(per_category=per_category):
        ids = engine.prompt_ids(prompt.messages)
        controls = Controls(gamma=1, max_new_tokens=tokens)
        reply = [e.token_id for e in engine.stream_plain(ids, controls) if isinstance(e, TokenEvent)]
        logits = draft.logits_after(ids + reply[:-1], len(reply), head_rows=draft.vocab_width)
        top = torch.softmax(logits.float(), -1).topk(3, -1)
        tally = counts[prompt.category]
        for i, token in enumerate(reply):
            choices = top.indices[i].tolist()
            unsure = top.values[i, 0].item() < 0.5
            tally["positions"] += 1
            tally["unsure"] += unsure
            tally["past narrow head"] += token >= narrow
            rank = choices.index(token) + 1 if token in choices else 0
            if rank:
                tally[f"choice {rank}"] += 1
                tally[f"unsure, choice {rank}"] += unsure and rank <= 2
    return counts


def report(category: str, c: Counter[str]) -> str:
    n, missed = c["positions"], c["positions"] - c["choice 1"]
    unsure = max(c["unsure"], 1)
    return (
        f"{category:14} first {c['choice 1'] / n:.2f}  second when first wrong "
        f"{c['choice 2'] / max(missed, 1):.2f}  third {c['choice 3'] / max(missed, 1):.2f}  "
        f"unsure {c['unsure'] / n:.2f} (first {c['unsure, choice 1'] / unsure:.2f}, "
        f"second {c['unsure, choice 2'] / unsure:.2f})  past narrow head {c['past narrow head'] / n:.2f}"
    )


def main() -> None:
    torch.set_num_threads(2)
    per_category = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 96
    counts = count_choices(per_category, tokens)
    total: Counter[str] = Counter()
    for category, tally in counts.items():
        total.update(tally)
        print(report(category, tally))
    print(report("all", total))


if __name__ == "__main__":
    main()
