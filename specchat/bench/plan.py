"""One `specchat bench` run as a plan, and the one function that runs a plan.

:class:`BenchPlan` is everything a timing run needs, decided from the command's options before
any model loads (the CLI builds it with :func:`make_plan`, which checks what can be checked
without torch, so a typo fails in milliseconds). :func:`run_plan` opens the pair, warms up,
measures the costs, runs every method on every prompt and returns a :class:`BenchOutcome`; the
CLI prints it and writes the files asked for. The helpers the greedy check shares (opening the
pair, the progress bar) live here too.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specchat.bench import BenchError
from specchat.bench.methods import BenchSettings, Method, build_methods
from specchat.bench.prompt_record import BenchPrompt
from specchat.bench.sweep import FULL_GAMMAS, QUICK_GAMMAS, QUICK_HF_GAMMAS, comma_list, parse_gammas

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

    from specchat.bench.check import CheckResult
    from specchat.bench.costs import Costs
    from specchat.bench.llamacpp_peer import LlamaCppPeer
    from specchat.bench.run_record import RunRecord
    from specchat.config import Settings
    from specchat.engine.session import ChatEngine
    from specchat.opening import OpenedBackend


@dataclass(frozen=True)
class BenchPlan:
    """What a timing run measures and how (see the module's docstring)."""

    settings: Settings
    """The models, kernels and device, as ``specchat chat`` would open them."""
    prompts: tuple[BenchPrompt, ...]
    sampling: BenchSettings
    """Tokens per reply and the sampling every method decodes with."""
    sweep: tuple[int, ...]
    """The fixed γ of the sweep rows (and of the cost probe's v(γ))."""
    hf_sweep: tuple[int, ...]
    """γ of the Hugging Face assisted rows (empty: none)."""
    hf_extra: bool
    """Also Hugging Face plain generate and assisted with its own defaults."""
    start_gamma: int
    ngram_gamma: int
    lean: bool
    """Decode with the lean forward (False: the stock Hugging Face one)."""
    threads: int | None
    repeats: int
    only_methods: frozenset[str] | None
    """--methods: the rows kept (plain always runs); None: all."""
    llama_cpp: Path | None
    """A llama.cpp build folder: its rows run on the GGUF files the pair came from."""
    llama_cpp_ggufs: tuple[Path, Path | None] | None
    """Those files (target, draft), found before any model loads."""
    llama_cpp_draft_max: int
    quick: bool
    prompts_file: Path | None
    command: str
    """The command line, for the JSON's meta."""

    @property
    def wants_hf(self) -> bool:
        return bool(self.hf_sweep) or self.hf_extra

    def methods(
        self, *, has_draft: bool = True, hf_sweep: Sequence[int] | None = None, hf_extra: bool | None = None
    ) -> list[Method]:
        """The rows this plan runs (``hf_sweep``, ``hf_extra``: the peer's rows left once the
        models are open)."""
        extra = self.hf_extra if hf_extra is None else hf_extra
        methods = build_methods(
            list(self.sweep),
            start_gamma=self.start_gamma,
            ngram_gamma=self.ngram_gamma,
            hf_gammas=list(self.hf_sweep if hf_sweep is None else hf_sweep),
            hf_plain=extra,
            hf_default=extra,
            has_draft=has_draft,
            llama_cpp_draft_max=self.llama_cpp_draft_max if self.llama_cpp is not None else None,
        )
        if self.only_methods is None:
            return methods
        return [m for m in methods if m.name in self.only_methods or m.kind == "plain"]


def make_plan(
    settings: Settings,
    sampling: BenchSettings,
    *,
    quick: bool,
    gammas: str | None,
    hf_gammas: str | None,
    no_hf: bool,
    hf_extra: bool,
    prompts_path: Path | None,
    categories: str | None,
    per_category: int | None,
    start_gamma: int,
    ngram_gamma: int,
    no_lean: bool,
    threads: int | None,
    repeats: int,
    only_methods: str | None,
    llama_cpp: Path | None,
    llama_cpp_draft_max: int,
    command: str,
) -> BenchPlan:
    """The plan of the bench's options, each checked that can be without torch or models."""
    from specchat.bench.prompts import load_prompts
    from specchat.engine.sampling import SamplingParams
    from specchat.models.compute.cpu_quant import parse_cpu_path

    sweep = parse_gammas(gammas or (QUICK_GAMMAS if quick else FULL_GAMMAS), "--gammas")
    default_hf = QUICK_HF_GAMMAS if quick else ",".join(map(str, sweep))
    hf_sweep = () if no_hf else parse_gammas(hf_gammas or default_hf, "--hf-gammas")
    prompts = load_prompts(
        quick=quick, only=comma_list(categories), per_category=per_category, path=prompts_path
    )
    parse_cpu_path(settings.cpu_path)  # a typo fails before any model loads
    SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p)  # validates
    ggufs: tuple[Path, Path | None] | None = None
    if llama_cpp is not None:
        from specchat.bench.llamacpp_peer import find_server, gguf_for

        find_server(llama_cpp)
        if sampling.temperature != 0.0:
            raise BenchError("the llama.cpp rows decode greedily: leave --temperature at 0 with --llama-cpp.")
        ggufs = (gguf_for(settings.target), gguf_for(settings.draft) if settings.draft else None)
    if threads is not None and threads < 1:
        raise BenchError("--threads must be 1 or more.")
    plan = BenchPlan(
        settings=settings,
        prompts=tuple(prompts),
        sampling=sampling,
        sweep=sweep,
        hf_sweep=hf_sweep,
        hf_extra=hf_extra and not no_hf,
        start_gamma=start_gamma,
        ngram_gamma=ngram_gamma,
        lean=not no_lean,
        threads=threads,
        repeats=repeats,
        only_methods=None,
        llama_cpp=llama_cpp,
        llama_cpp_ggufs=ggufs,
        llama_cpp_draft_max=llama_cpp_draft_max,
        quick=quick,
        prompts_file=prompts_path,
        command=command,
    )
    return _with_methods(plan, only_methods)


def _with_methods(plan: BenchPlan, text: str | None) -> BenchPlan:
    """--methods as a set of row names, checked against the rows this run could have."""
    if text is None:
        return plan
    from dataclasses import replace

    names = {part.strip() for part in text.split(",") if part.strip()}
    known = [m.name for m in plan.methods()]
    unknown = sorted(names - set(known))
    if unknown or not names:
        raise BenchError(f"unknown method {', '.join(unknown) or '(none given)'}: use {', '.join(known)}.")
    return replace(plan, only_methods=frozenset(names))


@dataclass(frozen=True)
class BenchOutcome:
    """What a run measured, for the CLI to print and write."""

    records: list[RunRecord]
    methods: list[Method]
    costs: Costs
    opened: OpenedBackend
    meta: dict[str, Any]
    """The JSON's meta: the command, the date, the machine and its load, the models, the settings."""
    elapsed_s: float
    load_before: dict[str, Any]
    load_after: dict[str, Any]


def run_plan(plan: BenchPlan, console: Console) -> BenchOutcome:
    """Open the pair, warm up, measure c and v(γ), run every method on every prompt (``repeats``
    times, the order rotating), with the progress on ``console``."""
    import contextlib

    from specchat.opening import local_engine

    opened = open_pair(plan.settings, plan.lean, plan.threads, console, hf_note=plan.wants_hf)
    engine = local_engine(opened)
    hf_sweep: Sequence[int] = plan.hf_sweep
    hf_extra = plan.hf_extra
    if opened.peer is None:
        hf_sweep, hf_extra = (), False
    if plan.sampling.temperature > 0 and "+head" in opened.kernels and hf_sweep:
        # transformers' speculative sampling needs the draft's logits over the whole vocabulary.
        skipped = f"skipped with --cpu-path {opened.kernels}"
        console.print(f"note: HF assisted sampling needs the draft's full head; {skipped}")
        hf_sweep = ()
    methods = plan.methods(has_draft=engine.draft is not None, hf_sweep=hf_sweep, hf_extra=hf_extra)
    probe_ids = max((engine.prompt_ids(p.messages) for p in plan.prompts), key=len)
    with contextlib.ExitStack() as stack:
        llama = None
        if plan.llama_cpp is not None:
            llama = _start_llama_cpp(plan, engine, console)
            stack.callback(llama.close)
        return _measure(plan, engine, opened, methods, probe_ids, list(hf_sweep), llama, console)


def _measure(
    plan: BenchPlan,
    engine: ChatEngine,
    opened: OpenedBackend,
    methods: list[Method],
    probe_ids: list[int],
    hf_sweep: list[int],
    llama: LlamaCppPeer | None,
    console: Console,
) -> BenchOutcome:
    """Warm up, measure the costs, run every method on every prompt."""
    import torch

    from specchat.bench.costs import measure_costs
    from specchat.bench.runner import run_bench, warm_up

    with console.status("warming up and measuring c and v(γ)…"):
        warm_up(engine, probe_ids, methods, peer=opened.peer, llama=llama)
        repeats = 3 if plan.quick else 7
        costs = measure_costs(engine.target, engine.draft, probe_ids, list(plan.sweep), repeats=repeats)
        engine.target.reset()
        if engine.draft is not None:
            engine.draft.reset()
    load_before = machine_load()
    started = time.perf_counter()
    total = turns(plan.prompts) * len(methods) * plan.repeats
    with progress_bar(console) as bar:
        task = bar.add_task("benchmarking", total=total)
        records = run_bench(
            engine,
            plan.prompts,
            methods,
            plan.sampling,
            repeats=plan.repeats,
            before_run=lambda p, m: bar.update(task, description=described(p.id, m.name, 16, 22)),
            progress=lambda r: bar.advance(task),
            peer=opened.peer,
            llama=llama,
        )
    elapsed = time.perf_counter() - started
    load_after = machine_load()
    settings = plan.sampling
    meta: dict[str, Any] = {
        "command": plan.command,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "load_before": load_before,
            "load_after": load_after,
        },
        "target": opened.target_name,
        "draft": opened.draft_name,
        "device": opened.device,
        "dtype": opened.dtype,
        "quant": opened.quant,
        "cpu_path": opened.kernels,
        "settings": {
            "max_new_tokens": settings.max_new_tokens,
            "temperature": settings.temperature,
            "top_k": settings.top_k,
            "top_p": settings.top_p,
            "seed": settings.seed,
            "quick": plan.quick,
            "gammas": list(plan.sweep),
            "hf_gammas": hf_sweep,
            "repeats": plan.repeats,
            "aggregation": "fastest repeat of each (prompt, method)",
        },
        "prompts": [p.id for p in plan.prompts],
        "prompts_file": str(plan.prompts_file) if plan.prompts_file is not None else None,
        "turns": turns(plan.prompts),
        "elapsed_s": round(elapsed, 1),
        "llama_cpp": llama.meta() if llama is not None else None,
    }
    return BenchOutcome(records, methods, costs, opened, meta, elapsed, load_before, load_after)


def _start_llama_cpp(plan: BenchPlan, engine: ChatEngine, console: Console) -> LlamaCppPeer:
    """The peer's two servers on the GGUF files the pair was converted from, with torch's threads."""
    import torch

    from specchat.bench.llamacpp_peer import start_peer

    assert plan.llama_cpp is not None and plan.llama_cpp_ggufs is not None
    target_gguf, draft_gguf = plan.llama_cpp_ggufs
    longest = longest_conversation(engine, plan.prompts, plan.sampling.max_new_tokens)
    context = -(-(longest + 64) // 256) * 256  # the longest prompt and its reply, rounded up
    log_dir = Path(tempfile.mkdtemp(prefix="specchat-llama-cpp-"))
    with console.status("starting llama.cpp…"):
        return start_peer(
            plan.llama_cpp,
            target_gguf,
            draft_gguf,
            threads=torch.get_num_threads(),
            context=context,
            draft_max=plan.llama_cpp_draft_max,
            stop_ids=engine.stop_ids,
            log_dir=log_dir,
        )


# ------------------------------------------------------------------ the greedy check


@dataclass(frozen=True)
class CheckPlan:
    """``bench --check``: every drafter and schedule against plain greedy decoding."""

    settings: Settings
    prompts: tuple[BenchPrompt, ...]
    new_tokens: int
    gamma: int
    """The γ every checked configuration starts from."""
    lean: bool
    threads: int | None


def make_check_plan(
    settings: Settings,
    *,
    quick: bool,
    new_tokens: int,
    prompts_path: Path | None,
    categories: str | None,
    per_category: int | None,
    start_gamma: int,
    no_lean: bool,
    threads: int | None,
) -> CheckPlan:
    """The check's plan, each option checked that can be without torch or models."""
    from specchat.bench.prompts import load_prompts
    from specchat.engine.gamma import check_gamma
    from specchat.models.compute.cpu_quant import parse_cpu_path

    check_gamma(start_gamma)
    prompts = load_prompts(
        quick=quick,
        only=comma_list(categories),
        per_category=per_category,
        check=prompts_path is None,
        path=prompts_path,
    )
    parse_cpu_path(settings.cpu_path)
    return CheckPlan(settings, tuple(prompts), new_tokens, start_gamma, not no_lean, threads)


@dataclass(frozen=True)
class CheckOutcome:
    result: CheckResult
    opened: OpenedBackend
    elapsed_s: float


def run_check_plan(plan: CheckPlan, console: Console) -> CheckOutcome:
    """Open the pair, then decode every prompt plainly and with every checked configuration."""
    from specchat.bench.check import check_methods, run_check
    from specchat.opening import local_engine

    opened = open_pair(plan.settings, plan.lean, plan.threads, console, hf_note=False)
    engine = local_engine(opened)
    methods = check_methods(engine, plan.gamma)
    started = time.perf_counter()
    with progress_bar(console) as bar:
        task = bar.add_task("checking", total=turns(plan.prompts) * (len(methods) + 1))
        result = run_check(
            engine,
            plan.prompts,
            methods,
            plan.new_tokens,
            before_run=lambda p, m: bar.update(task, description=described(p.id, m.name, 22, 20)),
            progress=lambda r: bar.advance(task),
        )
    return CheckOutcome(result, opened, time.perf_counter() - started)


# ------------------------------------------------------------------ shared with the check


def open_pair(
    settings: Settings, lean: bool, threads: int | None, console: Console, *, hf_note: bool
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
        opened = open_backend(
            settings, lambda p: status.update(p.message), every_drafter=True, hf_peer=True, lean=lean
        )
    if opened.peer is None and hf_note:
        console.print(
            f"note: Hugging Face generate cannot run specchat's kernels ({opened.kernels}); its rows are "
            "left out. --cpu-path int8/dyn8+head32768 runs both on the same fbgemm layers."
        )
    return opened


def progress_bar(console: Console) -> Progress:
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


def described(prompt_id: str, method: str, id_width: int, method_width: int) -> str:
    """The progress bar's line: a prompt id from a question file is shown, not read as markup."""
    from rich.markup import escape

    return f"{escape(prompt_id):<{id_width}} {method:<{method_width}}"


def turns(prompts: Sequence[BenchPrompt]) -> int:
    """Replies the prompts ask for: one per turn of each question."""
    return sum(1 + len(p.follow_ups) for p in prompts)


def longest_conversation(engine: ChatEngine, prompts: Sequence[BenchPrompt], new_tokens: int) -> int:
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


def machine_load() -> dict[str, Any]:
    """1-minute load average and core count: benchmark figures mean little on a busy machine."""
    try:
        load1, load5, _ = os.getloadavg()
    except OSError:  # pragma: no cover - not on every platform
        load1 = load5 = float("nan")
    return {"load1": round(load1, 2), "load5": round(load5, 2), "cpus": os.cpu_count()}
