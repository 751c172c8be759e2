"""`specchat bench`: the click command (main.add_command(bench) registers it)."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from specchat.bench import BenchError
from specchat.errors import SpecchatError

QUICK_GAMMAS = "1,2,3,4"
FULL_GAMMAS = "1,2,3,4,5,6,8"


def _ints(text: str, what: str) -> list[int]:
    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError as err:
        raise BenchError(f"{what} must be a comma-separated list of whole numbers (got {text!r}).") from err
    if any(v < 1 or v > 16 for v in values):
        raise BenchError(f"{what} must be between 1 and 16 (got {text!r}).")
    return values


def _own_args() -> list[str]:
    """The options this command was given (whatever launched it)."""
    args = sys.argv[1:]
    return args[args.index("bench") + 1 :] if "bench" in args else args


def machine_load() -> dict[str, Any]:
    """1-minute load average and core count: benchmark figures mean little on a busy machine."""
    try:
        load1, load5, _ = os.getloadavg()
    except OSError:  # pragma: no cover - not on every platform
        load1 = load5 = float("nan")
    return {"load1": round(load1, 2), "load5": round(load5, 2), "cpus": os.cpu_count()}


@click.command("bench")
@click.option("--target", default=None, help="Target model (default: your settings, qwen-coder-1.5b).")
@click.option("--draft", default=None, help="Draft model, or 'none' (default: your settings).")
@click.option("--quick", is_flag=True, help="One prompt per category, a short γ sweep, 64 new tokens.")
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Write records + summary."
)
@click.option(
    "--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), help="Write a PNG plot."
)
@click.option("--gammas", default=None, help=f"Fixed γ sweep (default {FULL_GAMMAS}; quick {QUICK_GAMMAS}).")
@click.option("--hf-gammas", default=None, help="γ values for HF assisted (default: the sweep; quick: 2,3).")
@click.option("--no-hf", is_flag=True, help="Skip the Hugging Face peer.")
@click.option(
    "--hf-extra", is_flag=True, help="Also run HF plain generate and HF assisted with its defaults."
)
@click.option("--max-new-tokens", type=int, default=None, help="Tokens per reply (default 128; quick 64).")
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--top-k", type=int, default=None)
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--categories", default=None, help="Comma-separated subset, e.g. code,math.")
@click.option("--per-category", type=int, default=None, help="At most this many prompts per category.")
@click.option("--start-gamma", type=int, default=4, show_default=True, help="First γ of heuristic/adaptive.")
@click.option("--ngram-gamma", type=int, default=4, show_default=True, help="γ of the n-gram drafter.")
@click.option("--device", default="auto", show_default=True)
@click.option("--dtype", default="auto", show_default=True)
@click.option("--quant", default=None, help="bitsandbytes quantization of the target: 4bit or 8bit.")
@click.option(
    "--cpu-path",
    default="auto",
    show_default=True,
    help="CPU kernels for the linear layers (see specchat.models.cpu_quant): auto, none, or a mode name.",
)
@click.option("--no-lean", is_flag=True, help="Decode with the stock Hugging Face forward, not the lean one.")
@click.option("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice).")
@click.option(
    "--repeats",
    type=click.IntRange(1, 10),
    default=1,
    show_default=True,
    help="Run everything this many times; figures use the fastest run of each (prompt, method).",
)
@click.option("--detail", is_flag=True, help="Also print every (method, category) row.")
@click.option(
    "--server",
    metavar="URL",
    default=None,
    help="Benchmark a speculative-decoding server instead (its own decoding, and drafting off where "
    "it allows that per request); see README.",
)
@click.option(
    "--baseline-server", metavar="URL", default=None, help="With --server: the same model without drafting."
)
def bench(**options: Any) -> None:
    """Benchmark plain, speculative and Hugging Face assisted decoding side by side."""
    server, baseline = options.pop("server"), options.pop("baseline_server")
    try:
        if server or baseline:
            _bench_server(server, baseline, options)
            return
        _bench(**options)
    except SpecchatError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        click.echo("bench cancelled.", err=True)
        sys.exit(130)


def _bench_server(server: str | None, baseline: str | None, options: dict[str, Any]) -> None:
    """``bench --server``: prompts and sampling from the usual options; models options do not apply."""
    from specchat.backend import Controls
    from specchat.bench.prompts import load_prompts
    from specchat.config import load_settings
    from specchat.remote.bench import bench_server

    if not server:
        raise BenchError("--baseline-server needs --server (the speculative server to compare with it).")
    quick = options["quick"]
    categories = options["categories"] or ""
    wanted = [c.strip() for c in categories.split(",") if c.strip()] or None
    prompts = load_prompts(quick=quick, only=wanted, per_category=options["per_category"])
    controls = Controls(
        gamma=options["start_gamma"],
        temperature=options["temperature"],
        top_k=options["top_k"],
        top_p=options["top_p"],
        max_new_tokens=options["max_new_tokens"] or (64 if quick else 128),
        seed=options["seed"],
    )
    controls.validate()
    settings = load_settings()
    bench_server(
        server,
        baseline,
        prompts,
        controls,
        timeout=settings.server_timeout,
        verify=settings.server_verify_tls,
        json_path=options["json_path"],
        echo=lambda line: click.echo(line),
    )


def _bench(
    *,
    target: str | None,
    draft: str | None,
    quick: bool,
    json_path: Path | None,
    plot_path: Path | None,
    gammas: str | None,
    hf_gammas: str | None,
    no_hf: bool,
    hf_extra: bool,
    max_new_tokens: int | None,
    temperature: float,
    top_k: int | None,
    top_p: float,
    seed: int,
    categories: str | None,
    per_category: int | None,
    start_gamma: int,
    ngram_gamma: int,
    device: str,
    dtype: str,
    quant: str | None,
    cpu_path: str,
    no_lean: bool,
    threads: int | None,
    repeats: int,
    detail: bool,
) -> None:
    # Everything that can be checked without torch is checked first: a typo fails in milliseconds.
    from specchat.bench.prompts import load_prompts

    sweep = _ints(gammas or (QUICK_GAMMAS if quick else FULL_GAMMAS), "--gammas")
    hf_sweep = (
        [] if no_hf else _ints(hf_gammas or ("2,3" if quick else ",".join(map(str, sweep))), "--hf-gammas")
    )
    new_tokens = max_new_tokens or (64 if quick else 128)
    if new_tokens < 1:
        raise BenchError("--max-new-tokens must be 1 or more.")
    wanted = [c.strip() for c in categories.split(",") if c.strip()] if categories else None
    prompts = load_prompts(quick=quick, only=wanted, per_category=per_category)
    for path in (json_path, plot_path):
        if path is not None and not path.parent.exists():
            raise BenchError(f"folder {path.parent} does not exist (for {path.name}).")
    from specchat.models.cpu_quant import parse_cpu_path, prepare_cpu_pair

    parse_cpu_path(cpu_path)  # a typo fails before any model loads

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    from specchat.bench.costs import measure_costs
    from specchat.bench.report import headline, render_detail, render_tables, summarize, to_json
    from specchat.bench.runner import BenchSettings, build_methods, run_bench, warm_up
    from specchat.config import load_settings
    from specchat.engine.sampling import SamplingParams
    from specchat.engine.session import ChatEngine
    from specchat.models import load_pair

    SamplingParams(temperature, top_k, top_p)  # validates
    settings_file = load_settings()
    target_name = target or settings_file.target
    draft_name = draft if draft is not None else settings_file.draft
    if draft_name is not None and draft_name.lower() == "none":
        draft_name = None

    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # transformers' notices would break the progress bar
    if threads is not None:
        if threads < 1:
            raise BenchError("--threads must be 1 or more.")
        torch.set_num_threads(threads)

    with console.status("loading models…") as status:
        target_lm, draft_lm = load_pair(
            target_name,
            draft_name,
            device=device,
            dtype=dtype,
            quant=quant,
            progress=lambda p: status.update(p.message),
        )
        status.update("preparing CPU kernels…")
        pair = prepare_cpu_pair(
            target_lm.model, draft_lm.model if draft_lm else None, cpu_path, lean=not no_lean
        )
    path_used = pair.path + (" (lean forward)" if pair.lean else "")
    if temperature > 0 and "+head" in pair.path and hf_sweep:
        # transformers' speculative sampling needs the draft's logits over the whole vocabulary.
        console.print(
            f"note: HF assisted sampling needs the draft's full head; skipped with --cpu-path {pair.path}"
        )
        hf_sweep = []
    peer = (pair.hf_target, pair.hf_draft)
    engine = ChatEngine(pair.target, target_lm.tokenizer, pair.draft)
    settings = BenchSettings(new_tokens, temperature, top_k, top_p, seed)
    methods = build_methods(
        sweep,
        start_gamma=start_gamma,
        ngram_gamma=ngram_gamma,
        hf_gammas=hf_sweep,
        hf_plain=hf_extra and not no_hf,
        hf_default=hf_extra and not no_hf,
        has_draft=draft_lm is not None,
    )

    probe_ids = max((engine.prompt_ids(p.messages) for p in prompts), key=len)
    with console.status("warming up and measuring c and v(γ)…"):
        warm_up(engine, probe_ids, methods, peer=peer)
        costs = measure_costs(engine.target, engine.draft, probe_ids, sweep, repeats=3 if quick else 7)
        engine.target.reset()
        if engine.draft is not None:
            engine.draft.reset()

    load_before = machine_load()
    started = time.perf_counter()
    total = len(prompts) * len(methods) * repeats
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("benchmarking", total=total)
        records = run_bench(
            engine,
            prompts,
            methods,
            settings,
            repeats=repeats,
            before_run=lambda p, m: bar.update(task, description=f"{p.id:<16} {m.name:<20}"),
            progress=lambda r: bar.advance(task),
            peer=peer,
        )
    elapsed = time.perf_counter() - started
    out = Console()
    for renderable in render_tables(records, methods, costs):
        out.print(renderable)
    if detail:
        out.print(render_detail(records, methods, costs))
    summary = summarize(records, methods, costs)
    for line in headline(summary, costs):
        out.print(line, highlight=False)
    load_after = machine_load()
    out.print(
        f"{len(records)} runs in {elapsed:.0f} s; load average {load_before['load1']} before, "
        f"{load_after['load1']} after, {load_after['cpus']} CPUs",
        highlight=False,
    )

    meta: dict[str, Any] = {
        "command": " ".join(["specchat bench", *_own_args()]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "load_before": load_before,
            "load_after": load_after,
        },
        "target": target_lm.name,
        "draft": draft_lm.name if draft_lm else None,
        "device": str(target_lm.device),
        "dtype": str(target_lm.dtype).removeprefix("torch."),
        "quant": target_lm.quant,
        "cpu_path": path_used,
        "settings": {
            "max_new_tokens": new_tokens,
            "temperature": temperature,
            "top_k": top_k,
            "top_p": top_p,
            "seed": seed,
            "quick": quick,
            "gammas": sweep,
            "hf_gammas": hf_sweep,
            "repeats": repeats,
            "aggregation": "fastest repeat of each (prompt, method)",
        },
        "prompts": [p.id for p in prompts],
        "elapsed_s": round(elapsed, 1),
    }
    if json_path is not None:
        data = to_json(records, methods, costs, meta)
        try:
            json_path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        except OSError as err:
            raise BenchError(f"cannot write {json_path}: {err.strerror or err}.") from err
        out.print(f"wrote {json_path}", highlight=False)
    if plot_path is not None:
        from specchat.bench.plot import write_plot

        title = (
            f"{target_lm.name} + {draft_lm.name if draft_lm else 'no draft'} · {meta['device']} · {path_used}"
        )
        write_plot(plot_path, records, methods, costs, title=title)
        out.print(f"wrote {plot_path}", highlight=False)
