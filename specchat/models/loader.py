"""load_model / load_pair: from a name the user typed to a model ready to decode."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from specchat.models.assemble import packaged_gguf
from specchat.models.cache import is_converted
from specchat.models.compat import check_tokenizers_compatible
from specchat.models.convert import converted_folder, ensure_converted, file_key, sync_eos_ids
from specchat.models.device import resolve_device, resolve_dtype
from specchat.models.errors_util import as_load_error, memory_guard, quiet_library_bars
from specchat.models.hub import hub_folder
from specchat.models.quant import check_quant, quant_config
from specchat.models.records import (
    DecodingPair,
    LoadedModel,
    LoadProgress,
    ProgressCallback,
    Stage,
    emit,
)
from specchat.models.resolve import Resolved, resolve_spec


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
    folder = hf_folder(resolved, progress)
    model, tokenizer = _load_folder(folder, resolved.name, torch_device, torch_dtype, quant, progress)
    sync_eos_ids(model, tokenizer, from_gguf=resolved.kind in {"packaged", "gguf", "cached"})
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

    parse_cpu_path(cpu_path)  # a typo fails before a minute of loading
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
        kernels=pair.path,
    )


def hf_folder(resolved: Resolved, progress: ProgressCallback | None = None) -> Path:
    """A Hugging Face format folder for `resolved`, assembling and converting GGUF on first use."""
    if resolved.kind == "packaged":
        assert resolved.packaged is not None
        packaged = resolved.packaged
        dest = converted_folder(packaged.name, packaged.key)
        if is_converted(dest):  # the warm path: no chunks are read or hashed
            return dest
        gguf = packaged_gguf(packaged, progress)
        return ensure_converted(
            gguf, dest, name=packaged.name, origin=f"packaged:{packaged.name}", progress=progress
        )
    if resolved.kind == "gguf":
        gguf = Path(resolved.location)
        dest = converted_folder(resolved.name, file_key(gguf))
        return ensure_converted(gguf, dest, name=resolved.name, origin=str(gguf), progress=progress)
    if resolved.kind == "hub":
        return hub_folder(resolved.location, progress)
    return Path(resolved.location)  # a local folder or a converted-cache entry


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
    emit(progress, LoadProgress(name, stage, 0, 1, f"{verb} on {device}"))
    with (
        memory_guard(name, device),
        as_load_error(f"cannot load {name} from {folder}"),
        quiet_library_bars(progress is not None),
    ):
        model = AutoModelForCausalLM.from_pretrained(str(folder), **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        if "device_map" not in kwargs:
            model.to(device)  # type: ignore[arg-type]  # transformers' typed wrapper of Module.to
    model.eval()
    emit(progress, LoadProgress(name, stage, 1, 1, f"{verb} on {device}: done"))
    return model, tokenizer


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
