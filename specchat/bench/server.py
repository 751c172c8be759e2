"""``specchat bench --server``: what can honestly be measured against a server.

A server's speedup needs a plain baseline from the same server and model. specchat cannot
load the server's model, so it compares the server with itself: each prompt once as the server
decodes it (speculatively), once with drafting off, where the server takes that per request
(``speculative.n_max = 0`` on llama-server builds that honour it: checked, never assumed, by
looking at the reply's draft counters) or on a second server given with ``--baseline-server``
(the same model started without a draft). At temperature 0 both texts should be equal. Without
a baseline the table says so and shows the speculative side alone: tokens/s, α and τ as the
server lets specchat measure or infer them. Prompts run one at a time; figures from a server
that serves others meanwhile mean little.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specchat.bench.prompts import BenchPrompt
from specchat.engine.backend import Controls
from specchat.engine.events import RoundEvent, SummaryEvent, TokenEvent
from specchat.remote.reply_stream import unattended
from specchat.remote.server_backend import RemoteBackend
from specchat.untrusted import json_text


@dataclass
class ServerRun:
    prompt_id: str
    category: str
    side: str
    """"speculative" or "plain"."""
    tokens: int
    tokens_per_s: float
    alpha: float | None
    tau: float | None
    drafted: int
    text: str
    stop: str


def one_reply(backend: RemoteBackend, prompt: BenchPrompt, controls: Controls, side: str) -> ServerRun:
    text: list[str] = []
    drafted = 0
    summary: SummaryEvent | None = None
    cancel = threading.Event()
    for event in unattended(backend.stream_chat(list(prompt.messages), controls, cancel), cancel):
        if isinstance(event, TokenEvent):
            text.append(event.text)
        elif isinstance(event, RoundEvent):
            drafted += event.drafted
        elif isinstance(event, SummaryEvent):
            summary = event
    assert summary is not None
    return ServerRun(
        prompt.id, prompt.category, side, summary.tokens, summary.tokens_per_s, summary.alpha,
        summary.tau, drafted, "".join(text), summary.stop,
    )  # fmt: skip


def run_server_bench(
    backend: RemoteBackend,
    prompts: Sequence[BenchPrompt],
    controls: Controls,
    *,
    baseline: RemoteBackend | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> tuple[list[ServerRun], str | None]:
    """Every prompt on the server, and on the plain baseline when there is one.

    Returns the runs and, when no plain baseline exists, the reason (one line for the user).
    """
    plain_controls = Controls(**{**asdict(controls), "drafter": "none"})
    runs: list[ServerRun] = []
    plain_on: RemoteBackend | None = baseline
    why_not: str | None = None
    if baseline is None and backend.info.kind != "llama-server":
        why_not = (
            f"a {backend.info.kind} server cannot turn drafting off per request: pass --baseline-server "
            "URL (the same model started without speculative decoding) for a plain baseline."
        )
    for index, prompt in enumerate(prompts):
        progress(f"{prompt.id}: speculative")
        runs.append(one_reply(backend, prompt, controls, "speculative"))
        if baseline is None and backend.info.kind == "llama-server" and index == 0 and why_not is None:
            progress(f"{prompt.id}: drafting off (speculative.n_max = 0)")
            probe = one_reply(backend, prompt, plain_controls, "plain")
            if probe.drafted:
                why_not = (
                    "this llama-server drafted although asked not to (speculative.n_max = 0): it takes no "
                    "per-request speculation settings. Pass --baseline-server URL (the same model without "
                    "--model-draft) for a plain baseline."
                )
            else:
                plain_on = backend
                runs.append(probe)
            continue
        if plain_on is not None:
            progress(f"{prompt.id}: plain")
            runs.append(one_reply(plain_on, prompt, plain_controls, "plain"))
    return runs, why_not


def server_table(runs: Sequence[ServerRun], why_not: str | None, temperature: float) -> list[str]:
    """Plain-text rows: one per prompt, then the totals."""
    spec = {r.prompt_id: r for r in runs if r.side == "speculative"}
    plain = {r.prompt_id: r for r in runs if r.side == "plain"}
    header = f"{'prompt':<18} {'tokens':>6} {'tok/s':>7} {'α':>5} {'τ':>5} "
    lines = [header + f"{'plain tok/s':>11} {'speedup':>8} same text"]
    for pid, s in spec.items():
        p = plain.get(pid)
        same = "–" if p is None or temperature > 0 else ("yes" if p.text == s.text else "no")
        lines.append(
            f"{pid:<18} {s.tokens:>6} {s.tokens_per_s:>7.2f} {_f(s.alpha):>5} {_f(s.tau):>5} "
            f"{(f'{p.tokens_per_s:.2f}' if p else '–'):>11} "
            f"{(f'{s.tokens_per_s / p.tokens_per_s:.2f}×' if p and p.tokens_per_s else '–'):>8} {same}"
        )
    total_spec = _rate(spec.values())
    total_plain = _rate(plain.values())
    summary = f"overall: {total_spec:.2f} tok/s speculative"
    if plain:
        summary += f", {total_plain:.2f} tok/s plain ({total_spec / total_plain:.2f}×)" if total_plain else ""
    lines.append(summary)
    if why_not:
        lines.append(f"no plain baseline: {why_not}")
    return lines


def write_json(path: Path, runs: Sequence[ServerRun], meta: dict[str, Any]) -> None:
    data = {"meta": meta, "runs": [asdict(r) for r in runs]}
    path.write_text(json_text(data, indent=1) + "\n", encoding="utf-8")


def _rate(runs: Any) -> float:
    """Tokens over time across replies (each reply's time is tokens / its rate)."""
    runs = [r for r in runs if r.tokens_per_s > 0]
    seconds = sum(r.tokens / r.tokens_per_s for r in runs)
    return sum(r.tokens for r in runs) / seconds if seconds else 0.0


def _f(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def bench_server(
    server: str,
    baseline_server: str | None,
    prompts: Sequence[BenchPrompt],
    controls: Controls,
    *,
    timeout: float,
    verify: bool,
    json_path: Path | None,
    echo: Callable[[str], None],
) -> None:
    """The whole ``bench --server`` command: connect, run, print the table, write the JSON."""
    from specchat.remote.server_backend import connect

    backend = connect(server, timeout=timeout, verify=verify)
    baseline = connect(baseline_server, timeout=timeout, verify=verify) if baseline_server else None
    echo(f"server: {backend.label}" + (f"; plain baseline: {baseline.label}" if baseline else ""))
    for note in backend.notes:
        echo(f"note: {note}")
    started = now()
    try:
        runs, why_not = run_server_bench(
            backend, prompts, controls, baseline=baseline, progress=lambda line: echo(f"  {line}")
        )
    finally:
        backend.close()
        if baseline is not None:
            baseline.close()
    for line in server_table(runs, why_not, controls.temperature):
        echo(line)
    echo(backend.capabilities.describe())
    if json_path is not None:
        meta = {
            "date": started,
            "server": backend.label,
            "baseline": baseline.label if baseline else None,
            "figures": backend.capabilities.describe(),
            "no_baseline": why_not,
            "settings": asdict(controls),
        }
        write_json(json_path, runs, meta)
        echo(f"wrote {json_path}")
