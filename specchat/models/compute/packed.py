"""Packing a model into the packed cache (specchat.models.compute.packed_cache) on first use, then
loading it from there.

A GGUF model is packed straight from its quantized blocks (no float copy of the weights is ever
made); any other model is loaded once in float and quantized. A damaged copy is packed anew, and
a fresh copy is checked by the C++ decoder before it takes its place.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from specchat.errors import ModelLoadError
from specchat.models.architectures import exact_context
from specchat.models.cache.paths import MISSING, cache_write_error
from specchat.models.cache.writes import entry_lock, set_doing, staged, sweep_partials
from specchat.models.compute.first_start import record_packing_rate
from specchat.models.compute.packed_cache import (
    WEIGHTS,
    PackedCopyBroken,
    PackRecipe,
    checked_native_model,
    damaged,
    drop_superseded,
    finish_folder,
    is_packed,
    load_packed,
    mapped_weights,
    packed_folder,
    same_vocabulary,
    save_packed,
)
from specchat.models.records import LoadProgress, ProgressCallback, Waiter, emit, notice

T = TypeVar("T")


@dataclass(frozen=True)
class NativeModel:
    model: Any
    """A :class:`~specchat.kernels.native.NativeCausalLM`."""
    tokenizer: Any
    name: str
    folder: Path


def load_native(
    spec: str,
    recipe: PackRecipe,
    progress: ProgressCallback | None = None,
    *,
    share_tokenizer: NativeModel | None = None,
) -> NativeModel:
    """The model ``spec`` names on the CPU kernels, packed on first use.

    ``share_tokenizer``: another loaded model whose tokenizer is reused when the vocabularies are
    the same (a draft beside its target), saving a second tokenizer load at every start.
    """
    from specchat.models.names.resolve import resolve_spec

    resolved = resolve_spec(spec)
    # What a killed packing left (a temporary of the packed size), before this start adds its own.
    sweep_partials(lambda message: notice(progress, resolved.name, message))
    folder = packed_folder(resolved.name, _source_key(resolved), recipe)
    waiter = Waiter(resolved.name, progress)
    with entry_lock(folder, f"packing {resolved.name}", notify=waiter.notify, heartbeat=waiter.heartbeat):
        problem = damaged(folder) if is_packed(folder) else MISSING
        if problem is not None:
            _pack(spec, resolved, recipe, folder, problem, progress)
        shared = None
        if share_tokenizer is not None and same_vocabulary(folder, share_tokenizer.folder):
            shared = share_tokenizer.tokenizer
        try:
            model, tokenizer = load_packed(folder, resolved.name, progress, tokenizer=shared)
        except PackedCopyBroken as broken:
            if problem is not None:  # packed just now, from a source that passed the checks
                raise ModelLoadError(
                    f"the packed copy of {resolved.name} cannot be run ({broken})"
                ) from broken
            _pack(spec, resolved, recipe, folder, f"its sizes disagree: {broken}", progress)
            model, tokenizer = load_packed(folder, resolved.name, progress, tokenizer=shared)
    return NativeModel(model, tokenizer, resolved.name, folder)


def _pack(
    spec: str,
    resolved: Any,
    recipe: PackRecipe,
    folder: Path,
    problem: str,
    progress: ProgressCallback | None,
) -> None:
    """Pack for the first time (``problem`` is MISSING), or again, saying why."""
    name = resolved.name
    if problem != MISSING:
        notice(progress, name, f"the packed copy of {name} is damaged ({problem}): packing it again")
    set_doing(folder, f"packing {name}")
    started = time.monotonic()
    emit(progress, LoadProgress(name, "kernels", 0, 1, f"packing {name} ({recipe.label}), once"))
    gguf = _source_gguf(resolved, progress)
    if gguf is not None:
        packing_started = time.monotonic()
        _pack_gguf(gguf, name, recipe, folder, progress)
        record_packing_rate(gguf.stat().st_size, time.monotonic() - packing_started)
    else:
        _pack_float(spec, name, recipe, folder, progress)
    seconds = time.monotonic() - started
    emit(progress, LoadProgress(name, "kernels", 1, 1, f"packed {name} in {seconds:.0f} s"))
    drop_superseded(folder, name, recipe, progress)


def _source_key(resolved: Any) -> str:
    """Changes whenever the source does, without reading it (a warm start touches no GGUF)."""
    from specchat.models.gguf.convert import file_key

    if resolved.kind == "packaged":
        return f"packaged:{resolved.packaged.key}"
    if resolved.kind == "gguf":
        return f"gguf:{file_key(Path(resolved.location))}"
    if resolved.kind == "hub":
        return f"hub:{resolved.location}"
    path = Path(resolved.location)
    config = path / "config.json"
    stamp = config.stat().st_mtime_ns if config.exists() else 0
    return f"folder:{path.resolve()}:{stamp}"


def _source_gguf(resolved: Any, progress: ProgressCallback | None) -> Path | None:
    """The GGUF to pack from, checksummed first where specchat knows its sum (packing damaged
    blocks would cache them for good); None for a float model. pack_gguf checks every file."""
    from specchat.models.names.assemble import packaged_gguf

    if resolved.kind == "packaged":
        return packaged_gguf(resolved.packaged, progress, verify=True, wait=Waiter(resolved.name, progress))
    if resolved.kind == "gguf":
        return Path(resolved.location)
    return None


def _pack_gguf(
    gguf: Path, name: str, recipe: PackRecipe, folder: Path, progress: ProgressCallback | None
) -> None:
    from transformers import GenerationConfig

    from specchat.models.compute.packed_stream import HEADER_ROOM, StreamedSafetensors
    from specchat.models.compute.packing import pack_gguf
    from specchat.models.errors_util import as_load_error
    from specchat.models.gguf.check import read_gguf

    with as_load_error(f"cannot pack {gguf} for the CPU kernels"):
        source = read_gguf(gguf)  # the validation layer's walk: what transformers reads is within its caps
    # transformers spends as long reading the config and the tokenizer from the file's metadata
    # (pure Python, about 20 s for a Qwen vocabulary) as packing a 1.5B model takes: done beside
    # packing, whose numpy work leaves the interpreter lock free most of the time.
    companions = _in_background(lambda: _gguf_companions(gguf))
    try:
        with staged(folder, folder=True) as tmp:
            # Each matrix is written as it is packed and dropped (the packed model is never whole
            # in memory); the staged folder replaces the entry only once complete.
            with (
                as_load_error(f"cannot pack {gguf} for the CPU kernels"),
                StreamedSafetensors(tmp / WEIGHTS, HEADER_ROOM) as weights,
            ):
                each_layer = _layer_progress(name, recipe, progress)
                # pack_gguf checks the dimensions against the tensors (gguf_shape) before packing any.
                packed = pack_gguf(
                    str(gguf),
                    mode=recipe.mode,
                    head_rows=recipe.head_rows,
                    on_layer=each_layer,
                    sink=weights,
                    source=source,
                )
                del source  # its memory map: the packed copy is what runs from here on
                for key, tensor in packed.tensors.items():
                    weights.add(key, tensor.contiguous().numpy())
                weights.close({"specchat": json.dumps(packed.meta())})
            config, tokenizer = companions.result()
            if hasattr(config, "quantization_config"):
                del config.quantization_config  # the packed copy is not a GGUF-quantized transformers model
            config.max_position_embeddings = exact_context(config)
            generation = GenerationConfig.from_model_config(config)
            _sync_eos(config, generation, tokenizer, packed.shape.vocab)
            _check_before_caching(tmp / WEIGHTS, config, name)
            finish_folder(tmp, config, generation, tokenizer, str(gguf))
    except OSError as err:
        raise cache_write_error(err, folder.parent) from err


def _gguf_companions(gguf: Path) -> tuple[Any, Any]:
    """The config and tokenizer transformers reads from a GGUF's metadata."""
    from transformers import AutoConfig, AutoTokenizer

    from specchat.models.errors_util import as_load_error
    from specchat.models.gguf.lazy_reading import lazy_gguf_reading

    with as_load_error(f"cannot read the config and tokenizer of {gguf}"), lazy_gguf_reading():
        config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return config, tokenizer


def _in_background(work: Callable[[], T]) -> Future[T]:
    """``work`` run on a daemon thread (one that never holds up the exit of a process quitting
    mid-packing); its result, or its exception, from the future."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as err:  # handed to whoever waits for the result
            future.set_exception(err)

    threading.Thread(target=run, name="specchat-gguf-companions", daemon=True).start()
    return future


def _check_before_caching(packed: Any, config: Any, name: str) -> None:
    """The C++ decoder checks every size of the freshly packed model (a PackedModel, or the path
    of its staged weights) before the copy takes its place: a copy in the cache is one that runs."""
    try:
        checked_native_model(mapped_weights(packed) if isinstance(packed, Path) else packed, config)
    except PackedCopyBroken as broken:
        raise ModelLoadError(f"cannot pack {name} for the CPU kernels: {broken}") from broken


def _layer_progress(
    name: str, recipe: PackRecipe, progress: ProgressCallback | None
) -> Callable[[int, int], None]:
    """One progress line per packed layer, with the time left once two layers have given a rate:
    a bar for the user, and the point where quitting (a callback that raises) stops packing
    instead of waiting for it to finish."""
    first: list[float] = []

    def report(done: int, layers: int) -> None:
        now = time.monotonic()
        if not first:  # the embedding and head come before layer 1: the rate is per layer after it
            first.append(now)
        message = f"packing {name} ({recipe.label}), once: layer {done}/{layers}"
        if done > 1 and now > first[0]:
            message += f", about {time_left((now - first[0]) / (done - 1) * (layers - done))} left"
        emit(progress, LoadProgress(name, "kernels", done, layers, message))

    return report


def time_left(seconds: float) -> str:
    """``seconds`` as a person reads a countdown: "40 s", "3 min 5 s"."""
    whole = max(0, round(seconds))
    return f"{whole} s" if whole < 60 else f"{whole // 60} min {whole % 60} s"


def _pack_float(
    spec: str, name: str, recipe: PackRecipe, folder: Path, progress: ProgressCallback | None
) -> None:
    from specchat.models.compute.packing import pack_hf
    from specchat.models.errors_util import as_load_error
    from specchat.models.loading.hf import load_model

    loaded = load_model(spec, device="cpu", dtype="float32", progress=progress)
    bits = 8 if recipe.mode in ("gguf", "q8") else 4
    with as_load_error(f"cannot pack {name} for the CPU kernels"):
        each_layer = _layer_progress(name, recipe, progress)
        packed = pack_hf(loaded.model, bits=bits, head_rows=recipe.head_rows, on_layer=each_layer)
    loaded.model.config.max_position_embeddings = exact_context(loaded.model.config)
    _check_before_caching(packed, loaded.model.config, name)
    save_packed(
        folder,
        packed,
        config=loaded.model.config,
        generation_config=getattr(loaded.model, "generation_config", None),
        tokenizer=loaded.tokenizer,
        origin=loaded.source,
    )


def _sync_eos(config: Any, generation: Any, tokenizer: Any, rows: int) -> None:
    """The stop tokens a GGUF model may end a reply with (see convert.sync_eos_ids)."""
    from types import SimpleNamespace

    from specchat.models.gguf.convert import sync_eos_ids

    head = SimpleNamespace(weight=SimpleNamespace(shape=(rows,)))
    stand_in = SimpleNamespace(
        generation_config=generation, config=config, get_output_embeddings=lambda: head
    )
    sync_eos_ids(stand_in, tokenizer, from_gguf=True)  # type: ignore[arg-type]
