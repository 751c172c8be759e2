"""`specchat bench`: the click command. It parses the options into a plan and prints what the
run measured; the run itself is :func:`specchat.bench.plan.run_plan`."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from specchat.bench import BenchError
from specchat.bench.sweep import FULL_GAMMAS, QUICK_GAMMAS, comma_list
from specchat.cli.options import (
    LOADING_OPTIONS,
    draft_window_option,
    loading_options,
    sampling_options,
    settings_from,
)
from specchat.errors import SpecchatError
from specchat.params import GAMMA_MAX
from specchat.untrusted import json_text

if TYPE_CHECKING:
    from specchat.bench.plan import BenchOutcome
    from specchat.config import Settings

# Sampling flags left unset take these, not the settings file's values: a benchmark's figures must
# not depend on whose settings it ran under. The models and kernels do come from the settings, so
# the bench times what `specchat chat` runs.
BENCH_SAMPLING: dict[str, Any] = {"temperature": 0.0, "top_p": 1.0, "seed": 0}


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
@draft_window_option
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
    type=click.IntRange(1, GAMMA_MAX),
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
        settings = settings_from({name: options.pop(name) for name in (*LOADING_OPTIONS, "draft_window")})
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
    from specchat.bench.prompts import load_prompts
    from specchat.bench.server import bench_server
    from specchat.engine.backend import Controls

    server = settings.server
    if not server:
        raise BenchError("--baseline-server needs --server (the speculative server to compare with it).")
    quick = options["quick"]
    prompts = load_prompts(
        quick=quick,
        only=comma_list(options["categories"]),
        per_category=options["per_category"],
        path=options["prompts_path"],
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
    json_path: Path | None,
    plot_path: Path | None,
    max_new_tokens: int | None,
    temperature: float,
    top_k: int | None,
    top_p: float,
    seed: int,
    detail: bool,
    **options: Any,
) -> None:
    """The timing run: its plan (checked before any model loads), run, then printed and written."""
    from rich.console import Console

    from specchat.bench.methods import BenchSettings
    from specchat.bench.plan import make_plan, run_plan

    quick = options["quick"]
    budget = _budget(max_new_tokens, 64 if quick else 128)
    sampling = BenchSettings(budget, temperature, top_k, top_p, seed, settings.draft_window)
    # Every option that can be checked without torch is checked first: a typo fails in milliseconds.
    plan = make_plan(settings, sampling, command=" ".join(["specchat bench", *_own_args()]), **options)
    _check_folders(json_path, plot_path)
    outcome = run_plan(plan, Console(stderr=True))
    _print_outcome(outcome, detail=detail)
    _write_outcome(outcome, json_path, plot_path)


def _print_outcome(outcome: BenchOutcome, *, detail: bool) -> None:
    """The tables (every (method, category) row with ``detail``), the headline, the run's load."""
    from rich.console import Console

    from specchat.bench.report import headline, render_detail, render_tables
    from specchat.bench.summary import summarize

    records, methods, costs = outcome.records, outcome.methods, outcome.costs
    out = Console()
    for renderable in render_tables(records, methods, costs):
        out.print(renderable)
    if detail:
        out.print(render_detail(records, methods, costs))
    for line in headline(summarize(records, methods, costs), costs):
        out.print(line, highlight=False, markup=False)  # plain text naming prompts and categories
    before, after = outcome.load_before, outcome.load_after
    out.print(
        f"{len(records)} runs in {outcome.elapsed_s:.0f} s; load average {before['load1']} before, "
        f"{after['load1']} after, {after['cpus']} CPUs",
        highlight=False,
    )


def _write_outcome(outcome: BenchOutcome, json_path: Path | None, plot_path: Path | None) -> None:
    """The records and summary as JSON, the plot as PNG, where asked."""
    from rich.console import Console

    from specchat.bench.report import to_json

    records, methods, costs = outcome.records, outcome.methods, outcome.costs
    out = Console()
    if json_path is not None:
        _write_json(json_path, to_json(records, methods, costs, outcome.meta))
        out.print(f"wrote {json_path}", highlight=False)
    if plot_path is not None:
        from specchat.bench.plot import write_plot

        opened = outcome.opened
        pair_name = f"{opened.target_name} + {opened.draft_name or 'no draft'}"
        title = f"{pair_name} · {outcome.meta['device']} · {opened.kernels}"
        write_plot(plot_path, records, methods, costs, title=title)
        out.print(f"wrote {plot_path}", highlight=False)


def _check_folders(*paths: Path | None) -> None:
    for path in paths:
        if path is not None and not path.parent.exists():
            raise BenchError(f"folder {path.parent} does not exist (for {path.name}).")


CHECK_OPTIONS = ("quick", "prompts_path", "categories", "per_category", "start_gamma", "no_lean", "threads")
"""The options the check's plan takes as they are (the rest are the timing run's)."""


def _check(
    settings: Settings,
    *,
    json_path: Path | None,
    plot_path: Path | None,
    max_new_tokens: int | None,
    temperature: float,
    **options: Any,
) -> None:
    """`specchat bench --check`: greedy equality of every drafter and schedule with plain decoding."""
    from rich.console import Console

    from specchat.bench.plan import make_check_plan, run_check_plan

    if temperature != 0.0:
        raise BenchError("--check compares greedy replies: leave --temperature at 0.")
    if plot_path is not None:
        raise BenchError("--check measures no speed, so there is nothing to plot: drop --plot.")
    if options.get("llama_cpp") is not None:
        raise BenchError("--check checks specchat's own configurations: drop --llama-cpp.")
    new_tokens = _budget(max_new_tokens, 48)
    plan = make_check_plan(settings, new_tokens=new_tokens, **{name: options[name] for name in CHECK_OPTIONS})
    _check_folders(json_path)
    outcome = run_check_plan(plan, Console(stderr=True))
    result, loaded, elapsed = outcome.result, outcome.opened, outcome.elapsed_s
    for line in result.lines():
        click.echo(line)
    click.echo(
        f"target {loaded.target_name}, draft {loaded.draft_name or 'none'}, "
        f"CPU path {loaded.kernels}{_kernels_named(loaded.kernels)}, γ {plan.gamma}; {elapsed:.0f} s"
    )
    if json_path is not None:
        import torch

        meta = {
            "command": " ".join(["specchat bench", *_own_args()]),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "target": loaded.target_name,
            "draft": loaded.draft_name,
            "cpu_path": loaded.kernels,
            "gamma": plan.gamma,
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
        path.write_text(json_text(data, indent=1) + "\n", encoding="utf-8")
    except OSError as err:
        raise BenchError(f"cannot write {path}: {err.strerror or err}.") from err


def _kernels_named(path_used: str) -> str:
    """ " on avx2 kernels" where the pair ran on specchat's kernels: which variant was checked."""
    from specchat.kernels import variant
    from specchat.models.compute.cpu_quant import parse_cpu_path

    try:
        native = parse_cpu_path(path_used).native
    except SpecchatError:
        return ""  # a path the CPU path parser does not know (a GPU, a server): no kernels
    return f" on {variant()} kernels" if native else ""
