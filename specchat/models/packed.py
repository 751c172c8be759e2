"""The packed cache: each model's CPU-kernel weights, packed once and memory-mapped afterwards.

A GGUF model is packed straight from its quantized blocks (no float copy of the weights is ever
made); any other model is loaded once in float and quantized. The folder holds the packed tensors
(safetensors, memory-mapped on load, so a warm start reads only what decoding touches), the
config, the generation config and the tokenizer, and a marker written last: a folder without it
is an unfinished write and is never loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specchat.errors import ModelLoadError
from specchat.models.cache import cache_dir, public_mode
from specchat.models.records import LoadProgress, ProgressCallback, emit

PACKED_MARKER = "specchat-packed.json"
WEIGHTS = "weights.safetensors"
FORMAT_VERSION = 1
"""Bumped whenever the packed layout changes, so older folders are packed anew."""


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
    return packed_dir() / f"{name}-{recipe.label}-{key}"


def is_packed(folder: Path) -> bool:
    return (folder / PACKED_MARKER).is_file()


def save_packed(
    folder: Path, packed: Any, *, config: Any, generation_config: Any, tokenizer: Any, origin: str
) -> None:
    """Write ``packed`` (a :class:`~specchat.kernels.native.PackedModel`) and its companions atomically."""
    from safetensors.torch import save_file

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    os.chmod(tmp, public_mode(0o777))  # mkdtemp makes it private; the cache is ordinary user data
    try:
        tensors = {name: t.contiguous() for name, t in packed.tensors.items()}
        save_file(tensors, str(tmp / WEIGHTS), metadata={"specchat": json.dumps(packed.meta())})
        config.save_pretrained(tmp)
        if generation_config is not None:
            generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        marker = {
            "origin": origin,
            "format": FORMAT_VERSION,
            "bytes": (tmp / WEIGHTS).stat().st_size,
            "packed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (tmp / PACKED_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if folder.exists() and not is_packed(folder):
            shutil.rmtree(folder)  # left by an older, unfinished run
        try:
            os.rename(tmp, folder)
        except OSError:
            if not is_packed(folder):  # another process finishing first is fine
                raise
    except OSError as err:
        raise ModelLoadError(
            f"could not write the packed model to {folder.parent} ({err.strerror or err}); "
            "free disk space or set SPECCHAT_CACHE_DIR to a larger disk"
        ) from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def damaged(folder: Path) -> str | None:
    """Why a finished packed folder cannot be trusted (None: it can). Cheap: sizes and headers only."""
    try:
        marker = json.loads((folder / PACKED_MARKER).read_text())
        size = (folder / WEIGHTS).stat().st_size
    except (OSError, ValueError) as err:
        return f"unreadable: {err}"
    if marker.get("format") != FORMAT_VERSION:
        return "written by another version"
    if size != marker.get("bytes"):
        return f"weights are {size} bytes, {marker.get('bytes')} were written"
    try:
        with (folder / WEIGHTS).open("rb") as handle:
            header = int.from_bytes(handle.read(8), "little")
            json.loads(handle.read(header))
    except (OSError, ValueError) as err:
        return f"the weights' header is broken: {err}"
    return None


def load_packed(
    folder: Path, name: str, progress: ProgressCallback | None = None, *, tokenizer: Any = None
) -> tuple[Any, Any]:
    """The native model over the folder's memory-mapped tensors, and its tokenizer (``tokenizer``
    when given: the caller checked the folder's tokenizer files are the same)."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from specchat.kernels.native import PackedModel, native_model

    emit(progress, LoadProgress(name, "load", 0, 1, f"loading {name} (packed CPU kernels)"))
    damage = damaged(folder)
    if damage is not None:
        raise ModelLoadError(
            f"the packed copy of {name} in {folder} is damaged ({damage}); delete it to repack"
        )
    with safe_open(str(folder / WEIGHTS), framework="pt") as handle:
        meta = json.loads(handle.metadata()["specchat"])
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 - not a dict
    packed = PackedModel.from_meta(meta, tensors)
    config = AutoConfig.from_pretrained(str(folder))
    generation = (
        GenerationConfig.from_pretrained(str(folder))
        if (folder / "generation_config.json").is_file()
        else None
    )
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = native_model(packed, config, generation)
    emit(progress, LoadProgress(name, "load", 1, 1, f"loading {name}: done"))
    return model, tokenizer


# ------------------------------------------------------------------------------ packing a model
@dataclass(frozen=True)
class NativeModel:
    model: Any
    """A :class:`~specchat.kernels.native.NativeCausalLM`."""
    tokenizer: Any
    name: str
    folder: Path


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def same_tokenizer(folder: Path, other: Path) -> bool:
    """Whether two packed folders hold byte-identical tokenizer files (so one tokenizer serves both)."""

    def read(path: Path) -> bytes | None:
        return path.read_bytes() if path.is_file() else None

    return all(read(folder / name) == read(other / name) for name in TOKENIZER_FILES)


def load_native(
    spec: str,
    recipe: PackRecipe,
    progress: ProgressCallback | None = None,
    *,
    share_tokenizer: NativeModel | None = None,
) -> NativeModel:
    """The model ``spec`` names on the CPU kernels, packed on first use.

    ``share_tokenizer``: another loaded model whose tokenizer is reused when the files are the
    same (a draft beside its target), saving a second tokenizer load at every start.
    """
    from specchat.models.resolve import resolve_spec

    resolved = resolve_spec(spec)
    gguf, source_key = _source(resolved, progress)
    folder = packed_folder(resolved.name, source_key, recipe)
    damage = damaged(folder) if is_packed(folder) else None
    if damage is not None:
        message = f"the packed copy of {resolved.name} is damaged ({damage}): packing it again"
        emit(progress, LoadProgress(resolved.name, "kernels", 0, 1, message))
        shutil.rmtree(folder, ignore_errors=True)
    if not is_packed(folder):
        started = time.monotonic()
        emit(
            progress,
            LoadProgress(resolved.name, "kernels", 0, 1, f"packing {resolved.name} ({recipe.label}), once"),
        )
        if gguf is not None:
            _pack_gguf(gguf, resolved.name, recipe, folder)
        else:
            _pack_float(spec, resolved.name, recipe, folder, progress)
        seconds = time.monotonic() - started
        emit(
            progress,
            LoadProgress(resolved.name, "kernels", 1, 1, f"packed {resolved.name} in {seconds:.0f} s"),
        )
    shared = None
    if share_tokenizer is not None and same_tokenizer(folder, share_tokenizer.folder):
        shared = share_tokenizer.tokenizer
    model, tokenizer = load_packed(folder, resolved.name, progress, tokenizer=shared)
    return NativeModel(model, tokenizer, resolved.name, folder)


def _source(resolved: Any, progress: ProgressCallback | None) -> tuple[Path | None, str]:
    """The GGUF file to pack from (None: a float model) and a key that changes with the source."""
    from specchat.models.assemble import packaged_gguf
    from specchat.models.convert import file_key

    if resolved.kind == "packaged":
        return packaged_gguf(resolved.packaged, progress), f"packaged:{resolved.packaged.key}"
    if resolved.kind == "gguf":
        path = Path(resolved.location)
        return path, f"gguf:{file_key(path)}"
    if resolved.kind == "hub":
        return None, f"hub:{resolved.location}"
    path = Path(resolved.location)
    config = path / "config.json"
    stamp = config.stat().st_mtime_ns if config.exists() else 0
    return None, f"folder:{path.resolve()}:{stamp}"


def _pack_gguf(gguf: Path, name: str, recipe: PackRecipe, folder: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from specchat.kernels.native import pack_gguf
    from specchat.models.errors_util import as_load_error

    with as_load_error(f"cannot pack {gguf} for the CPU kernels"):
        packed = pack_gguf(str(gguf), mode=recipe.mode, head_rows=recipe.head_rows)
        config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the packed copy is not a GGUF-quantized transformers model
    generation = GenerationConfig.from_model_config(config)
    _sync_eos(config, generation, tokenizer, packed.shape.vocab)
    save_packed(
        folder, packed, config=config, generation_config=generation, tokenizer=tokenizer, origin=str(gguf)
    )


def _pack_float(
    spec: str, name: str, recipe: PackRecipe, folder: Path, progress: ProgressCallback | None
) -> None:
    from specchat.kernels.native import pack_hf
    from specchat.models.errors_util import as_load_error
    from specchat.models.loader import load_model

    loaded = load_model(spec, device="cpu", dtype="float32", progress=progress)
    bits = 8 if recipe.mode in ("gguf", "q8") else 4
    with as_load_error(f"cannot pack {name} for the CPU kernels"):
        packed = pack_hf(loaded.model, bits=bits, head_rows=recipe.head_rows)
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

    from specchat.models.convert import sync_eos_ids

    head = SimpleNamespace(weight=SimpleNamespace(shape=(rows,)))
    stand_in = SimpleNamespace(
        generation_config=generation, config=config, get_output_embeddings=lambda: head
    )
    sync_eos_ids(stand_in, tokenizer, from_gguf=True)  # type: ignore[arg-type]
