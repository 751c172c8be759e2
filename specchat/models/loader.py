"""load_model / load_pair: from a name the user typed to a model ready to decode."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from specchat.errors import InvalidSettingError, ModelLoadError, ModelNotFoundError
from specchat.models.assemble import packaged_gguf
from specchat.models.cache import CONVERTED_MARKER, MISSING, CacheError
from specchat.models.compat import check_tokenizers_compatible
from specchat.models.convert import convert, converted_folder, converted_problem, file_key, sync_eos_ids
from specchat.models.cpu_quant import CpuPath
from specchat.models.device import resolve_device, resolve_dtype
from specchat.models.errors_util import as_load_error, memory_guard, quiet_library_bars
from specchat.models.hub import hub_folder
from specchat.models.quant import check_quant, quant_config, quant_note
from specchat.models.records import (
    DecodingPair,
    LoadedModel,
    LoadProgress,
    ProgressCallback,
    Stage,
    Waiter,
    emit,
    notice,
)
from specchat.models.registry import PACKAGED, PackagedModel
from specchat.models.resolve import Resolved, resolve_spec
from specchat.models.rows import compute_rows_alone
from specchat.models.store import entry_lock, set_doing, sweep_partials

if TYPE_CHECKING:
    # Types only: transformers' modeling code costs seconds to import, and the packed CPU path
    # never needs it.
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def load_model(
    spec: str,
    *,
    device: str = "auto",
    dtype: str = "auto",
    quant: str | None = None,
    progress: ProgressCallback | None = None,
) -> LoadedModel:
    """Load a packaged name, a folder, a .gguf file, a converted-cache name or a hub id."""
    started = time.monotonic()
    # Settings first: a typo should fail in milliseconds, not after a minute of conversion.
    quant = check_quant(quant)
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    resolved = resolve_spec(spec)
    with local_folder(resolved, progress) as folder:
        model, tokenizer = _load_folder(folder, resolved.name, torch_device, torch_dtype, quant, progress)
    sync_eos_ids(model, tokenizer, from_gguf=resolved.kind in {"packaged", "gguf", "cached"})
    if quant is not None:
        # bitsandbytes' kernels compute a row differently in a batch: keep verification exact.
        compute_rows_alone(model)
    source = resolved.location if resolved.kind == "hub" else str(folder)
    seconds = time.monotonic() - started
    message = f"{resolved.name} ready on {torch_device} ({_dtype_name(torch_dtype)}, {seconds:.1f} s)"
    emit(progress, LoadProgress(resolved.name, "ready", 1, 1, message))
    return LoadedModel(resolved.name, model, tokenizer, source, torch_device, torch_dtype, quant)


def load_pair(
    target: str,
    draft: str | None,
    *,
    device: str = "auto",
    dtype: str = "auto",
    quant: str | None = None,
    progress: ProgressCallback | None = None,
) -> tuple[LoadedModel, LoadedModel | None]:
    """Target (quantized if asked) then draft (never quantized: it is small), checked to share tokens."""
    check_quant(quant)
    target_lm = load_model(target, device=device, dtype=dtype, quant=quant, progress=progress)
    if draft is None:
        return target_lm, None
    draft_lm = load_model(draft, device=device, dtype=dtype, quant=None, progress=progress)
    check_tokenizers_compatible(
        target_lm.tokenizer, draft_lm.tokenizer, target_name=target_lm.name, draft_name=draft_lm.name
    )
    return target_lm, draft_lm


def load_for_decoding(
    target: str,
    draft: str | None,
    *,
    device: str = "auto",
    dtype: str = "auto",
    quant: str | None = None,
    cpu_path: str = "none",
    progress: ProgressCallback | None = None,
) -> DecodingPair:
    """:func:`load_pair`, then the CPU kernels ``cpu_path`` names (chat and generate use this).

    ``auto`` picks the bench's fastest exact path on a CPU and leaves GPU and bitsandbytes models
    alone. Verification stays exact on every path: the target's rows are computed as a one-token
    pass computes them, so speculation reproduces plain decoding on the same kernels.
    """
    from specchat.models.cpu_quant import parse_cpu_path, prepare_cpu_pair

    chosen = choose_cpu_path(cpu_path, device, quant, progress)  # a typo fails before any loading
    if chosen is not None and chosen.native:
        return _load_native_pair(target, draft, chosen, progress)
    cpu_path = str(chosen) if chosen is not None else cpu_path
    target_lm, draft_lm = load_pair(target, draft, device=device, dtype=dtype, quant=quant, progress=progress)
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
        kernels=pair.path if target_lm.quant is None else f"bitsandbytes {target_lm.quant}",
    )


def choose_cpu_path(
    cpu_path: str, device: str, quant: str | None, progress: ProgressCallback | None
) -> CpuPath | None:
    """The CPU path to apply (None: GPUs and bitsandbytes models keep their layers).

    A path on specchat's own kernels builds them first (once, into the cache); where they cannot
    run, ``auto`` falls back to the fbgemm path with a note, and an explicit path fails saying why.
    """
    from specchat.kernels import KernelsUnavailable, is_built, load, variant
    from specchat.models.cpu_quant import FALLBACK_CPU_PATH, parse_cpu_path

    parse_cpu_path(cpu_path)
    torch_device = resolve_device(device)
    if quant is not None or torch_device.type != "cpu":
        return None
    chosen = parse_cpu_path(cpu_path, torch_device)
    if not chosen.native:
        return chosen
    try:
        which = f"specchat's CPU kernels ({variant()})"  # the instruction set they run on
        doing = f"loading {which}" if is_built() else f"building {which}, once"
        emit(progress, LoadProgress("CPU kernels", "kernels", 0, 1, doing))
        load(lambda message: notice(progress, "CPU kernels", message))
    except KernelsUnavailable as err:
        if cpu_path.strip().lower() != "auto":
            raise InvalidSettingError(
                f"--cpu-path {cpu_path} needs specchat's CPU kernels, which cannot run here: {err}; "
                f"use --cpu-path {FALLBACK_CPU_PATH}."
            ) from err
        # A notice, not a progress step: the int8 path is several times slower, and a progress
        # line is gone from the screen the moment the next step replaces it.
        message = f"specchat's CPU kernels cannot run here ({err}): using the slower {FALLBACK_CPU_PATH}"
        notice(progress, "CPU kernels", message)
        return parse_cpu_path(FALLBACK_CPU_PATH)
    return chosen


def _load_native_pair(
    target: str, draft: str | None, path: CpuPath, progress: ProgressCallback | None
) -> DecodingPair:
    """Both models on specchat's kernels, packed once into the cache and memory-mapped from there."""
    from specchat.models.packed import PackRecipe, load_native

    started = time.monotonic()
    loaded = load_native(target, PackRecipe(path.target), progress)
    draft_loaded = None
    if draft is not None:
        # The whole head is packed; passes compute its first draft_head rows unless the drafter
        # asks for more (text in a language whose tokens lie past them).
        draft_loaded = load_native(draft, PackRecipe(path.draft), progress, share_tokenizer=loaded)
        draft_loaded.model.narrow_head = path.draft_head
        if draft_loaded.tokenizer is not loaded.tokenizer:
            check_tokenizers_compatible(
                loaded.tokenizer,
                draft_loaded.tokenizer,
                target_name=loaded.name,
                draft_name=draft_loaded.name,
            )
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


@contextlib.contextmanager
def local_folder(resolved: Resolved, progress: ProgressCallback | None = None) -> Iterator[Path]:
    """A Hugging Face format folder for `resolved`, assembling and converting GGUF on first use.

    A cache entry is checked (cheaply) on every start, rebuilt if damaged, and stays locked until
    the caller has read it, so another specchat never converts it twice nor clears it mid-load.
    """
    if resolved.kind == "hub":
        yield hub_folder(resolved.location, progress)
        return
    if resolved.kind == "folder":
        yield Path(resolved.location)
        return
    sweep_partials(lambda message: notice(progress, resolved.name, message))
    plan = conversion_plan(resolved)
    with _locked_for_reading(plan, progress):
        problem = converted_problem(plan.dest)
        if problem is not None:
            _rebuild(plan, problem, progress)
        yield plan.dest


def hf_folder(resolved: Resolved, progress: ProgressCallback | None = None) -> Path:
    """:func:`local_folder`, released at once: for callers that only need the path."""
    with local_folder(resolved, progress) as folder:
        return folder


@dataclass(frozen=True)
class ConversionPlan:
    """Where a GGUF model's conversion lives, and how to (re)make it."""

    name: str
    dest: Path
    origin: str
    """Recorded in the conversion: `packaged:<name>` or the GGUF's path."""
    packaged: PackagedModel | None = None
    gguf: Path | None = None
    """The user's GGUF file; None for packaged models, and when it is gone."""

    @property
    def source(self) -> str:
        return "the verified chunks" if self.packaged is not None else str(self.gguf)


def conversion_plan(resolved: Resolved) -> ConversionPlan:
    if resolved.kind == "packaged":
        assert resolved.packaged is not None
        model = resolved.packaged
        dest = converted_folder(model.name, model.key)
        return ConversionPlan(model.name, dest, f"packaged:{model.name}", packaged=model)
    if resolved.kind == "gguf":
        gguf = Path(resolved.location)
        dest = converted_folder(resolved.name, file_key(gguf))
        return ConversionPlan(resolved.name, dest, str(gguf), gguf=gguf)
    return _plan_for_cached(resolved)


def _plan_for_cached(resolved: Resolved) -> ConversionPlan:
    """A conversion named directly (as `specchat models` lists it): rebuildable while its GGUF is
    still the file it was made from."""
    dest = Path(resolved.location)
    origin = str(_read_origin(dest))
    packaged = PACKAGED.get(origin.removeprefix("packaged:")) if origin.startswith("packaged:") else None
    if packaged is not None and converted_folder(packaged.name, packaged.key) == dest:
        return ConversionPlan(resolved.name, dest, origin, packaged=packaged)
    gguf = Path(origin)
    if origin and gguf.is_file() and converted_folder(gguf.stem, file_key(gguf)) == dest:
        return ConversionPlan(resolved.name, dest, origin, gguf=gguf)
    return ConversionPlan(resolved.name, dest, origin)


def _read_origin(dest: Path) -> object:
    try:
        meta = json.loads((dest / CONVERTED_MARKER).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return ""
    return meta.get("origin", "") if isinstance(meta, dict) else ""


@contextlib.contextmanager
def _locked_for_reading(plan: ConversionPlan, progress: ProgressCallback | None) -> Iterator[None]:
    waiter = Waiter(plan.name, progress)
    with contextlib.ExitStack() as stack:
        try:
            lock = entry_lock(
                plan.dest, f"loading {plan.name}", notify=waiter.notify, heartbeat=waiter.heartbeat
            )
            stack.enter_context(lock)
        except CacheError:
            # A cache this process may not write to (read-only, shared) is fine if it has it all.
            if converted_problem(plan.dest) is not None:
                raise
        yield


def _rebuild(plan: ConversionPlan, problem: str, progress: ProgressCallback | None) -> None:
    """Convert for the first time (`problem` is MISSING), or again, saying why."""
    if plan.packaged is None and plan.gguf is None:
        if problem == MISSING:  # cleared since it was resolved
            raise ModelNotFoundError(f"{plan.name} is no longer in the model cache; run `specchat models`")
        raise ModelLoadError(
            f"the cached conversion {plan.name} is damaged ({problem}) and the GGUF it was made from "
            f"({plan.origin or 'unknown'}) is gone or has changed; remove it with "
            f"`specchat models --clear {plan.name}` and load the GGUF file again"
        )
    if problem != MISSING:
        notice(
            progress,
            plan.name,
            f"the cached conversion of {plan.name} is damaged ({problem}); rebuilding it from {plan.source}",
        )
    set_doing(plan.dest, f"converting {plan.name}")
    if plan.packaged is not None:
        waiter = Waiter(plan.name, progress)
        gguf = packaged_gguf(plan.packaged, progress, verify=True, wait=waiter)
    else:
        assert plan.gguf is not None
        gguf = plan.gguf
    convert(gguf, plan.dest, name=plan.name, origin=plan.origin, progress=progress)


def _load_folder(
    folder: Path,
    name: str,
    device: torch.device,
    dtype: torch.dtype,
    quant: str | None,
    progress: ProgressCallback | None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    kwargs: dict[str, Any] = {"dtype": dtype}
    if quant is not None:
        kwargs["quantization_config"] = quant_config(quant, device, dtype)
    if quant is not None or device.type == "cuda":
        # Straight onto the device, and bitsandbytes quantizes while placing: no full copy in host RAM.
        kwargs["device_map"] = {"": device}
    stage: Stage = "quantize" if quant else "load"
    verb = f"loading {name} and quantizing it to {quant}" if quant else f"loading {name}"
    note = quant_note(device) if quant else ""
    emit(progress, LoadProgress(name, stage, 0, 1, f"{verb} on {device}{note}"))
    with (
        memory_guard(name, device),
        as_load_error(f"cannot load {name} from {folder}"),
        quiet_library_bars(progress is not None),
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(str(folder), **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        if "device_map" not in kwargs:
            model.to(device)  # type: ignore[arg-type]  # transformers' typed wrapper of Module.to
    model.eval()
    emit(progress, LoadProgress(name, stage, 1, 1, f"{verb} on {device}: done"))
    return model, tokenizer


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
