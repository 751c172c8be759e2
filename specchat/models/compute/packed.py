"""The packed cache: each model's CPU-kernel weights, packed once and memory-mapped afterwards.

A GGUF model is packed straight from its quantized blocks (no float copy of the weights is ever
made); any other model is loaded once in float and quantized. The folder holds the packed tensors
(safetensors, memory-mapped on load, so a warm start reads only what decoding touches), the
config, the generation config and the tokenizer, and a record of every file written (checked
cheaply at every start, every byte by `specchat models --verify`). Writes follow the cache's
rules (specchat.models.cache.writes): one writer per entry, staged and renamed into place, so a killed
or interrupted packing never leaves a folder that passes for a finished one.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from specchat.errors import ModelLoadError
from specchat.models.architectures import exact_context
from specchat.models.cache.manifest import quick_problem, record_files
from specchat.models.cache.paths import (
    CONVERTED_MARKER,
    MISSING,
    cache_dir,
    cache_write_error,
    human_bytes,
    safe_entry_name,
)
from specchat.models.cache.writes import entry_lock, set_doing, staged, sweep_partials
from specchat.models.compute.first_start import record_packing_rate
from specchat.models.records import LoadProgress, ProgressCallback, Waiter, emit, notice

T = TypeVar("T")
WEIGHTS = "weights.safetensors"
FORMAT_VERSION = 6
"""Bumped whenever the packed layout or the GGUF types kept at their own bits change, so older
folders are packed anew. 6: packed only after the model passed the GGUF validation layer (an
older copy of a file whose metadata disagreed with its tensors is packed anew, and refused)."""


def packed_dir() -> Path:
    return cache_dir() / "packed"


@dataclass(frozen=True)
class PackRecipe:
    """How one model is packed: its kernel format and, for drafts, how many head rows it keeps."""

    mode: str
    """"gguf" (the file's own blocks, others to q8), "q4" or "q8"."""
    head_rows: int | None = None

    @property
    def label(self) -> str:
        return self.mode + (f"+head{self.head_rows}" if self.head_rows else "")


def packed_folder(name: str, source_key: str, recipe: PackRecipe) -> Path:
    key = hashlib.sha256(f"{source_key}\0{recipe.label}\0{FORMAT_VERSION}".encode()).hexdigest()[:12]
    return packed_dir() / f"{safe_entry_name(name)}-{recipe.label}-{key}"


def is_packed(folder: Path) -> bool:
    return (folder / CONVERTED_MARKER).is_file()


def save_packed(
    folder: Path, packed: Any, *, config: Any, generation_config: Any, tokenizer: Any, origin: str
) -> None:
    """Write ``packed`` (a :class:`~specchat.kernels.native.PackedModel`) and its companions.

    The caller holds ``folder``'s entry lock; everything is written into a staged temporary that
    replaces the folder only once complete, with the record of its files written last.
    """
    from safetensors.torch import save_file

    try:
        with staged(folder, folder=True) as tmp:
            tensors = {name: t.contiguous() for name, t in packed.tensors.items()}
            save_file(tensors, str(tmp / WEIGHTS), metadata={"specchat": json.dumps(packed.meta())})
            _finish_folder(tmp, config, generation_config, tokenizer, origin)
    except OSError as err:
        raise cache_write_error(err, folder.parent) from err


def _finish_folder(tmp: Path, config: Any, generation_config: Any, tokenizer: Any, origin: str) -> None:
    """The weights' companions, then the record of every file (written last: its presence marks
    a complete folder)."""
    config.save_pretrained(tmp)
    if generation_config is not None:
        generation_config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    record = {
        "origin": origin,
        "format": FORMAT_VERSION,
        "packed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "files": record_files(tmp),
    }
    (tmp / CONVERTED_MARKER).write_text(json.dumps(record, indent=2) + "\n")


def damaged(folder: Path) -> str | None:
    """Why a finished packed folder cannot be trusted (None: it can).

    Cheap enough for every start: sizes, first MiBs and the weights' header (see manifest).
    """
    try:
        record = json.loads((folder / CONVERTED_MARKER).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        return f"its record is unreadable: {err}"
    if not isinstance(record, dict) or record.get("format") != FORMAT_VERSION:
        return "it was written by another version of specchat"
    return quick_problem(folder, record.get("files"))


def load_packed(
    folder: Path, name: str, progress: ProgressCallback | None = None, *, tokenizer: Any = None
) -> tuple[Any, Any]:
    """The native model over the folder's memory-mapped tensors, and its tokenizer (``tokenizer``
    when given: the caller checked the folder's tokenizer files are the same)."""
    from transformers import GenerationConfig, PretrainedConfig

    emit(progress, LoadProgress(name, "load", 0, 1, f"loading {name} (packed CPU kernels)"))
    packed = _mapped_weights(folder / WEIGHTS)
    # The kernels take their shapes from the packed record; the engine reads only plain fields of
    # the config (context length, stop ids), so the generic class serves and AutoConfig's imports
    # (about 0.4 s at every start) are skipped.
    config = PretrainedConfig.from_dict(_json_file(folder / "config.json"))
    generation = (
        GenerationConfig.from_pretrained(str(folder))
        if (folder / "generation_config.json").is_file()
        else None
    )
    if tokenizer is None:
        tokenizer = load_tokenizer(folder)
    model = checked_native_model(packed, config, generation)
    emit(progress, LoadProgress(name, "load", 1, 1, f"loading {name}: done"))
    return model, tokenizer


def _mapped_weights(path: Path) -> Any:
    """The :class:`~specchat.kernels.native.PackedModel` over a packed file's memory-mapped
    tensors (nothing is read until decoding touches it)."""
    from safetensors import safe_open

    from specchat.kernels.native import PackedModel
    from specchat.models.compute.packed_stream import is_pad

    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = json.loads(handle.metadata()["specchat"])
            tensors = {key: handle.get_tensor(key) for key in handle.keys() if not is_pad(key)}  # noqa: SIM118 - not a dict
        return PackedModel.from_meta(meta, tensors)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        from specchat.models.errors_util import one_line

        raise PackedCopyBroken(f"its record of the model's shape is unreadable ({one_line(err)})") from err


class PackedCopyBroken(Exception):
    """A packed copy whose tensors and shape disagree: packed by a specchat without the checks, or
    tampered with. Its model is packed anew from the source, which is checked first."""


def checked_native_model(packed: Any, config: Any, generation: Any = None) -> Any:
    """The native model over ``packed``, once the C++ decoder has checked every size it is handed
    (PackedCopyBroken naming the first that disagrees, never a crash in native code)."""
    from specchat.kernels.library import KernelsUnavailable
    from specchat.kernels.native import native_model
    from specchat.models.errors_util import is_oom, one_line

    try:
        return native_model(packed, config, generation)
    except (ValueError, RuntimeError, KeyError, IndexError) as err:
        if isinstance(err, KernelsUnavailable) or (isinstance(err, RuntimeError) and is_oom(err)):
            raise  # nothing to do with this copy
        raise PackedCopyBroken(one_line(err)) from err


TOKENIZER_SETTINGS_SKIPPED = (
    "tokenizer_class", "auto_map", "added_tokens_decoder", "is_local", "local_files_only"
)  # fmt: skip
"""tokenizer_config.json entries that name a class or describe the download, not the tokenizer
(added tokens, special flags included, are in tokenizer.json itself)."""


def load_tokenizer(folder: Path) -> Any:
    """The folder's tokenizer, read straight from its tokenizer.json.

    AutoTokenizer builds the same tokenizer about 2 s later at every start: it imports every auto
    class first, and a Qwen2 tokenizer parses its 11 MB tokenizer.json twice. A folder without a
    tokenizer.json, written in an older layout, or whose tokenizer has another backend, still goes
    through AutoTokenizer.
    """
    settings = _json_file(folder / "tokenizer_config.json")
    file = folder / "tokenizer.json"
    older_layout = (folder / "special_tokens_map.json").is_file()
    if not file.is_file() or older_layout or settings.get("backend", "tokenizers") != "tokenizers":
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder))
    from transformers import PreTrainedTokenizerFast

    for key in TOKENIZER_SETTINGS_SKIPPED:
        settings.pop(key, None)
    template = folder / "chat_template.jinja"
    if template.is_file():
        settings["chat_template"] = template.read_text(encoding="utf-8")
    return PreTrainedTokenizerFast(tokenizer_file=str(file), name_or_path=str(folder), **settings)


def _json_file(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; an empty one when there is no such file."""
    if not path.is_file():
        return {}
    value = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(value, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return value


# ------------------------------------------------------------------------------ packing a model
@dataclass(frozen=True)
class NativeModel:
    model: Any
    """A :class:`~specchat.kernels.native.NativeCausalLM`."""
    tokenizer: Any
    name: str
    folder: Path


VOCABULARY_FILES = ("tokenizer.json", "special_tokens_map.json")
"""Where a tokenizer keeps its vocabulary, merges and special tokens (not its chat template)."""


def same_vocabulary(folder: Path, other: Path) -> bool:
    """Whether two packed folders hold byte-identical vocabularies, so that one tokenizer can
    stand for both (the engine encodes and decodes with the target's alone; a draft only needs
    the same ids, which is what the compatibility check would otherwise load it to compare)."""

    def read(path: Path) -> bytes | None:
        return path.read_bytes() if path.is_file() else None

    return all(read(folder / name) == read(other / name) for name in VOCABULARY_FILES)


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
    _drop_superseded(folder, name, recipe, progress)


def _drop_superseded(folder: Path, name: str, recipe: PackRecipe, progress: ProgressCallback | None) -> None:
    """Delete the same model's packed copies in another format version: nothing reads them once
    ``folder`` is packed, and each holds as many bytes again."""
    pattern = re.compile(re.escape(f"{safe_entry_name(name)}-{recipe.label}-") + "[0-9a-f]{12}")
    for other in folder.parent.iterdir():
        if other == folder or not pattern.fullmatch(other.name) or not is_packed(other):
            continue
        try:
            record = json.loads((other / CONVERTED_MARKER).read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        if not isinstance(record, dict) or record.get("format") == FORMAT_VERSION:
            continue  # another source of the same name, packed by this version: still in use
        size = sum(f.stat().st_size for f in other.iterdir() if f.is_file())
        shutil.rmtree(other, ignore_errors=True)
        freed = human_bytes(size)
        notice(progress, name, f"removed the copy of {name} packed by an earlier specchat ({freed})")


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
            _finish_folder(tmp, config, generation, tokenizer, str(gguf))
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
        checked_native_model(_mapped_weights(packed) if isinstance(packed, Path) else packed, config)
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
