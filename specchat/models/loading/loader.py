"""load_pair / load_for_decoding: from the names the user typed to a pair ready to decode.

One model's loading is :mod:`specchat.models.loading.hf`; the packed CPU path is
:mod:`specchat.models.compute.packed`.
"""

from __future__ import annotations

import os
import time
from typing import Protocol

import torch
from transformers import PreTrainedTokenizerBase

from specchat.errors import InvalidSettingError
from specchat.models.compute.cpu_quant import CpuPath
from specchat.models.compute.quant import check_quant
from specchat.models.errors_util import as_load_error, memory_guard
from specchat.models.loading.compat import check_tokenizers_compatible, tokenizer_difference
from specchat.models.loading.device import resolve_device
from specchat.models.loading.hf import load_model
from specchat.models.records import (
    DecodingPair,
    LoadedModel,
    LoadProgress,
    ProgressCallback,
    emit,
    notice,
)


def load_pair(
    target: str,
    draft: str | None,
    *,
    device: str = "auto",
    dtype: str = "auto",
    quant: str | None = None,
    progress: ProgressCallback | None = None,
    draft_optional: bool = False,
) -> tuple[LoadedModel, LoadedModel | None]:
    """Target (quantized if asked) then draft (never quantized: it is small), checked to share tokens.

    ``draft_optional``: the draft is a default the user did not choose, so one that cannot draft
    for this target is dropped with a notice instead of stopping the start."""
    check_quant(quant)
    target_lm = load_model(target, device=device, dtype=dtype, quant=quant, progress=progress)
    if draft is None:
        return target_lm, None
    draft_lm = load_model(draft, device=device, dtype=dtype, quant=None, progress=progress)
    if not _draft_fits(target_lm, draft_lm, draft_optional, progress):
        return target_lm, None
    return target_lm, draft_lm


class _Named(Protocol):
    """A loaded model as the tokenizer check sees it (a LoadedModel or a packed NativeModel)."""

    @property
    def name(self) -> str: ...
    @property
    def tokenizer(self) -> PreTrainedTokenizerBase: ...


def _draft_fits(target: _Named, draft: _Named, optional: bool, progress: ProgressCallback | None) -> bool:
    """Whether ``draft`` shares ``target``'s tokens; a mismatch raises unless the draft is optional."""
    if draft.tokenizer is target.tokenizer:
        return True
    if not optional:
        check_tokenizers_compatible(
            target.tokenizer, draft.tokenizer, target_name=target.name, draft_name=draft.name
        )
        return True
    problem = tokenizer_difference(target.tokenizer, draft.tokenizer)
    if problem is None:
        return True
    notice(
        progress,
        draft.name,
        f"the default draft {draft.name} cannot draft for {target.name}: {problem}; drafting without "
        f"a draft model (pass --draft with a small model of {target.name}'s family to use one)",
    )
    return False


def load_for_decoding(
    target: str,
    draft: str | None,
    *,
    device: str = "auto",
    dtype: str = "auto",
    quant: str | None = None,
    cpu_path: str = "none",
    progress: ProgressCallback | None = None,
    draft_optional: bool = False,
) -> DecodingPair:
    """:func:`load_pair` (``draft_optional`` as there), then the CPU kernels ``cpu_path`` names.

    ``auto`` picks the bench's fastest exact path on a CPU and leaves GPU and bitsandbytes models
    alone. Verification stays exact on every path: the target's rows are computed as a one-token
    pass computes them, so speculation reproduces plain decoding on the same kernels.
    """
    from specchat.models.compute.cpu_quant import parse_cpu_path, prepare_cpu_pair

    chosen = choose_cpu_path(cpu_path, device, quant, progress)  # a typo fails before any loading
    if chosen is not None and chosen.native:
        return _load_native_pair(target, draft, chosen, progress, draft_optional)
    cpu_path = str(chosen) if chosen is not None else cpu_path
    target_lm, draft_lm = load_pair(
        target, draft, device=device, dtype=dtype, quant=quant, progress=progress,
        draft_optional=draft_optional,
    )  # fmt: skip
    started = time.monotonic()
    label = "CPU kernels"
    # Say nothing where nothing happens: GPUs, bitsandbytes models, or the stock layers asked for.
    packing = target_lm.quant is None and str(parse_cpu_path(cpu_path, target_lm.device)) != "none"
    if packing:
        emit(progress, LoadProgress(label, "kernels", 0, 1, f"preparing CPU kernels ({cpu_path})"))
    with (
        memory_guard(target_lm.name, target_lm.device),
        as_load_error(f"cannot prepare CPU kernels {cpu_path!r}"),
    ):
        pair = prepare_cpu_pair(
            target_lm.model,
            draft_lm.model if draft_lm else None,
            cpu_path,
            # A progress callback may raise to abandon loading: let it between packing jobs.
            between_jobs=lambda: emit(progress, LoadProgress(label, "kernels", 0, 1, "packing CPU kernels")),
        )
    if packing:
        seconds = time.monotonic() - started
        emit(progress, LoadProgress(label, "ready", 1, 1, f"CPU kernels: {pair.path} ({seconds:.1f} s)"))
    return DecodingPair(
        target=pair.target,
        draft=pair.draft,
        tokenizer=target_lm.tokenizer,
        target_name=target_lm.name,
        draft_name=draft_lm.name if draft_lm else None,
        device=target_lm.device,
        kernels=pair.path if target_lm.quant is None else quant_label(target_lm.quant, target_lm.device),
    )


def quant_label(quant: str, device: torch.device) -> str:
    """What the kernels line says about a bitsandbytes target: batched verify on CUDA is not
    bit-exact against one-token passes (measured, not promised); on a CPU every row is."""
    if device.type == "cuda":
        return f"bitsandbytes {quant}, batched verify (rows measured, not bit-exact)"
    return f"bitsandbytes {quant}"


def choose_cpu_path(
    cpu_path: str, device: str, quant: str | None, progress: ProgressCallback | None
) -> CpuPath | None:
    """The CPU path to apply (None: GPUs and bitsandbytes models keep their layers).

    A path on specchat's own kernels builds them first (once, into the cache). ``auto`` always
    takes them: the fastest variant this CPU runs, or the slow scalar one with a notice saying
    why. Where no variant can be built or loaded (no compiler, an unsupported system) the start
    fails in one line naming the fix; the fbgemm int8 path runs only when asked for by name.
    """
    from specchat.kernels import KernelsUnavailable, is_built, load, slow_reason, variant
    from specchat.models.compute.cpu_quant import parse_cpu_path

    parse_cpu_path(cpu_path)
    torch_device = resolve_device(device)
    if quant is not None or torch_device.type != "cpu":
        return None
    chosen = parse_cpu_path(cpu_path, torch_device)
    if not chosen.native:
        return chosen
    try:
        which = f"specchat's CPU kernels ({variant()})"  # the instruction set they run on
        slow = slow_reason()
        if slow is not None:
            # A notice, not a progress step: it stays on screen, as the slowdown does.
            notice(progress, "CPU kernels", f"{slow}: running the portable scalar kernels, about 10× slower")
        doing = f"loading {which}" if is_built() else f"building {which}, once"
        emit(progress, LoadProgress("CPU kernels", "kernels", 0, 1, doing))
        load(lambda message: notice(progress, "CPU kernels", message))
    except KernelsUnavailable as err:
        raise InvalidSettingError(kernels_unavailable_line(cpu_path, err)) from err
    return chosen


def kernels_unavailable_line(cpu_path: str, err: Exception) -> str:
    """One line: why the kernels cannot run, and what the user can do instead."""
    from specchat.kernels import ISA_ENV
    from specchat.models.compute.cpu_quant import FALLBACK_CPU_PATH

    if os.environ.get(ISA_ENV, "").strip():
        return f"{err}."  # the user named an instruction set: running another would mislead them
    asked = "" if cpu_path.strip().lower() == "auto" else f"--cpu-path {cpu_path} needs them: "
    return (
        f"specchat's CPU kernels cannot run here: {err}; {asked}--cpu-path {FALLBACK_CPU_PATH} runs "
        "without them on x86-64 (slower, and it first writes an fp32 copy of the target, about "
        "11 GB for the default pair)."
    )


def _load_native_pair(
    target: str, draft: str | None, path: CpuPath, progress: ProgressCallback | None, draft_optional: bool
) -> DecodingPair:
    """Both models on specchat's kernels, packed once into the cache and memory-mapped from there."""
    from specchat.models.compute.packed import load_native
    from specchat.models.compute.packed_cache import PackRecipe

    started = time.monotonic()
    loaded = load_native(target, PackRecipe(path.target), progress)
    draft_loaded = None
    if draft is not None:
        # The whole head is packed; passes compute its first draft_head rows unless the drafter
        # asks for more (text in a language whose tokens lie past them).
        draft_loaded = load_native(draft, PackRecipe(path.draft), progress, share_tokenizer=loaded)
        draft_loaded.model.narrow_head = path.draft_head
        if not _draft_fits(loaded, draft_loaded, draft_optional, progress):
            draft_loaded = None
    seconds = time.monotonic() - started
    emit(progress, LoadProgress("CPU kernels", "ready", 1, 1, f"CPU kernels: {path} ({seconds:.1f} s)"))
    return DecodingPair(
        target=loaded.model,
        draft=draft_loaded.model if draft_loaded else None,
        tokenizer=loaded.tokenizer,
        target_name=loaded.name,
        draft_name=draft_loaded.name if draft_loaded else None,
        device=torch.device("cpu"),
        kernels=str(path),
    )
