"""Trace the adaptive γ schedule through a real `specchat bench` run, round by round.

    SPECCHAT_TRACE=trace.jsonl python scripts/trace_schedule.py [bench options…] --json run.json
    python scripts/trace_schedule.py --show trace.jsonl
    python scripts/trace_schedule.py --where run.json

The first form runs ``specchat bench`` with the given options in this process, with every
adaptive schedule wrapped so that each decision and each observed round is written to
SPECCHAT_TRACE as one JSON line: the round's γ, source, drafted, accepted, draft_ms and
verify_ms, and the schedule's estimates when it chose γ (α, the sure α, α's 95 % bounds,
evidence, c, v(γ), the predicted speed-ups, plain streak, how far the draft is behind, the
tokens left and the schedule's note). The second prints a trace as a table, one
round a line, grouped by the reply (method and prompt) it belonged to. The third splits each
run of a bench JSON file into what the schedule sees and what it does not: the decoding time the
bench counts, the part before the first round (a draft model's prompt prefill, when it reads the
prompt up front), the rounds' drafting and verifying, and the time between rounds.

Nothing in the schedule changes: the wrapper only reads it. Used for docs/lab/2026-12-04-schedule.md.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def _install(trace_path: Path) -> None:
    from specchat.bench import runner
    from specchat.engine import gamma as gamma_module
    from specchat.engine.events import RoundEvent

    out = trace_path.open("w", encoding="utf-8")
    current: dict[str, str] = {"method": "", "prompt": ""}
    original_next, original_observe = (
        gamma_module.AdaptiveGamma.next_gamma,
        gamma_module.AdaptiveGamma.observe,
    )

    def next_gamma(self: Any, source: str = "model", outlook: Any = gamma_module.NO_OUTLOOK) -> int:
        chosen = original_next(self, source, outlook)
        estimates = self.estimates()
        model = self.costs.model(self.drafter)
        out.write(json.dumps({
            "kind": "decision", **current, "source": source, "gamma": chosen,
            "alpha": round(self.alpha, 4), "sure_alpha": round(self.sure_alpha, 4),
            "alpha_bounds": [round(b, 4) for b in self.alpha_bounds],
            "evidence": round(self.evidence, 2), "plain_ms": estimates.plain_ms,
            "c": None if model is None else round(model.c, 4),
            "v": {} if model is None else {g: round(model.v(g), 3) for g in range(1, 7)},
            "speedup": {g: round(s, 3) for g, s in estimates.speedup.items()},
            "plain_streak": self._plain_streak, "behind": outlook.behind, "remaining": outlook.remaining,
            "note": self.note,
        }) + "\n")  # fmt: skip
        return chosen

    def observe(self: Any, event: RoundEvent) -> None:
        original_observe(self, event)
        data = {k: v for k, v in event.to_json().items() if k != "drafts"}
        out.write(json.dumps({"kind": "round", **current, **data}) + "\n")
        out.flush()

    gamma_module.AdaptiveGamma.next_gamma = next_gamma  # type: ignore[method-assign]
    gamma_module.AdaptiveGamma.observe = observe  # type: ignore[method-assign]
    original_run = runner.run_method

    def run_method(engine: Any, prompt: Any, prompt_ids: Any, method: Any, *args: Any, **kwargs: Any) -> Any:
        current.update(method=method.name, prompt=prompt.id)
        return original_run(engine, prompt, prompt_ids, method, *args, **kwargs)

    runner.run_method = run_method  # type: ignore[assignment]


def show(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    reply = None
    pending: dict[str, Any] | None = None
    for row in rows:
        if (row["method"], row["prompt"]) != reply:
            reply = (row["method"], row["prompt"])
            print(f"\n== {row['method']} on {row['prompt']}")
            print(
                " rnd src   γ dr ac  draft_ms verify_ms |  α    α_sure  evid   c  "
                "   v1    v2    v3    v4   best-pred"
            )
        if row["kind"] == "decision":
            pending = row
            continue
        d = pending or {}
        pred = d.get("speedup") or {}
        best = max(pred, key=lambda g: pred[g]) if pred else "-"
        best_text = f"γ{best} {pred[best]:.2f}" if pred else "-"
        v = d.get("v") or {}
        vs = " ".join(f"{v.get(str(g), float('nan')):5.2f}" for g in range(1, 5))
        c = d.get("c")
        print(
            f" {row['round']:3d} {d.get('source', '?')[:5]:5s} {row['gamma']:2d} {row['drafted']:2d} "
            f"{row['accepted']:2d} {row['draft_ms']:8.1f} {row['verify_ms']:8.1f} | "
            f"{d.get('alpha', 0):.3f} {d.get('sure_alpha', 0):.3f} {d.get('evidence', 0):5.1f} "
            f"{c if c is not None else float('nan'):5.3f} {vs}  {best_text}"
        )
        pending = None


def where(path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    meta = data["meta"]
    print(meta["command"], meta["machine"]["load_before"], meta["cpu_path"])
    print(
        f"{'method':12} {'prompt':14} tok rounds decode_s before-loop  Σdraft Σverify between"
        f"  rounds-only×  bench×"
    )
    plain: dict[str, tuple[float, float]] = {}
    rows = [r for r in data["records"] if r["summary"]]
    for record in sorted(rows, key=lambda r: r["kind"] != "plain"):
        summary, rounds = record["summary"], record["round_events"]
        drafting = sum(e["draft_ms"] for e in rounds) / 1000
        verifying = sum(e["verify_ms"] for e in rounds) / 1000
        before = record["decode_wall_s"] - summary["decode_s"]
        between = summary["decode_s"] - drafting - verifying
        rate, loop_rate = record["tok_s"], record["tokens"] / summary["decode_s"]
        if record["kind"] == "plain":
            plain[record["prompt_id"]] = (rate, loop_rate)
        base, loop_base = plain.get(record["prompt_id"], (rate, loop_rate))
        print(
            f"{record['method']:12} {record['prompt_id']:14} {record['tokens']:3d} {len(rounds):6d} "
            f"{record['decode_wall_s']:8.2f} {before:6.2f} ({before / record['decode_wall_s']:4.0%}) "
            f"{drafting:7.2f} {verifying:7.2f} {between:7.2f}  {loop_rate / loop_base:10.2f}  "
            f"{rate / base:6.2f}"
        )


def main(argv: list[str]) -> None:
    if argv[:1] == ["--show"]:
        show(Path(argv[1]))
        return
    if argv[:1] == ["--where"]:
        where(Path(argv[1]))
        return
    trace = os.environ.get("SPECCHAT_TRACE")
    if not trace:
        sys.exit("set SPECCHAT_TRACE to the JSON lines file to write")
    _install(Path(trace))
    from specchat.cli import main as cli_main

    sys.argv = ["specchat", "bench", *argv]
    cli_main()


if __name__ == "__main__":
    main(sys.argv[1:])
