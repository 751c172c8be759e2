"""Print docs/performance.md's tables of a full run from a `specchat bench --json` file.

    python scripts/bench_markdown.py out.json

Every figure in those tables comes from the file this reads, so they can be checked
and regenerated rather than copied by hand.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

CATEGORIES = ("multi-turn", "code", "math", "summarization", "qa", "translation")


LLAMA_TARGETS = (
    ("specchat_plain_vs_llama_plain", "specchat plain"),
    ("defaults_vs_llama_plain", "defaults (hybrid)"),
    ("defaults_vs_llama_plain_min_category", "defaults, worst category"),
)


def label(method: str) -> str:
    if method.startswith("fixed-"):
        return f"fixed γ={method.removeprefix('fixed-')}"
    if method.startswith("hf-assisted-"):
        return f"HF assisted γ={method.removeprefix('hf-assisted-')}"
    return {"ngram": "n-gram"}.get(method, method)


def number(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def overall_table(groups: list[dict[str, Any]], best: str) -> list[str]:
    lines = [
        "| method | total wait vs plain | tok/s | speedup vs plain | α | τ | predicted "
        "| measured/predicted | greedy text = plain |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for g in groups:
        if g["category"] != "all":
            continue
        name = label(g["method"])
        equal = {True: "yes", False: "**no**", None: "–"}[g["greedy_equal"]]
        cells = [
            name,
            number(g.get("wait_ratio"), suffix="×"),  # absent from files written before it
            "refused" if g.get("refused") else number(g["tok_s"]),
            number(g["speedup"], suffix="×"),
            number(g["alpha"]),
            number(g["tau"]),
            number(g["predicted"], suffix="×"),
            number(g["measured_over_predicted"]),
            equal,
        ]
        if g["method"] == best:
            cells[:4] = [f"**{c}**" for c in cells[:4]]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def category_table(groups: list[dict[str, Any]]) -> list[str]:
    by_method: dict[str, dict[str, float | None]] = {}
    for g in groups:
        if g["category"] != "all" and g["method"] != "plain":
            by_method.setdefault(g["method"], {})[g["category"]] = g["speedup"]
    lines = [
        "| method | " + " | ".join(CATEGORIES) + " |",
        "|---|" + "---|" * len(CATEGORIES),
    ]
    for method, speedups in by_method.items():
        cells = [number(speedups.get(c), suffix="×") for c in CATEGORIES]
        lines.append(f"| {label(method)} | " + " | ".join(cells) + " |")
    return lines


def costs_line(costs: dict[str, Any]) -> str:
    probe = costs["probe"]
    v = ", ".join(f"v({k})={float(x):.2f}" for k, x in probe["v"].items())
    return (
        f"Measured costs: plain step {probe['target_ms']:.1f} ms, draft step {probe['draft_ms']:.1f} ms, "
        f"c = {probe['c']:.2f}; {v}."
    )


def main(path: str) -> None:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    meta, summary, groups = data["meta"], data["summary"], data["groups"]
    machine = meta["machine"]
    print(f"Command: `{meta['command']}`")
    print(
        f"Date {meta['date']}; {machine['platform']}, torch {machine['torch']}, "
        f"{machine['threads']} threads; "
        f"load {machine['load_before']['load1']} before, {machine['load_after']['load1']} after; "
        f"{meta['elapsed_s']:.0f} s; CPU path {meta['cpu_path']}."
    )
    print(costs_line(data["costs"]))
    print()
    print("\n".join(overall_table(groups, summary["best"])))
    print()
    print("\n".join(category_table(groups)))
    print()
    llama = summary.get("llama_cpp")
    if llama:
        ratios = ", ".join(f"{name} {number(llama.get(key), suffix='×')}" for key, name in LLAMA_TARGETS)
        print(f"Against llama.cpp plain ({number(llama.get('plain_tok_s'))} tok/s): {ratios}.")
        print()
    print("Targets:", json.dumps(summary["targets"]))
    for line in summary.get("refused") or []:
        print(f"Refused (duration not measured): {line}")
    for flag in (summary.get("guard") or {}).get("flags") or []:
        print(f"Guard: {flag['line']}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
