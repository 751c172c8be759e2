"""The packed cache's folders: each model's CPU-kernel weights, packed once and memory-mapped afterwards.

A folder holds the packed tensors (safetensors, memory-mapped on load, so a warm start reads only
what decoding touches), the config, the generation config and the tokenizer, and a record of every
file written (checked cheaply at every start, every byte by `specchat models --verify`). Writes
follow the cache's rules (specchat.models.cache.writes): one writer per entry, staged and renamed
into place, so a killed or interrupted packing never leaves a folder that passes for a finished
one. Packing a model into a folder is specchat.models.compute.packed's job.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specchat.models.cache.manifest import quick_problem, record_files
from specchat.models.cache.paths import (
    CONVERTED_MARKER,
    cache_dir,
    cache_write_error,
    human_bytes,
    safe_entry_name,
)
from specchat.models.cache.writes import staged
from specchat.models.records import LoadProgress, ProgressCallback, emit, notice

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
            finish_folder(tmp, config, generation_config, tokenizer, origin)
    except OSError as err:
        raise cache_write_error(err, folder.parent) from err


def finish_folder(tmp: Path, config: Any, generation_config: Any, tokenizer: Any, origin: str) -> None:
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
    packed = mapped_weights(folder / WEIGHTS)
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


def mapped_weights(path: Path) -> Any:
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


VOCABULARY_FILES = ("tokenizer.json", "special_tokens_map.json")
"""Where a tokenizer keeps its vocabulary, merges and special tokens (not its chat template)."""


def same_vocabulary(folder: Path, other: Path) -> bool:
    """Whether two packed folders hold byte-identical vocabularies, so that one tokenizer can
    stand for both (the engine encodes and decodes with the target's alone; a draft only needs
    the same ids, which is what the compatibility check would otherwise load it to compare)."""

    def read(path: Path) -> bytes | None:
        return path.read_bytes() if path.is_file() else None

    return all(read(folder / name) == read(other / name) for name in VOCABULARY_FILES)


def drop_superseded(folder: Path, name: str, recipe: PackRecipe, progress: ProgressCallback | None) -> None:
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
