"""Loading a Hugging Face model from a name the user typed: a packaged GGUF, a folder, a .gguf
file, a converted-cache name or a hub id, converted once into the cache where needed.

Below both the loader (which builds the decoding pair) and the packed cache (which packs a
float model for specchat's kernels), so neither imports the other.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from specchat.errors import ModelLoadError, ModelNotFoundError
from specchat.models.cache.paths import CONVERTED_MARKER, MISSING, CacheError
from specchat.models.cache.writes import entry_lock, set_doing, sweep_partials
from specchat.models.compute.quant import check_quant, quant_config, quant_note
from specchat.models.compute.rows import compute_rows_alone
from specchat.models.errors_util import as_load_error, memory_guard, quiet_library_bars
from specchat.models.gguf.convert import convert, converted_folder, converted_problem, file_key, sync_eos_ids
from specchat.models.loading.device import resolve_device, resolve_dtype
from specchat.models.names.assemble import packaged_gguf
from specchat.models.names.catalog import PACKAGED, PackagedModel
from specchat.models.names.hub import hub_folder
from specchat.models.names.resolve import Resolved, display_name, resolve_spec
from specchat.models.records import (
    LoadedModel,
    LoadProgress,
    ProgressCallback,
    Stage,
    Waiter,
    emit,
    notice,
)

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
    if quant is not None and torch_device.type != "cuda":
        # bitsandbytes' kernels compute a row differently in a batch: keep verification exact on
        # a CPU, where a one-row pass per verify row costs what it saves. On CUDA a verify pass
        # stays batched (one weight stream for γ+1 rows, so speculation can pay): its rows may
        # differ from one-token rows by rounding, which the pair's label says and the device
        # probe measures (see specchat.models.compute.quant).
        compute_rows_alone(model)
    source = resolved.location if resolved.kind == "hub" else str(folder)
    seconds = time.monotonic() - started
    message = f"{resolved.name} ready on {torch_device} ({_dtype_name(torch_dtype)}, {seconds:.1f} s)"
    emit(progress, LoadProgress(resolved.name, "ready", 1, 1, message))
    return LoadedModel(resolved.name, model, tokenizer, source, torch_device, torch_dtype, quant)


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
    if origin and gguf.is_file() and converted_folder(display_name(gguf.stem), file_key(gguf)) == dest:
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
