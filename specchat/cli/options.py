"""Options several commands share, and how flags become settings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from specchat.config import Settings, load_settings
from specchat.engine.gamma import GAMMA_CHANGE, GAMMA_USE, SCHEDULES
from specchat.engine.registry import DRAFTER_NAMES, DRAFTERS
from specchat.params import DRAFT_WINDOW, GAMMA_MAX

F = TypeVar("F", bound=Callable[..., Any])


_OPTIONS: dict[str, Callable[[Any], Any]] = {
    "target": click.option("--target", help="Target model: packaged name, HF folder, .gguf file or hub id."),
    "draft": click.option(
        "--draft", help="Draft model sharing the target's tokenizer (same forms as --target)."
    ),
    "drafter": click.option(
        "--drafter",
        type=click.Choice(DRAFTER_NAMES),
        help="Who proposes tokens: " + "; ".join(f"{spec.name} ({spec.summary})" for spec in DRAFTERS) + ".",
    ),
    "gamma": click.option(
        "--gamma",
        type=int,
        help=f"γ, tokens drafted per round (1–{GAMMA_MAX}), as the schedule uses it: "
        + "; ".join(f"{GAMMA_USE[name]}, and {GAMMA_CHANGE[name]}" for name in SCHEDULES)
        + ".",
    ),
    "schedule": click.option(
        "--gamma-schedule",
        "schedule",
        type=click.Choice(SCHEDULES),
        help="γ schedule: fixed, heuristic (+2 / −1), adaptive (maximises measured speed).",
    ),
    "temperature": click.option(
        "--temperature", type=float, help="0 = greedy (verification by exact match)."
    ),
    "top_k": click.option("--top-k", type=int, help="Keep the k most likely tokens."),
    "top_p": click.option("--top-p", type=float, help="Nucleus sampling mass in (0, 1]."),
    "seed": click.option("--seed", type=int, help="Random seed for sampling."),
    "max_new_tokens": click.option("--max-new-tokens", type=int, help="Most tokens to generate per reply."),
    "draft_window": click.option(
        "--draft-window",
        type=int,
        help=f"A draft model far behind (a long prompt) reads only the last this many tokens where "
        f"reading them all would not pay (default {DRAFT_WINDOW}; 0: always all).",
    ),
    "system_prompt": click.option("--system", "system_prompt", help="System prompt."),
    "quant": click.option(
        "--quant", type=click.Choice(["4bit", "8bit"]), help="Quantize the target (bitsandbytes)."
    ),
    "cpu_path": click.option(
        "--cpu-path",
        help="CPU kernels (default auto): auto runs specchat's own kernels (gguf/q4+head32768: "
        "the target on its GGUF blocks, a 4-bit draft) on AVX-512, AVX2 or ARM64 NEON, the slow "
        "scalar build elsewhere (SPECCHAT_CPU_ISA=avx512|avx2|neon|scalar forces one), and none on "
        "a GPU or under bitsandbytes quantization; none is stock fp32; int8/dyn8+head32768 is "
        "fbgemm's int8 (x86-64, for a machine without a compiler); or TARGET/DRAFT[+headN].",
    ),
    "device": click.option("--device", help="auto, cpu, cuda or cuda:N."),
    "dtype": click.option("--dtype", help="auto, float32, bfloat16 or float16."),
    "server": click.option(
        "--server",
        metavar="URL",
        help="Attach to an OpenAI-compatible server (llama-server, vLLM, …) instead of loading "
        "models; the API key comes from SPECCHAT_API_KEY.",
    ),
}
"""Every shared option by the setting it sets, in the order --help lists them (None when not
given: the settings file or SPECCHAT_* decides)."""
LOADING_OPTIONS = ("target", "draft", "quant", "cpu_path", "device", "dtype", "server")
"""What loads (or which server answers): every command that opens a backend takes these."""
SAMPLING_OPTIONS = ("temperature", "top_k", "top_p", "seed", "max_new_tokens")


def _shared(names: tuple[str, ...]) -> Callable[[F], F]:
    def decorate(func: F) -> F:
        for name in reversed([n for n in _OPTIONS if n in names]):
            func = _OPTIONS[name](func)
        return func

    return decorate


model_options = _shared(tuple(_OPTIONS))
"""Every shared option: chat, generate, race and selftest."""
loading_options = _shared(LOADING_OPTIONS)
"""The models, their kernels and the server (the bench, which runs every drafter itself)."""
sampling_options = _shared(SAMPLING_OPTIONS)
draft_window_option = _shared(("draft_window",))


_PROMPT_OPTIONS: tuple[Callable[[Any], Any], ...] = (
    click.option(
        "--thinking/--no-thinking",
        "thinking",
        default=None,
        help="Let a thinking model reason before it answers (default), or ask its chat template "
        "not to (Qwen3's enable_thinking; models whose template has no such switch think as they do).",
    ),
    click.option(
        "--raw/--no-raw",
        "raw",
        default=None,
        help="Feed the text exactly as given: no chat template, no system prompt, BOS as the "
        "model's file says (base models; as llama-server's /completion).",
    ),
)


def prompt_options(func: F) -> F:
    """How the conversation becomes the prompt (chat and generate)."""
    for option in reversed(_PROMPT_OPTIONS):
        func = option(func)
    return func


def debug_option(func: F) -> F:
    def enable(ctx: click.Context, param: click.Parameter, value: bool) -> None:
        if value:
            from specchat import logs

            logs.set_debug(True)

    return click.option(
        "--debug",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=enable,
        help="Also print the traceback of an unexpected error (it is always in the log file).",
    )(func)


def settings_from(options: dict[str, Any]) -> Settings:
    return load_settings({k: v for k, v in options.items() if v is not None})
