"""The device probe: one short run that measures specchat's CUDA path on real model shapes.

    python3 scripts/gpu_probe.py                    # on a GPU machine: results in $OUT or ./probe-out
    python3 scripts/gpu_probe.py --device cpu --tiny   # the same sections on tiny models (CI runs this)
    python3 scripts/gpu_probe.py --size             # what would travel to a device machine, in MiB

Models are built on the device from configs with random weights: Qwen2.5-1.5B (target), 0.5B
(draft) and 7B shapes. Their bytes per step are the real models', so timings are real even
though their text is noise; no hub, no files. Every section is timed, guarded (one failing
section never stops the others) and written as soon as it finishes: ``probe.jsonl`` (one JSON
object per section) and ``summary.txt`` (the lines printed). The whole run keeps to its own
budget (8 minutes by default) and skips what no longer fits.

Sections: environment and copy bandwidth; costs (plain ms against the bandwidth floor, c and
v(1…8) on today's dynamic cache, the static cache eagerly, and with CUDA graphs); host syncs per
round; plain against speculative tok/s with the 0.5B draft and with the target drafting for
itself (α); row mismatch between a verify pass and one-token passes, in the fast default mode
and in exact mode (batch-invariant kernels); the same on the 7B shape; bitsandbytes 4-bit
(batched verify against today's row-by-row verify); the tiny GPU tests.

Needs only torch, transformers ≥ the floor pyproject names and what ``specchat.engine`` imports
(docs/testing.md's GPU section has the command that carries missing wheels to a machine without
a network). Exit status: 0 when every section ran, 1 when one failed, 2 when the gate refused.
"""

# ruff: noqa: E501 (shape tables and one-line summaries)

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = 480.0
"""The whole run, within the 8 minutes a device check may take (the tool's own limit is 10)."""
TRAVEL_LIMIT_MIB = 64.0
WHEELS = ROOT / ".whl"
IMAGE_ABSENT = ("gguf", "textual", "platformdirs", "pydantic", "tomlkit", "textual_plotext", "bitsandbytes")
"""What the device image lacks (the probe needs none of it; bitsandbytes only for its section)."""

QWEN_COMMON: dict[str, Any] = {
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 32768,
}
SHAPES: dict[str, dict[str, Any]] = {
    "1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": False},
    "0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": False},
    "7b": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
           "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False},
}  # fmt: skip
"""Qwen2.5's real shapes. Heads untied (the real 0.5B and 1.5B tie theirs; the bytes read per
step are the same): with random weights a tied head mostly predicts the token it was fed, so
every model would agree with every other and α would mean nothing."""
TINY_SHAPES: dict[str, dict[str, Any]] = {
    "1.5b": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": False},
    "0.5b": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 1, "vocab_size": 512, "tie_word_embeddings": False},
    "7b": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 520, "tie_word_embeddings": False},
}  # fmt: skip
PROMPT_TOKENS = 64
GAMMAS = list(range(1, 9))
SPEED_TOKENS = 128
SPEED_GAMMAS = (2, 4)


# ------------------------------------------------------------------------- sizes that travel


def travelling_files() -> list[Path]:
    """What a device call copies: tracked and untracked-not-ignored files (git's view when there is
    one; else everything but the usual ignored folders)."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
            capture_output=True, check=True, timeout=30,
        ).stdout  # fmt: skip
        return [ROOT / name for name in listed.decode().split("\0") if name]
    except (OSError, subprocess.SubprocessError):
        skip = {
            ".git",
            ".whl",
            ".venv",
            ".venv-ci",
            "__pycache__",
            ".mypy_cache",
            ".ruff_cache",
            ".pytest_cache",
        }
        return [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]


def mib(paths: list[Path]) -> float:
    return sum(p.stat().st_size for p in paths if p.is_file()) / 2**20


def size_line() -> str:
    tree = mib(travelling_files())
    wheels = mib(sorted(WHEELS.glob("*.whl"))) if WHEELS.is_dir() else 0.0
    total = tree + wheels
    verdict = "fits" if total < TRAVEL_LIMIT_MIB else "TOO BIG"
    return (
        f"travels: tree {tree:.1f} MiB + .whl {wheels:.1f} MiB = {total:.1f} MiB "
        f"({verdict}: the limit is {TRAVEL_LIMIT_MIB:.0f} MiB)"
    )


# --------------------------------------------------------------------------------- the gate


def transformers_floor() -> str:
    """The transformers version pyproject asks for (its ``>=`` bound)."""
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(r'"transformers>=([0-9.]+)', text)
    return match.group(1) if match else "0"


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def gate_problems() -> list[str]:
    """Why the probe cannot run here (empty when it can)."""
    problems = []
    try:
        importlib.import_module("torch")
    except ImportError as err:
        return [f"torch cannot be imported: {err}"]
    try:
        found = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return ["transformers is not installed"]
    floor = transformers_floor()
    if version_tuple(found) < version_tuple(floor):
        problems.append(
            f"transformers {found} is older than the {floor} pyproject names: carry the wheels "
            "(docs/testing.md, GPU section) and put them first on PYTHONPATH"
        )
    sys.path.insert(0, str(ROOT))
    for module in ("specchat.engine.session", "specchat.engine.static", "specchat.engine.exact"):
        try:
            importlib.import_module(module)
        except Exception as err:  # any import failure is the gate's answer, not a traceback
            problems.append(f"{module} cannot be imported: {type(err).__name__}: {err}")
    return problems


# ------------------------------------------------------------------------------- the report


@dataclass
class Report:
    out: Path
    deadline: float
    failed: int = 0
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "probe.jsonl").write_text("")
        (self.out / "summary.txt").write_text("")

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def say(self, line: str) -> None:
        print(f"probe: {line}", flush=True)
        with (self.out / "summary.txt").open("a") as handle:
            handle.write(line + "\n")

    def record(self, name: str, status: str, seconds: float, data: dict[str, Any]) -> None:
        with (self.out / "probe.jsonl").open("a") as handle:
            handle.write(
                json.dumps({"section": name, "status": status, "seconds": round(seconds, 2), **data}) + "\n"
            )

    def section(
        self, name: str, run: Callable[[], dict[str, Any]], needs_s: float = 5.0
    ) -> dict[str, Any] | None:
        """Run one section within the budget; a failure is recorded and the probe goes on."""
        left = self.time_left()
        if left < needs_s:
            self.say(f"SKIP {name}: {left:.0f} s left of the budget, it needs about {needs_s:.0f}")
            self.record(name, "skip", 0.0, {"reason": "out of time"})
            return None
        started = time.monotonic()
        try:
            data = run()
        except Exception as err:  # a guarded section: record it whole, keep going
            seconds = time.monotonic() - started
            self.failed += 1
            tail = traceback.format_exc().strip().splitlines()[-12:]
            self.say(
                f"FAIL {name} ({seconds:.1f} s): {type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"
            )
            self.record(
                name, "fail", seconds, {"error": f"{type(err).__name__}: {err}"[:2000], "traceback": tail}
            )
            return None
        finally:
            _free_device_memory()
        seconds = time.monotonic() - started
        status = str(data.pop("status", "ok"))
        self.failed += status == "fail"
        for line in data.pop("summary", []):
            self.say(f"{name}: {line}")
        self.say(f"{status.upper()} {name} ({seconds:.1f} s)")
        self.record(name, status, seconds, data)
        return data


def _free_device_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------ the models


@dataclass
class Probe:
    device: Any
    dtype: Any
    tiny: bool
    copy_gbps: float = 0.0
    models: dict[str, Any] = field(default_factory=dict)
    costs: dict[str, Any] = field(default_factory=dict)
    """Graphed costs per target shape, for the speed-ups the cost model predicts."""
    graphs_ok: bool = True
    """False when the preflight saw graph capture fail: later sections then decode eagerly."""
    exact_problem: str | None = None
    """Why exact mode is not run (the preflight saw its kernels fail), if so."""

    @property
    def light(self) -> bool:
        """On a CPU every section runs, on less work (exact mode runs in Triton's interpreter)."""
        return self.device.type == "cpu"

    @property
    def shapes(self) -> dict[str, dict[str, Any]]:
        return TINY_SHAPES if self.tiny else SHAPES

    def model(self, name: str) -> Any:
        """A random-weight Qwen2 of this shape on the device (built once, kept until dropped)."""
        if name not in self.models:
            self.models[name] = build_model(self.shapes[name], self.device, self.dtype, seed=len(self.models))
        return self.models[name]

    def drop(self, *names: str) -> None:
        for name in names:
            self.models.pop(name, None)
        _free_device_memory()

    def prompt(self, name: str, length: int = PROMPT_TOKENS) -> list[int]:
        """Random ids every model here can read (the 7B's vocabulary is wider than the draft's)."""
        import torch

        vocab = min(shape["vocab_size"] for shape in self.shapes.values())
        generator = torch.Generator().manual_seed(7)
        return [int(i) for i in torch.randint(3, vocab, (length,), generator=generator)]

    def sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def build_model(shape: dict[str, Any], device: Any, dtype: Any, seed: int) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**QWEN_COMMON, **shape, use_sliding_window=False, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    return model.to(dtype).eval()


def weight_bytes(model: Any) -> int:
    seen: set[int] = set()
    total = 0
    for param in model.parameters():
        if param.data_ptr() not in seen:
            seen.add(param.data_ptr())
            total += param.numel() * param.element_size()
    return total


class NullDetokenizer:
    """Random-weight models have no tokenizer: the probe counts tokens, it never shows text."""

    def __init__(self) -> None:
        from specchat.engine.reasoning import ReasoningMarker

        self.reasoning = ReasoningMarker()  # the decoders mark each token's text, here always ""

    def add(self, token_id: int) -> str:
        return ""

    def flush(self) -> str:
        return ""


GRAPHS_OK = [True]
"""Cleared when the preflight saw a capture fail (a failed capture can spoil the process's CUDA
context, so it is tried in a child process first)."""


def cached_lm(model: Any, kind: str) -> Any:
    """``dynamic`` (today's eager path), ``eager`` (static cache, no graphs) or ``graphs``."""
    from specchat.engine.kv import CachedLM
    from specchat.engine.static import StaticLM

    if kind == "dynamic":
        return CachedLM(model)
    return StaticLM(model, graphs=kind == "graphs" and model.device.type == "cuda" and GRAPHS_OK[0])


def decode(target: Any, draft: Any, prompt: list[int], gamma: int, tokens: int = SPEED_TOKENS) -> Any:
    """One greedy reply: plain when ``draft`` is None, else speculative at a fixed γ. Its summary."""
    from specchat.engine.baseline import plain_decode
    from specchat.engine.drafters import ModelDrafter
    from specchat.engine.events import SummaryEvent
    from specchat.engine.gamma import make_schedule
    from specchat.engine.sampling import SamplingParams
    from specchat.engine.speculative import RoundPlan, SpeculativeDecoder

    vocab = max(target.vocab_width, draft.vocab_width if draft is not None else 0)
    greedy = SamplingParams()
    if draft is None:
        events = list(
            plain_decode(
                target, NullDetokenizer(), prompt, sampling=greedy, max_new_tokens=tokens,  # type: ignore[arg-type]
                stop_ids=frozenset(), max_context=None,
            )
        )  # fmt: skip
    else:
        # Random weights are never sure of a token: the stop rule would end every draft after one.
        drafter = ModelDrafter(draft, vocab, stop_below=0.0)
        schedule = make_schedule("fixed", gamma)
        plan = RoundPlan(drafter, schedule, greedy)
        decoder = SpeculativeDecoder(target, lambda ids: NullDetokenizer(), frozenset(), None, vocab)  # type: ignore[arg-type,return-value]
        events = list(decoder.stream(prompt, plan=lambda: plan, max_new_tokens=tokens))
    summary = events[-1]
    assert isinstance(summary, SummaryEvent)
    ids = [e.token_id for e in events if hasattr(e, "token_id")]
    return summary, ids


def fmt_costs(costs: Any) -> str:
    v = " ".join(f"{costs.v(g):.2f}" for g in GAMMAS)
    c = f"{costs.c:.3f}" if costs.c is not None else "-"
    return f"target {costs.target_ms:.2f} ms, draft {costs.draft_ms or 0:.2f} ms, c={c}, v(1..8)= {v}"


# ------------------------------------------------------------------------------ sections


def section_environment(probe: Probe) -> dict[str, Any]:
    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("transformers", "triton", "bitsandbytes", "huggingface_hub", "tokenizers", "numpy"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    data: dict[str, Any] = {"versions": versions, "device": str(probe.device), "dtype": str(probe.dtype)}
    if probe.device.type == "cuda":
        props = torch.cuda.get_device_properties(probe.device)
        data["gpu"] = {"name": props.name, "sm": props.multi_processor_count, "memory_gib": props.total_memory / 2**30,
                       "capability": f"{props.major}.{props.minor}"}  # fmt: skip
    size = (64 if probe.tiny else 1024) * 2**20
    source = torch.empty(size // 2, dtype=torch.bfloat16, device=probe.device)
    target = torch.empty_like(source)
    for _ in range(3):
        target.copy_(source)
    seconds = timed(probe, lambda: target.copy_(source), repeats=10)
    probe.copy_gbps = 2 * size / seconds / 1e9
    data["copy_gbps_read_plus_write"] = round(probe.copy_gbps, 1)
    data["summary"] = [
        " ".join(f"{k} {v}" for k, v in versions.items()),
        f"{data.get('gpu', {}).get('name', probe.device)}: device copy {probe.copy_gbps:.0f} GB/s (read + write)",
        size_line(),
    ]
    return data


def timed(probe: Probe, work: Callable[[], Any], repeats: int) -> float:
    """Seconds per call of ``work``, by the device's clock on CUDA."""
    import torch

    if probe.device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            work()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0 / repeats
    began = time.perf_counter()
    for _ in range(repeats):
        work()
    return (time.perf_counter() - began) / repeats


def section_costs(probe: Probe, target_name: str, draft_name: str, kinds: tuple[str, ...]) -> dict[str, Any]:
    from specchat.bench.costs import measure_costs

    target, draft = probe.model(target_name), probe.model(draft_name)
    floor_ms = weight_bytes(target) / (probe.copy_gbps * 1e9) * 1000 if probe.copy_gbps else None
    ids = probe.prompt(target_name, PROMPT_TOKENS + max(GAMMAS) + 2)
    data: dict[str, Any] = {"target": target_name, "draft": draft_name, "weight_bytes": weight_bytes(target),
                            "floor_ms": floor_ms, "kinds": {}, "summary": []}  # fmt: skip
    for kind in kinds:
        t, d = cached_lm(target, kind), cached_lm(draft, kind)
        began = time.monotonic()
        costs = measure_costs(t, d, ids, GAMMAS, repeats=2 if probe.light else 5)
        entry = costs.to_json()
        entry["seconds"] = round(time.monotonic() - began, 2)
        entry["capture_s"] = round(getattr(t, "capture_s", 0.0) + getattr(d, "capture_s", 0.0), 2)
        entry["graph_error"] = getattr(t, "graph_error", None) or getattr(d, "graph_error", None)
        data["kinds"][kind] = entry
        if kind == "graphs":
            probe.costs[target_name] = costs
        floor = f", {costs.target_ms / floor_ms:.1f}x the floor {floor_ms:.2f} ms" if floor_ms else ""
        capture = f", capture {entry['capture_s']:.1f} s" if kind == "graphs" else ""
        error = f", GRAPHS OFF: {entry['graph_error']}" if entry["graph_error"] else ""
        data["summary"].append(
            f"{target_name}/{draft_name} {kind}: {fmt_costs(costs)}{floor}{capture}{error}"
        )
    return data


@contextmanager
def counted_syncs(probe: Probe) -> Iterator[Counter[str]]:
    """Synchronising calls: torch's sync debug mode on CUDA; on a CPU, reads of tensor values."""
    import torch

    counts: Counter[str] = Counter()
    if probe.device.type == "cuda":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield counts
            finally:
                torch.cuda.set_sync_debug_mode("default")
        for warning in caught:
            text = str(warning.message)
            # Only the syncs themselves: torch also warns once that the debug mode is a prototype.
            if "called a synchronizing CUDA operation" in text:
                counts["synchronizing CUDA operation"] += 1
        return
    from specchat.engine.timing import counted_host_reads

    with counted_host_reads() as reads:
        yield reads


def section_syncs(probe: Probe) -> dict[str, Any]:
    from specchat.engine.drafters import ModelDrafter
    from specchat.engine.gamma import make_schedule
    from specchat.engine.sampling import SamplingParams
    from specchat.engine.speculative import RoundPlan, SpeculativeDecoder

    target, draft = probe.model("1.5b"), probe.model("0.5b")
    prompt = probe.prompt("1.5b")
    data: dict[str, Any] = {"summary": []}
    for kind in ("dynamic", "graphs"):
        t, d = cached_lm(target, kind), cached_lm(draft, kind)
        vocab = max(t.vocab_width, d.vocab_width)
        plan = RoundPlan(ModelDrafter(d, vocab, stop_below=0.0), make_schedule("fixed", 4), SamplingParams())
        decoder = SpeculativeDecoder(t, lambda ids: NullDetokenizer(), frozenset(), None, vocab)  # type: ignore[arg-type,return-value]

        def fixed_plan(plan: RoundPlan = plan) -> RoundPlan:
            return plan

        generation = decoder.start(prompt, plan=fixed_plan, max_new_tokens=200)
        generation.step()  # the first round captures graphs and compiles: not counted
        rounds = 4 if probe.light else 8
        with counted_syncs(probe) as counts:
            for _ in range(rounds):
                generation.step()
        total = sum(counts.values())
        data[kind] = {"rounds": rounds, "syncs": total, "per_round": total / rounds, "kinds": dict(counts)}
        data["summary"].append(f"{kind}: {total / rounds:.1f} host syncs per round at γ=4 ({dict(counts)})")
    return data


def section_speed(
    probe: Probe, target_name: str, kind: str = "graphs", label: str = "fast", light: bool = False
) -> dict[str, Any]:
    """Plain against speculative tok/s (the 0.5B draft, and the target drafting for itself).

    Random weights make the 0.5B draft nearly always wrong (α ≈ 0: the floor of speculation) and
    the target drafting for itself always right where verify rows equal one-token rows (the
    ceiling, and the exactness check); the cost model's prediction for a real pair's α is added.
    """
    from specchat.engine.costs import predicted_speedup

    target = probe.model(target_name)
    prompt = probe.prompt(target_name)
    tokens = 3 if light else 12 if probe.light else SPEED_TOKENS
    gammas = SPEED_GAMMAS[:1] if light else SPEED_GAMMAS
    drafts = [("self", target)] if light else [("0.5b", probe.model("0.5b")), ("self", target)]
    warm = 0 if light else 4
    t = cached_lm(target, kind)
    if warm:
        decode(t, None, prompt, 0, warm)  # captures the plain width, compiles what exact mode compiles
    plain, plain_ids = decode(t, None, prompt, 0, tokens)
    data: dict[str, Any] = {
        "target": target_name,
        "mode": label,
        "plain_tok_s": plain.tokens_per_s,
        "runs": [],
    }
    lines = [f"{target_name} {label} plain {plain.tokens_per_s:.1f} tok/s"]
    for draft_label, model in drafts:
        d = cached_lm(model, kind)
        for gamma in gammas:
            if warm:
                decode(t, d, prompt, gamma, warm)  # this γ's widths
            summary, ids = decode(t, d, prompt, gamma, tokens)
            same = ids == plain_ids
            diverge = next((i for i, (a, b) in enumerate(zip(ids, plain_ids, strict=False)) if a != b), None)
            run = {"draft": draft_label, "gamma": gamma, "tok_s": summary.tokens_per_s, "alpha": summary.alpha,
                   "tau": summary.tau, "speedup": summary.tokens_per_s / plain.tokens_per_s, "greedy_equal": same,
                   "first_divergence": diverge}  # fmt: skip
            data["runs"].append(run)
            alpha = f"{summary.alpha:.3f}" if summary.alpha is not None else "-"
            lines.append(
                f"{target_name} {label} draft={draft_label} γ={gamma}: {summary.tokens_per_s:.1f} tok/s "
                f"({run['speedup']:.2f}x plain), α={alpha}, greedy = plain: "
                f"{'yes' if same else f'NO (from token {diverge})'}"
            )
    costs = probe.costs.get(target_name)
    if costs is not None and costs.c is not None and label == "fast":
        predicted = {
            f"alpha={a}": {str(g): round(predicted_speedup(a, g, costs.c, costs.v(g)), 3) for g in GAMMAS}
            for a in (0.6, 0.8)
        }
        data["predicted_speedup_0.5b_draft"] = predicted
        for a in (0.6, 0.8):
            best = max(GAMMAS, key=lambda g: predicted_speedup(a, g, costs.c, costs.v(g)))
            value = predicted_speedup(a, best, costs.c, costs.v(best))
            lines.append(
                f"{target_name}: the cost model predicts {value:.2f}x at α={a} with the 0.5B draft (γ={best})"
            )
    data["summary"] = lines
    return data


def section_rows(
    probe: Probe, target_name: str, kind: str = "graphs", label: str = "fast", widest: int = 9
) -> dict[str, Any]:
    """Verify-pass rows against one-token passes, bit for bit, at widths 2…9."""
    import torch

    target = probe.model(target_name)
    ids = probe.prompt(target_name, PROMPT_TOKENS + widest)
    context, tail = ids[:PROMPT_TOKENS], ids[PROMPT_TOKENS:]
    lm = cached_lm(target, kind)
    lm.logits_after(context, 1)
    singles = torch.stack([lm.logits_after(context + tail[: i + 1], 1)[0].float() for i in range(widest)])
    widths: dict[str, Any] = {}
    for width in range(2, widest + 1):
        rows = lm.logits_after(context + tail[:width], width).float()
        differ = (rows != singles[:width]).any(-1)
        argmax_differ = rows.argmax(-1) != singles[:width].argmax(-1)
        widths[str(width)] = {
            "rows_differ": int(differ.sum()),
            "argmax_differ": int(argmax_differ.sum()),
            "max_abs_diff": float((rows - singles[:width]).abs().max()),
        }
    differing = sum(w["rows_differ"] for w in widths.values())
    total = sum(range(2, widest + 1))
    worst = max(w["max_abs_diff"] for w in widths.values())
    flips = sum(w["argmax_differ"] for w in widths.values())
    line = (f"{target_name} {label}: {differing}/{total} verify rows differ from one-token passes "
            f"(max |Δlogit| {worst:.3g}, argmax changed in {flips})")  # fmt: skip
    return {"target": target_name, "mode": label, "widths": widths, "summary": [line]}


def section_stock_ops(probe: Probe) -> dict[str, Any]:
    """Which stock kernels change a row's bits with the number of rows (cuBLAS, softmax, norm, SDPA)."""
    import torch

    from specchat.kernels import invariant

    shape = probe.shapes["1.5b"]
    hidden, inter, vocab = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    g = torch.Generator(device=probe.device).manual_seed(0)
    x = torch.randn(9, hidden, device=probe.device, generator=g).to(probe.dtype)
    w = (torch.randn(inter, hidden, device=probe.device, generator=g) * 0.02).to(probe.dtype)
    logits = torch.randn(9, vocab, device=probe.device, generator=g) * 3
    norm = probe.model("1.5b").model.norm
    ops: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "matmul (torch)": lambda rows: torch.nn.functional.linear(rows, w),
        "rms_norm (transformers)": lambda rows: norm(rows),
        "softmax (torch)": lambda rows: torch.softmax(rows, -1),
    }
    inputs = {"matmul (torch)": x, "rms_norm (transformers)": x, "softmax (torch)": logits}
    if invariant.available() is None and probe.exact_problem is None:
        ops["matmul (invariant)"] = lambda rows: invariant.linear(rows, w)
        ops["softmax (invariant)"] = invariant.softmax
        inputs["matmul (invariant)"], inputs["softmax (invariant)"] = x, logits
    result: dict[str, Any] = {}
    lines = []
    for name, op in ops.items():
        rows = inputs[name]
        widest = op(rows)
        differ = [w for w in range(1, 9) if not torch.equal(op(rows[:w]), widest[:w])]
        result[name] = {"widths_differing_from_9": differ}
        lines.append(
            f"{name}: {'row-invariant at widths 1-9' if not differ else f'rows change at widths {differ}'}"
        )
    return {"ops": result, "summary": lines}


def section_exact(probe: Probe, target_name: str) -> dict[str, Any]:
    """Exact mode: the target and the draft on the batch-invariant kernels, then rows, α, speed."""
    from specchat.engine import sampling
    from specchat.engine.exact import use_exact_kernels

    if probe.exact_problem is not None:
        return {"status": "skip", "summary": [f"not run: {probe.exact_problem}"]}
    began = time.monotonic()
    # The target only: verification is what must be exact; a draft's numerics move α, not the text.
    counts = use_exact_kernels(probe.model(target_name))
    try:
        rows = section_rows(probe, target_name, label="exact", widest=3 if probe.light else 9)
        speed = section_speed(probe, target_name, label="exact", light=probe.light)
    finally:
        sampling.use_cuda_softmax(None)
        probe.drop(target_name)  # patched in place: later sections build a fresh one
    lines = [f"switched {counts}", *rows["summary"], *speed["summary"]]
    return {"switched": counts, "rows": rows, "speed": speed, "seconds_with_compile": time.monotonic() - began,
            "summary": lines}  # fmt: skip


COMPILE_BOX_S = 200.0
"""The compile section stops starting new compilations after this many seconds."""


def section_compile(probe: Probe, report: Report) -> dict[str, Any]:
    """torch.compile (inductor's fusion) inside specchat's own CUDA graphs: compile time and ms
    per step against the bandwidth floor, for the 1.5B target (widths 1 and 5) and the 0.5B draft.

    Time-boxed: each compilation starts only while the box and the run's budget have room.
    """
    import torch

    from specchat.bench.costs import time_pass
    from specchat.engine.static import StaticLM

    if probe.device.type != "cuda":
        return {"status": "skip", "summary": ["CUDA only (on a CPU inductor compiles C++ for minutes)"]}
    began = time.monotonic()
    data: dict[str, Any] = {"mode": "default", "runs": [], "summary": []}
    jobs = [("1.5b", 1), ("0.5b", 1), ("1.5b", 5)]
    lms: dict[str, tuple[Any, Any]] = {}
    for name, width in jobs:
        if time.monotonic() - began > COMPILE_BOX_S or report.time_left() < 60:
            data["summary"].append(f"{name} width {width}: not compiled (out of the time box)")
            continue
        model = probe.model(name)
        ids = probe.prompt(name, PROMPT_TOKENS + 8)
        context, new = ids[:PROMPT_TOKENS], ids[PROMPT_TOKENS : PROMPT_TOKENS + width]
        if name not in lms:
            graphs = GRAPHS_OK[0] and model.device.type == "cuda"
            plain = StaticLM(model, graphs=graphs)
            fused = StaticLM(model, graphs=graphs, compile_mode="default")
            for lm in (plain, fused):
                lm.logits_after(context, 1)
            lms[name] = (plain, fused)
        plain, fused = lms[name]
        started = time.monotonic()
        time_pass(fused, context, new)  # compiles, then captures this width
        compile_s = time.monotonic() - started
        time_pass(plain, context, new)
        difference = float(
            (
                fused.logits_after(context + new, width).float()
                - plain.logits_after(context + new, width).float()
            )
            .abs()
            .max()
        )
        ms = {}
        for label, lm in (("graphs", plain), ("compile+graphs", fused)):
            samples = sorted(time_pass(lm, context, new) for _ in range(10))
            ms[label] = samples[len(samples) // 2]
        floor_ms = weight_bytes(model) / (probe.copy_gbps * 1e9) * 1000 if probe.copy_gbps else float("nan")
        run = {"model": name, "width": width, "compile_s": round(compile_s, 1), "ms": ms, "floor_ms": floor_ms,
               "max_abs_logit_diff": difference, "graph_error": fused.graph_error}  # fmt: skip
        data["runs"].append(run)
        data["summary"].append(
            f"{name} width {width}: graphs {ms['graphs']:.2f} ms, compile+graphs {ms['compile+graphs']:.2f} ms "
            f"({ms['compile+graphs'] / floor_ms:.1f}x the floor {floor_ms:.2f} ms), compiled in {compile_s:.0f} s, "
            f"max |Δlogit| {difference:.3g}"
            + (f", GRAPHS OFF: {fused.graph_error}" if fused.graph_error else "")
        )
    steps = {(r["model"], r["width"]): r["ms"] for r in data["runs"]}
    if ("1.5b", 1) in steps and ("0.5b", 1) in steps:
        for label in ("graphs", "compile+graphs"):
            c = steps[("0.5b", 1)][label] / steps[("1.5b", 1)][label]
            data[f"c_{label}"] = c
            data["summary"].append(f"c (0.5B draft / 1.5B target step), {label}: {c:.3f}")
    torch.compiler.reset()
    return data


def quantize_4bit(model: Any) -> int:
    """Every linear layer but the head to bitsandbytes NF4 on the model's device (as --quant 4bit)."""
    import bitsandbytes as bnb
    import torch

    count = 0
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear or child_name == "lm_head":
                continue
            layer = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                      compute_dtype=torch.bfloat16 if child.weight.is_cuda else child.weight.dtype,
                                      compress_statistics=False, quant_type="nf4", device="meta")  # fmt: skip
            layer.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, compress_statistics=False,
                                             quant_type="nf4", module=layer)  # fmt: skip
            layer.weight._quantize(child.weight.device)
            if child.bias is not None:
                layer.bias = child.bias
            setattr(parent, child_name, layer)
            count += 1
    return count


def section_bnb4(probe: Probe) -> dict[str, Any]:
    """bitsandbytes 4-bit: batched verify (the new default) against today's one-row passes."""
    if importlib.util.find_spec("bitsandbytes") is None:
        return {
            "status": "skip",
            "summary": ["bitsandbytes is not installed: carry its wheel (docs/testing.md)"],
        }
    from specchat.bench.costs import measure_costs
    from specchat.models.compute.rows import compute_rows_alone

    target = build_model(probe.shapes["1.5b"], probe.device, probe.dtype, seed=11)
    layers = quantize_4bit(target)
    probe.models["1.5b-4bit"] = target
    draft = probe.model("0.5b")
    ids = probe.prompt("1.5b", PROMPT_TOKENS + max(GAMMAS) + 2)
    data: dict[str, Any] = {"layers": layers, "summary": [f"{layers} linear layers in NF4"]}
    for kind in ("graphs", "eager"):
        t, d = cached_lm(target, kind), cached_lm(draft, kind)
        costs = measure_costs(t, d, ids, GAMMAS, repeats=2 if probe.light else 5)
        error = getattr(t, "graph_error", None)
        data[f"batched_{kind}"] = {**costs.to_json(), "graph_error": error}
        off = f", GRAPHS OFF: {error}" if error else ""
        data["summary"].append(f"batched verify, static {kind}: {fmt_costs(costs)}{off}")
    # Rows: batched verify against one-token passes, on the quantized target.
    probe_rows = _rows_of(probe, target, "eager")
    data["rows_batched"] = probe_rows
    data["summary"].append(f"batched 4-bit verify rows differing from one-token passes: {probe_rows['rows_differ']}"
                           f"/{probe_rows['rows']} (argmax changed in {probe_rows['argmax_differ']})")  # fmt: skip
    tokens = 12 if probe.light else SPEED_TOKENS
    summary, _ = decode(
        cached_lm(target, "graphs"), cached_lm(draft, "graphs"), probe.prompt("1.5b"), 4, tokens
    )
    plain, _ = decode(cached_lm(target, "graphs"), None, probe.prompt("1.5b"), 0, tokens)
    data["speed"] = {
        "plain_tok_s": plain.tokens_per_s,
        "spec_tok_s": summary.tokens_per_s,
        "alpha": summary.alpha,
    }
    data["summary"].append(f"4-bit plain {plain.tokens_per_s:.1f} tok/s, speculative γ=4 with the 0.5B draft "
                           f"{summary.tokens_per_s:.1f} tok/s (random weights: α={summary.alpha})")  # fmt: skip
    compute_rows_alone(target)  # today's path: every verify row its own pass, on the dynamic cache
    costs = measure_costs(cached_lm(target, "dynamic"), None, ids, GAMMAS, repeats=2 if probe.light else 5)
    data["rows_alone_dynamic"] = costs.to_json()
    data["summary"].append(f"today's row-by-row verify (dynamic cache): {fmt_costs(costs)}")
    probe.drop("1.5b-4bit")
    return data


def _rows_of(probe: Probe, model: Any, kind: str) -> dict[str, int]:
    import torch

    ids = probe.prompt("1.5b", PROMPT_TOKENS + 9)
    context, tail = ids[:PROMPT_TOKENS], ids[PROMPT_TOKENS:]
    lm = cached_lm(model, kind)
    lm.logits_after(context, 1)
    singles = torch.stack([lm.logits_after(context + tail[: i + 1], 1)[0].float() for i in range(9)])
    differ = argmax = total = 0
    for width in range(2, 10):
        rows = lm.logits_after(context + tail[:width], width).float()
        differ += int((rows != singles[:width]).any(-1).sum())
        argmax += int((rows.argmax(-1) != singles[:width].argmax(-1)).sum())
        total += width
    return {"rows": total, "rows_differ": differ, "argmax_differ": argmax}


def preflight() -> dict[str, Any]:
    """In a child process: a graph capture on a tiny Qwen2, and each batch-invariant kernel once.

    Either can fail in ways that spoil a CUDA context for good (a capture that syncs, a kernel
    that reads out of bounds): the probe learns that here instead of losing every later section.
    """
    import torch

    from specchat.engine.static import StaticLM
    from specchat.kernels import invariant

    result: dict[str, Any] = {}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(
        TINY_SHAPES["1.5b"], device, torch.bfloat16 if device.type == "cuda" else torch.float32, 0
    )
    ids = list(range(3, 40))
    try:
        graphed, eager = StaticLM(model, graphs=device.type == "cuda"), StaticLM(model, graphs=False)
        worst = 0.0
        for lm in (graphed, eager):
            lm.logits_after(ids[:30], 1)
        for width in (1, 3, 5):
            a = graphed.logits_after(ids[: 30 + width], width).float()
            b = eager.logits_after(ids[: 30 + width], width).float()
            worst = max(worst, float((a - b).abs().max()))
        result["graphs"] = {"ok": graphed.graph_error is None and worst < 0.1, "error": graphed.graph_error,
                            "max_abs_diff_vs_eager": worst, "capture_s": graphed.capture_s}  # fmt: skip
    except Exception as err:  # reported, not raised: the exact check still runs
        result["graphs"] = {"ok": False, "error": f"{type(err).__name__}: {err}"[:500]}
    problem = invariant.available()
    if problem is not None:
        result["exact"] = {"ok": False, "available": False, "error": problem}
        return result
    try:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        x = torch.randn(5, 1536, device=device).to(dtype)
        w = (torch.randn(300, 1536, device=device) * 0.02).to(dtype)
        out = invariant.linear(x, w)
        linear_ok = torch.allclose(out.float(), x.float() @ w.float().T, atol=5e-2, rtol=5e-2)
        linear_rows = torch.equal(invariant.linear(x[:1], w), out[:1])
        logits = torch.randn(3, 151936 if device.type == "cuda" else 4096, device=device)
        soft_ok = torch.allclose(invariant.softmax(logits), torch.softmax(logits, -1), atol=1e-6)
        rms_ok = torch.allclose(
            invariant.rms_inverse(x, 1e-6),
            torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6),
            rtol=1e-3,
        )
        q = torch.randn(1, 4, 3, 64, device=device).to(dtype)
        k = torch.randn(1, 2, 128, 64, device=device).to(dtype)
        v = torch.randn(1, 2, 128, 64, device=device).to(dtype)
        pos = torch.arange(60, 63, device=device)
        mask = (torch.arange(128, device=device)[None, :] <= pos[:, None])[None, None]
        att = invariant.attention(q, k, v, mask, 0.125).float()
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.float(),
            k.float().repeat_interleave(2, 1),
            v.float().repeat_interleave(2, 1),
            attn_mask=mask,
            scale=0.125,
        ).transpose(1, 2)
        att_ok = torch.allclose(att, ref, atol=3e-2, rtol=3e-2)
        if device.type == "cuda":
            torch.cuda.synchronize()
        checks = {
            "linear": linear_ok,
            "linear_rows": linear_rows,
            "softmax": soft_ok,
            "rms": rms_ok,
            "attention": att_ok,
        }
        result["exact"] = {"ok": all(checks.values()), "checks": checks,
                           "error": None if all(checks.values()) else f"wrong results: {checks}"}  # fmt: skip
    except Exception as err:
        result["exact"] = {"ok": False, "error": f"{type(err).__name__}: {err}"[:500]}
    return result


def section_preflight(probe: Probe, report: Report) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, str(Path(__file__).resolve()), "--preflight"]
    try:
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env,
                                timeout=min(180.0, max(10.0, report.time_left() - 60)))  # fmt: skip
    except subprocess.TimeoutExpired:
        GRAPHS_OK[0] = False
        probe.exact_problem = "the preflight ran out of time"
        return {"status": "fail", "summary": ["out of time: graphs and exact mode turned off"]}
    found = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not found:
        GRAPHS_OK[0] = False
        probe.exact_problem = "the preflight died"
        tail = (result.stdout + result.stderr).strip().splitlines()[-8:]
        return {
            "status": "fail",
            "output": tail,
            "summary": ["the preflight died: graphs and exact mode off", *tail[-3:]],
        }
    data = json.loads(found[-1])
    GRAPHS_OK[0] = bool(data["graphs"]["ok"])
    probe.exact_problem = None if data["exact"]["ok"] else str(data["exact"]["error"])
    lines = [
        f"CUDA graphs: {'ok' if GRAPHS_OK[0] else 'OFF, ' + str(data['graphs'].get('error'))}",
        f"batch-invariant kernels: {'ok' if probe.exact_problem is None else 'OFF, ' + probe.exact_problem}",
    ]
    # Kernels that cannot run here (no Triton) are a fact to report, not a failure of the probe.
    exact_failed = probe.exact_problem is not None and data["exact"].get("available", True)
    status = "fail" if not GRAPHS_OK[0] or exact_failed else "ok"
    return {"status": status, **data, "summary": lines}


def section_tiny_tests(probe: Probe, report: Report) -> dict[str, Any]:
    """The GPU-marked tests that need none of the TUI's packages (the image lacks them)."""
    files = ["tests/engine/test_cuda_fast_path.py"]
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--noconftest",
        "-m",
        "gpu",
        *files,
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    try:
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env,
                                timeout=max(10.0, report.time_left() - 5))  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"status": "fail", "summary": ["out of time"]}
    tail = (result.stdout + result.stderr).strip().splitlines()[-15:]
    status = "ok" if result.returncode in (0, 5) else "fail"
    return {"status": status, "returncode": result.returncode, "output": tail, "summary": tail[-3:]}


# ------------------------------------------------------------------------------------ main


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--device", default=None, help="cuda (default when there is one) or cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes instead of 0.5/1.5/7B (CI, CPU)")
    parser.add_argument("--out", default=None, help="where results go (default: $OUT, else ./probe-out)")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the whole run")
    parser.add_argument("--only", default="", help="comma-separated section names to run (default: all)")
    parser.add_argument(
        "--size", action="store_true", help="print what would travel to a device machine, and exit"
    )
    parser.add_argument("--preflight", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = parse(argv)
    if args.size:
        print(f"probe: {size_line()}")
        return 0
    if args.preflight:
        sys.path.insert(0, str(ROOT))
        print(json.dumps(preflight()), flush=True)
        return 0
    device_name = args.device or ("cuda" if _cuda_available() else "cpu")
    if device_name == "cpu" and importlib.util.find_spec("triton") is not None:
        # Exact mode's kernels on a CPU: Triton's interpreter, chosen before Triton is imported.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    out = Path(args.out or os.environ.get("OUT") or "probe-out")
    report = Report(out, started + args.budget)
    problems = gate_problems()
    if problems:
        for problem in problems:
            report.say(f"GATE {problem}")
        report.record("gate", "fail", 0.0, {"problems": problems})
        return 2
    import torch

    device = torch.device(device_name)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    probe = Probe(device, dtype, tiny=args.tiny)
    only = {name.strip() for name in args.only.split(",") if name.strip()}
    graphs = ("dynamic", "eager", "graphs")
    sections: list[tuple[str, Callable[[], dict[str, Any]], float]] = [
        ("environment", lambda: section_environment(probe), 5),
        ("preflight", lambda: section_preflight(probe, report), 30),
        ("costs-1.5b", lambda: section_costs(probe, "1.5b", "0.5b", graphs), 20),
        ("syncs", lambda: section_syncs(probe), 10),
        ("speed-1.5b", lambda: section_speed(probe, "1.5b"), 20),
        ("rows-1.5b", lambda: section_rows(probe, "1.5b"), 5),
        ("costs-7b", lambda: section_costs(probe, "7b", "0.5b", ("eager", "graphs")), 30),
        ("speed-7b", lambda: section_speed(probe, "7b"), 30),
        ("rows-7b", lambda: section_rows(probe, "7b"), 10),
        ("bnb-4bit", lambda: section_bnb4(probe), 40),
        # Last of the device work: Triton kernels of our own, the likeliest to fail.
        ("stock-ops", lambda: section_stock_ops(probe), 5),
        ("exact-1.5b", lambda: section_exact(probe, "1.5b"), 60),
        ("compile-1.5b", lambda: section_compile(probe, report), 90),
        ("tiny-tests", lambda: section_tiny_tests(probe, report), 20),
    ]
    for name, run, needs in sections:
        if only and name not in only:
            continue
        report.section(name, run, needs)
        if name == "rows-7b":
            probe.drop("7b")
    report.say(
        f"done in {time.monotonic() - started:.0f} s, {report.failed} section(s) failed; results in {out}"
    )
    return 1 if report.failed else 0


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
