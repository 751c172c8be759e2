"""Where each reply's wait went, per category, from bench JSON files (old and new alike).

    python scripts/lab/where_the_wait_goes.py RUN.json [RUN.json ...]

For every file and category: per method, the mean target prefill, the draft's catch-up
(:func:`specchat.engine.metrics.draft_prefill_ms`, recomputed from the round events, so files
written before the bench reported it are read the same way), decoding and the total wait, α over
the model's drafted positions, and the total wait of our plain over the method's on the same
prompts. Files written before the bench recorded time to first token show "–" there.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from specchat.engine.costs import draft_prefill_ms
from specchat.engine.events import RoundEvent


def rounds_of(record: dict[str, Any]) -> list[RoundEvent]:
    return [RoundEvent.from_json(e) for e in record.get("round_events") or []]


def model_alpha(records: list[dict[str, Any]]) -> str:
    rounds = [e for r in records for e in rounds_of(r) if e.drafter == "model" and e.drafted]
    drafted = sum(e.drafted for e in rounds)
    return f"{sum(e.accepted for e in rounds) / drafted:.2f}" if drafted else "–"


def summarize(path: Path) -> None:
    data = json.loads(path.read_text())
    records = [r for r in data["records"] if r["kind"] in ("plain", "specchat")]
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by[(record["category"], record["method"])].append(record)
        by[("all", record["method"])].append(record)
    print(f"{path.name}")
    print(
        f"  {'category':<15} {'method':<8} {'prefill s':>9} {'draft s':>8} {'TTFT s':>7} {'decode s':>8} "
        f"{'total s':>8} {'α model':>7} {'wait ×':>7}"
    )
    for category in sorted({c for c, _ in by}, key=lambda c: (c == "all", c)):
        plain = by.get((category, "plain"), [])
        plain_total = sum(r["wall_s"] for r in plain)
        for method in sorted({m for c, m in by if c == category}, key=lambda m: m != "plain"):
            group = by[(category, method)]
            prefill = statistics.mean((r["summary"] or {}).get("prefill_ms", 0.0) for r in group) / 1000
            draft = statistics.mean(draft_prefill_ms(rounds_of(r)) or 0.0 for r in group) / 1000
            ttfts = [float(r["ttft_s"]) for r in group if r.get("ttft_s") is not None]
            ttft = f"{statistics.mean(ttfts):7.2f}" if len(ttfts) == len(group) else f"{'–':>7}"
            total = statistics.mean(r["wall_s"] for r in group)
            decode = total - prefill
            # The same prompts as the plain row: a ratio of sums, so long replies weigh more.
            ids = {r["prompt_id"] for r in group}
            same = sum(r["wall_s"] for r in plain if r["prompt_id"] in ids)
            ratio = same / sum(r["wall_s"] for r in group) if plain_total else float("nan")
            print(
                f"  {category:<15} {method:<8} {prefill:9.2f} {draft:8.2f} {ttft} {decode:8.2f} "
                f"{total:8.2f} {model_alpha(group):>7} {ratio:6.2f}×"
            )


if __name__ == "__main__":
    for name in sys.argv[1:]:
        summarize(Path(name))
