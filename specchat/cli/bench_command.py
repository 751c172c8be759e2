"""`specchat bench`: the click command; what it runs lives in :mod:`specchat.bench`."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from specchat.bench import BenchError
from specchat.cli.options import LOADING_OPTIONS, loading_options, sampling_options, settings_from
from specchat.engine.gamma import GAMMA_MAX
from specchat.errors import SpecchatError
from specchat.opening import local_engine

if TYPE_CHECKING:
    from specchat.config import Settings
    from specchat.opening import OpenedBackend

QUICK_GAMMAS = "1,2,3,4"
FULL_GAMMAS = "1,2,3,4,5,6,8"
# Sampling flags left unset take these, not the settings file's values: a benchmark's figures must
# not depend on whose settings it ran under. The models and kernels do come from the settings, so
# the bench times what `specchat chat` runs.
BENCH_SAMPLING: dict[str, Any] = {"temperature": 0.0, "top_p": 1.0, "seed": 0}


def _ints(text: str, what: str) -> list[int]:
    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError as err:
        raise BenchError(f"{what} must be a comma-separated list of whole numbers (got {text!r}).") from err
    if any(v < 1 or v > 16 for v in values):
        raise BenchError(f"{what} must be between 1 and 16 (got {text!r}).")
    return values


def _check_budget(max_new_tokens: int | None) -> None:
    """--max-new-tokens below 1 is a usage error, as click words it. The shared option is a plain
    int (the settings check it for the other commands); the bench does not take it from them."""
    if max_new_tokens is not None:
        ctx = click.get_current_context()
        param = next(p for p in ctx.command.params if p.name == "max_new_tokens")
        click.IntRange(1).convert(max_new_tokens, param, ctx)


def _budget(max_new_tokens: int | None, default: int) -> int:
    """Tokens per reply: --max-new-tokens, else the run's default."""
    return default if max_new_tokens is None else max_new_tokens


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
@loading_options
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
@sampling_options
@click.option(
    "--prompts",
    "prompts_path",
    type=click.Path(path_type=Path),
    default=None,
    metavar="FILE.jsonl",
    help="Questions from a Spec-Bench or MT-Bench question.jsonl (question_id, category, turns) "
    "instead of the built-in set; reported by its categories, later turns following each "
    "method's own answers.",
)
@click.option("--categories", default=None, help="Comma-separated subset, e.g. code,math.")
@click.option("--per-category", type=int, default=None, help="At most this many prompts per category.")
# Checked by click, before any model loads: a bad γ used to surface only after minutes of loading.
@click.option(
    "--start-gamma",
    type=click.IntRange(1, GAMMA_MAX),
    default=4,
    show_default=True,
    help="First γ of heuristic/adaptive.",
)
@click.option(
    "--ngram-gamma",
    type=click.IntRange(1, GAMMA_MAX),
    default=4,
    show_default=True,
    help="γ of the n-gram drafter.",
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
    "--methods",
    "only_methods",
    default=None,
    metavar="NAMES",
    help="Only these rows, comma-separated (e.g. hybrid for the defaults; plain always runs).",
)
@click.option(
    "--llama-cpp",
    "llama_cpp",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="A llama.cpp build folder (holding llama-server): adds 'llama.cpp plain' and 'llama.cpp "
    "speculative' rows on the same GGUF files, prompts, token budget and threads.",
)
@click.option(
    "--llama-cpp-draft-max",
    type=click.IntRange(1, 16),
    default=4,
    show_default=True,
    help="Tokens llama.cpp drafts per round (its --spec-draft-n-max).",
)
@click.option(
    "--check",
    is_flag=True,
    help="Instead of timing: check that every drafter and schedule reproduces plain greedy decoding, "
    "on the bench's prompts and the check's own (54; --quick: 6). Exit status 1 on any mismatch.",
)
@click.option(
    "--baseline-server", metavar="URL", default=None, help="With --server: the same model without drafting."
)
def bench(**options: Any) -> None:
    """Benchmark plain, speculative and Hugging Face assisted decoding side by side."""
    _check_budget(options["max_new_tokens"])
    baseline = options.pop("baseline_server")
    try:
        settings = settings_from({name: options.pop(name) for name in LOADING_OPTIONS})
        for name, value in BENCH_SAMPLING.items():
            if options[name] is None:
                options[name] = value
        check = options.pop("check")
        if settings.server or baseline:
            if check:
                raise SpecchatError("--check decodes with the local engine: it does not take --server.")
            _bench_server(settings, baseline, options)
        elif check:
            _check(settings, **options)
        else:
            _bench(settings, **options)
    except SpecchatError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        click.echo("bench cancelled.", err=True)
        sys.exit(130)


def _bench_server(settings: Settings, baseline: str | None, options: dict[str, Any]) -> None:
    """``bench --server``: prompts and sampling from the usual options; models options do not apply."""
    from specchat.backend import Controls
    from specchat.bench.prompts import load_prompts
    from specchat.bench.server import bench_server

    server = settings.server
    if not server:
        raise BenchError("--baseline-server needs --server (the speculative server to compare with it).")
    quick = options["quick"]
    categories = options["categories"] or ""
    wanted = [c.strip() for c in categories.split(",") if c.strip()] or None
    prompts = load_prompts(
        quick=quick, only=wanted, per_category=options["per_category"], path=options["prompts_path"]
    )
    if any(p.follow_ups for p in prompts):
        raise BenchError(
            "--server runs one reply per question: this file has multi-turn questions; pick "
            "single-turn categories with --categories or bench the local engine."
        )
    controls = Controls(
        gamma=options["start_gamma"],
        temperature=options["temperature"],
        top_k=options["top_k"],
        top_p=options["top_p"],
        max_new_tokens=_budget(options["max_new_tokens"], 64 if quick else 128),
        seed=options["seed"],
    )
    controls.validate()
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
    settings: Settings,
    *,
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
    prompts_path: Path | None,
    categories: str | None,
    per_category: int | None,
    start_gamma: int,
    ngram_gamma: int,
    no_lean: bool,
    threads: int | None,
    repeats: int,
    detail: bool,
    only_methods: str | None,
    llama_cpp: Path | None,
    llama_cpp_draft_max: int,
) -> None:
    # Everything that can be checked without torch is checked first: a typo fails in milliseconds.
    from specchat.bench.prompts import load_prompts

    sweep = _ints(gammas or (QUICK_GAMMAS if quick else FULL_GAMMAS), "--gammas")
    hf_sweep = (
        [] if no_hf else _ints(hf_gammas or ("2,3" if quick else ",".join(map(str, sweep))), "--hf-gammas")
    )
    new_tokens = _budget(max_new_tokens, 64 if quick else 128)
    wanted = [c.strip() for c in categories.split(",") if c.strip()] if categories else None
    prompts = load_prompts(quick=quick, only=wanted, per_category=per_category, path=prompts_path)
    _check_folders(json_path, plot_path)
    from specchat.models.cpu_quant import parse_cpu_path

    parse_cpu_path(settings.cpu_path)  # a typo fails before any model loads
    from specchat.engine.sampling import SamplingParams

    SamplingParams(temperature, top_k, top_p)  # validates
    ggufs: tuple[Path, Path | None] | None = None
    if llama_cpp is not None:
        from specchat.bench.llamacpp_peer import find_server, gguf_for

        find_server(llama_cpp)
        if temperature != 0.0:
            raise BenchError("the llama.cpp rows decode greedily: leave --temperature at 0 with --llama-cpp.")
        ggufs = (gguf_for(settings.target), gguf_for(settings.draft) if settings.draft else None)

    from specchat.bench.runner import BenchSettings, build_methods

    wanted_methods = _wanted_methods(
        only_methods,
        build_methods(
            sweep,
            start_gamma=start_gamma,
            ngram_gamma=ngram_gamma,
            hf_gammas=hf_sweep,
            hf_plain=hf_extra and not no_hf,
            hf_default=hf_extra and not no_hf,
            llama_cpp_draft_max=llama_cpp_draft_max if llama_cpp is not None else None,
        ),
    )
    from rich.console import Console

    console = Console(stderr=True)

    wants_hf = bool(hf_sweep) or (hf_extra and not no_hf)
    loaded = _open(settings, no_lean, threads, console, hf_note=wants_hf)
    engine = local_engine(loaded)
    if loaded.peer is None:
        hf_sweep, hf_extra = [], False
    if temperature > 0 and "+head" in loaded.kernels and hf_sweep:
        # transformers' speculative sampling needs the draft's logits over the whole vocabulary.
        skipped = f"skipped with --cpu-path {loaded.kernels}"
        console.print(f"note: HF assisted sampling needs the draft's full head; {skipped}")
        hf_sweep = []
    bench_settings = BenchSettings(new_tokens, temperature, top_k, top_p, seed)
    methods = build_methods(
        sweep,
        start_gamma=start_gamma,
        ngram_gamma=ngram_gamma,
        hf_gammas=hf_sweep,
        hf_plain=hf_extra and not no_hf,
        hf_default=hf_extra and not no_hf,
        has_draft=engine.draft is not None,
        llama_cpp_draft_max=llama_cpp_draft_max if llama_cpp is not None else None,
    )
    if wanted_methods is not None:
        methods = [m for m in methods if m.name in wanted_methods or m.kind == "plain"]

    probe_ids = max((engine.prompt_ids(p.messages) for p in prompts), key=len)
    with contextlib.ExitStack() as stack:
        llama = None
        if llama_cpp is not None and ggufs is not None:
            longest = _longest_conversation(engine, prompts, new_tokens)
            llama = _start_llama_cpp(llama_cpp, ggufs, loaded, llama_cpp_draft_max, longest, console)
            stack.callback(llama.close)
        _run_and_report(
            engine=engine,
            loaded=loaded,
            prompts=prompts,
            methods=methods,
            settings=bench_settings,
            probe_ids=probe_ids,
            sweep=sweep,
            hf_sweep=hf_sweep,
            llama=llama,
            console=console,
            quick=quick,
            repeats=repeats,
            detail=detail,
            json_path=json_path,
            plot_path=plot_path,
            prompts_file=prompts_path,
        )


def _start_llama_cpp(
    folder: Path,
    ggufs: tuple[Path, Path | None],
    loaded: OpenedBackend,
    draft_max: int,
    longest: int,
    console: Any,
) -> Any:
    """The peer's two servers on the GGUF files the pair was converted from, with torch's threads."""
    import torch

    from specchat.bench.llamacpp_peer import start_peer

    target_gguf, draft_gguf = ggufs
    context = -(-(longest + 64) // 256) * 256  # the longest prompt and its reply, rounded up
    log_dir = Path(tempfile.mkdtemp(prefix="specchat-llama-cpp-"))
    with console.status("starting llama.cpp…"):
        return start_peer(
            folder,
            target_gguf,
            draft_gguf,
            threads=torch.get_num_threads(),
            context=context,
            draft_max=draft_max,
            stop_ids=local_engine(loaded).stop_ids,
            log_dir=log_dir,
        )


def _run_and_report(
    *,
    engine: Any,
    loaded: OpenedBackend,
    prompts: Any,
    methods: Any,
    settings: Any,
    probe_ids: list[int],
    sweep: list[int],
    hf_sweep: list[int],
    llama: Any,
    console: Any,
    quick: bool,
    repeats: int,
    detail: bool,
    json_path: Path | None,
    plot_path: Path | None,
    prompts_file: Path | None,
) -> None:
    """Warm up, measure the costs, run every method on every prompt, print and write the report."""
    from rich.console import Console

    from specchat.bench.costs import measure_costs
    from specchat.bench.report import headline, render_detail, render_tables, summarize, to_json
    from specchat.bench.runner import run_bench, warm_up

    with console.status("warming up and measuring c and v(γ)…"):
        warm_up(engine, probe_ids, methods, peer=loaded.peer, llama=llama)
        costs = measure_costs(engine.target, engine.draft, probe_ids, sweep, repeats=3 if quick else 7)
        engine.target.reset()
        if engine.draft is not None:
            engine.draft.reset()

    load_before = machine_load()
    started = time.perf_counter()
    total = _turns(prompts) * len(methods) * repeats
    with _progress_bar(console) as bar:
        task = bar.add_task("benchmarking", total=total)
        records = run_bench(
            engine,
            prompts,
            methods,
            settings,
            repeats=repeats,
            before_run=lambda p, m: bar.update(task, description=_described(p.id, m.name, 16, 22)),
            progress=lambda r: bar.advance(task),
            peer=loaded.peer,
            llama=llama,
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
    import torch

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
        "target": loaded.target_name,
        "draft": loaded.draft_name,
        "device": loaded.device,
        "dtype": loaded.dtype,
        "quant": loaded.quant,
        "cpu_path": loaded.kernels,
        "settings": {
            "max_new_tokens": settings.max_new_tokens,
            "temperature": settings.temperature,
            "top_k": settings.top_k,
            "top_p": settings.top_p,
            "seed": settings.seed,
            "quick": quick,
            "gammas": sweep,
            "hf_gammas": hf_sweep,
            "repeats": repeats,
            "aggregation": "fastest repeat of each (prompt, method)",
        },
        "prompts": [p.id for p in prompts],
        "prompts_file": str(prompts_file) if prompts_file is not None else None,
        "turns": _turns(prompts),
        "elapsed_s": round(elapsed, 1),
        "llama_cpp": llama.meta() if llama is not None else None,
    }
    if json_path is not None:
        _write_json(json_path, to_json(records, methods, costs, meta))
        out.print(f"wrote {json_path}", highlight=False)
    if plot_path is not None:
        from specchat.bench.plot import write_plot

        pair_name = f"{loaded.target_name} + {loaded.draft_name or 'no draft'}"
        title = f"{pair_name} · {meta['device']} · {loaded.kernels}"
        write_plot(plot_path, records, methods, costs, title=title)
        out.print(f"wrote {plot_path}", highlight=False)


def _wanted_methods(text: str | None, every: Any) -> set[str] | None:
    """--methods as a set of row names, checked against the rows this run could have."""
    if text is None:
        return None
    names = {part.strip() for part in text.split(",") if part.strip()}
    known = [m.name for m in every]
    unknown = sorted(names - set(known))
    if unknown or not names:
        raise BenchError(f"unknown method {', '.join(unknown) or '(none given)'}: use {', '.join(known)}.")
    return names


def _described(prompt_id: str, method: str, id_width: int, method_width: int) -> str:
    """The progress bar's line: a prompt id from a question file is shown, not read as markup."""
    from rich.markup import escape

    return f"{escape(prompt_id):<{id_width}} {method:<{method_width}}"


def _turns(prompts: Any) -> int:
    """Replies the prompts ask for: one per turn of each question."""
    return sum(1 + len(p.follow_ups) for p in prompts)


def _longest_conversation(engine: Any, prompts: Any, new_tokens: int) -> int:
    """Tokens of the longest conversation a run can reach: every turn of a question asked, each
    answered with the whole token budget (a later turn's prompt holds the answers before it)."""
    longest = 0
    for prompt in prompts:
        messages = list(prompt.messages)
        for turn in prompt.follow_ups:
            messages += [{"role": "assistant", "content": ""}, {"role": "user", "content": turn}]
        replies = 1 + len(prompt.follow_ups)
        longest = max(longest, len(engine.prompt_ids(messages)) + replies * new_tokens)
    return longest


def _progress_bar(console: Any) -> Any:
    """The bench's and the check's progress bar (on stderr, gone when done)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def _check_folders(*paths: Path | None) -> None:
    for path in paths:
        if path is not None and not path.parent.exists():
            raise BenchError(f"folder {path.parent} does not exist (for {path.name}).")


def _open(
    settings: Settings, no_lean: bool, threads: int | None, console: Any, *, hf_note: bool
) -> OpenedBackend:
    """Open the pair as ``chat`` and ``generate`` open it (:func:`specchat.opening.open_backend`),
    with the Hugging Face models kept for the peer rows where the kernels allow.

    On specchat's own kernels that is the packed cache (the GGUF's own blocks for the target), so
    the bench times exactly the default; Hugging Face's ``generate`` cannot run those kernels, so
    its peer is left out there (said when ``hf_note``). Elsewhere the float models are loaded once
    and both the engine and the Hugging Face peer run on the same prepared layers.
    """
    import torch
    from transformers.utils import logging as hf_logging

    from specchat.opening import open_backend

    hf_logging.set_verbosity_error()  # transformers' notices would break the progress bar
    if threads is not None:
        if threads < 1:
            raise BenchError("--threads must be 1 or more.")
        torch.set_num_threads(threads)
    with console.status("loading models…") as status:
        loaded = open_backend(
            settings, lambda p: status.update(p.message), every_drafter=True, hf_peer=True, lean=not no_lean
        )
    if loaded.peer is None and hf_note:
        console.print(
            f"note: Hugging Face generate cannot run specchat's kernels ({loaded.kernels}); its rows are "
            "left out. --cpu-path int8/dyn8+head32768 runs both on the same fbgemm layers."
        )
    return loaded


def _check(
    settings: Settings,
    *,
    quick: bool,
    json_path: Path | None,
    plot_path: Path | None,
    max_new_tokens: int | None,
    temperature: float,
    prompts_path: Path | None,
    categories: str | None,
    per_category: int | None,
    start_gamma: int,
    no_lean: bool,
    threads: int | None,
    **timing_only: Any,
) -> None:
    """`specchat bench --check`: greedy equality of every drafter and schedule with plain decoding."""
    from specchat.bench.prompts import load_prompts
    from specchat.engine.gamma import check_gamma
    from specchat.models.cpu_quant import parse_cpu_path

    if temperature != 0.0:
        raise BenchError("--check compares greedy replies: leave --temperature at 0.")
    if plot_path is not None:
        raise BenchError("--check measures no speed, so there is nothing to plot: drop --plot.")
    if timing_only.get("llama_cpp") is not None:
        raise BenchError("--check checks specchat's own configurations: drop --llama-cpp.")
    new_tokens = _budget(max_new_tokens, 48)
    check_gamma(start_gamma)
    wanted = [c.strip() for c in categories.split(",") if c.strip()] if categories else None
    prompts = load_prompts(
        quick=quick, only=wanted, per_category=per_category, check=prompts_path is None, path=prompts_path
    )
    _check_folders(json_path)
    parse_cpu_path(settings.cpu_path)

    from rich.console import Console

    from specchat.bench.check import check_methods, run_check

    console = Console(stderr=True)
    loaded = _open(settings, no_lean, threads, console, hf_note=False)
    engine = local_engine(loaded)
    methods = check_methods(engine, start_gamma)
    started = time.perf_counter()
    with _progress_bar(console) as bar:
        task = bar.add_task("checking", total=_turns(prompts) * (len(methods) + 1))
        result = run_check(
            engine,
            prompts,
            methods,
            new_tokens,
            before_run=lambda p, m: bar.update(task, description=_described(p.id, m.name, 22, 20)),
            progress=lambda r: bar.advance(task),
        )
    elapsed = time.perf_counter() - started
    for line in result.lines():
        click.echo(line)
    click.echo(
        f"target {loaded.target_name}, draft {loaded.draft_name or 'none'}, "
        f"CPU path {loaded.kernels}{_kernels_named(loaded.kernels)}, γ {start_gamma}; {elapsed:.0f} s"
    )
    if json_path is not None:
        import torch

        meta = {
            "command": " ".join(["specchat bench", *_own_args()]),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "target": loaded.target_name,
            "draft": loaded.draft_name,
            "cpu_path": loaded.kernels,
            "gamma": start_gamma,
            "torch": torch.__version__,
            "elapsed_s": round(elapsed, 1),
        }
        data = {"meta": meta, "check": result.to_json(), "records": [r.to_json() for r in result.records]}
        _write_json(json_path, data)
        click.echo(f"wrote {json_path}")
    if result.mismatches:
        sys.exit(1)


def _write_json(path: Path, data: object) -> None:
    try:
        path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    except OSError as err:
        raise BenchError(f"cannot write {path}: {err.strerror or err}.") from err


def _kernels_named(path_used: str) -> str:
    """ " on avx2 kernels" where the pair ran on specchat's kernels: which variant was checked."""
    from specchat.kernels import variant
    from specchat.models.cpu_quant import parse_cpu_path

    try:
        native = parse_cpu_path(path_used).native
    except SpecchatError:
        return ""  # a path the CPU path parser does not know (a GPU, a server): no kernels
    return f" on {variant()} kernels" if native else ""
