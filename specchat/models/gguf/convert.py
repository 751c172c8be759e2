"""GGUF -> a safetensors folder, once per file, so later starts load in seconds.

transformers reads a GGUF by dequantizing every tensor (one to two minutes for the Qwen files on a
small CPU). Doing that on every start would be unbearable, so the result is saved, with its
tokenizer and generation config, into the cache and memory-mapped from there afterwards.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib
import json
import os
import re
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import torch

from specchat.errors import ModelLoadError, SpecchatError
from specchat.models.architectures import BY_NAME
from specchat.models.cache.manifest import quick_problem, record_files, safetensors_problem
from specchat.models.cache.paths import (
    CONVERTED_MARKER,
    MISSING,
    cache_write_error,
    converted_dir,
    safe_entry_name,
)
from specchat.models.cache.writes import staged
from specchat.models.errors_util import as_load_error, memory_guard, one_line, quiet_library_bars
from specchat.models.gguf.check import read_gguf
from specchat.models.gguf.lazy_reading import lazy_gguf_reading
from specchat.models.gguf.shape import check_metadata, decoder_dims
from specchat.models.records import LoadProgress, ProgressCallback, emit

CPU = torch.device("cpu")
T = TypeVar("T")
END_OF_GENERATION = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
    "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
)  # fmt: skip
"""Special tokens llama.cpp ends a reply on by their text, besides the file's eos (its vocabulary
loader's end-of-generation list): a GGUF records one eos, while chat models end a turn with
another token (Gemma's ``<end_of_turn>``, Llama 3's ``<|eot_id|>``, Phi-3's ``<|end|>``)."""

if TYPE_CHECKING:
    # Types only: transformers' modeling code costs seconds to import; it is loaded when converting.
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def converted_folder(name: str, key: str) -> Path:
    return converted_dir() / f"{safe_entry_name(name)}-{key}"


def file_key(path: Path) -> str:
    """Identifies a user's GGUF by path, size and mtime: hashing gigabytes on every start costs
    seconds, and a file replaced in place changes its mtime, so it still gets converted afresh."""
    stat = path.stat()
    ident = f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"
    return hashlib.sha256(ident.encode()).hexdigest()[:12]


def converted_problem(dest: Path) -> str | None:
    """None when `dest` is a complete conversion that still matches its record; else why not.

    Cheap enough for every start (sizes, first MiBs, safetensors headers; see manifest).
    """
    marker = dest / CONVERTED_MARKER
    if not marker.is_file():
        return f"{CONVERTED_MARKER} is missing" if dest.is_dir() else MISSING
    try:
        meta = json.loads(marker.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        meta = None
    if not isinstance(meta, dict):
        return f"its record {CONVERTED_MARKER} is unreadable"
    if "files" not in meta:  # converted before sizes were recorded: the structural check only
        return safetensors_problem(dest)
    return quick_problem(dest, meta["files"])


def convert(
    gguf: Path, dest: Path, *, name: str, origin: str, progress: ProgressCallback | None = None
) -> Path:
    """Dequantize `gguf` into the safetensors folder `dest`; the caller holds `dest`'s entry lock.
    The file passes the validation layer first (structure, caps, and for a family specchat's
    decoders know, every dimension against the tensors)."""
    checked = read_gguf(gguf)
    if checked.architecture in BY_NAME:
        decoder_dims(checked)
    else:
        check_metadata(checked)  # what decoder_dims checks of every family
    started = time.monotonic()
    model, tokenizer = _read_gguf(gguf, name, progress)
    emit(progress, LoadProgress(name, "convert", 0, None, f"converting {name}: saving to the cache"))
    meta = {
        "name": name,
        "origin": origin,
        "gguf": str(gguf),
        "transformers": _transformers_version(),
        "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.monotonic() - started, 1),
    }
    with quiet_library_bars(progress is not None):
        _save_atomically(model, tokenizer, dest, meta)
    del model
    gc.collect()  # the dequantized copy is gigabytes; free it before the folder is loaded again
    emit(progress, LoadProgress(name, "convert", 1, 1, f"converted {name}"))
    return dest


def sync_eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, from_gguf: bool) -> None:
    """Make generation_config.eos_token_id hold every id the model may end a reply with.

    The engine stops on these and on tokenizer.eos_token_id. A GGUF records a single eos
    (`<|im_end|>` for Qwen chat models), while the upstream generation configs of such models also
    stop on `<|endoftext|>`, and llama.cpp stops on every token of :data:`END_OF_GENERATION`;
    without them a reply could run past its end.
    """
    config = model.generation_config
    ids = _as_list(config.eos_token_id) or _as_list(model.config.eos_token_id)
    extra = [tokenizer.eos_token_id]
    if from_gguf:
        extra += [_special_id(tokenizer, token) for token in END_OF_GENERATION]
    # Only ids the model can emit: a tokenizer may add a default special token past the last row.
    head = model.get_output_embeddings()
    rows = head.weight.shape[0] if head is not None else model.config.vocab_size
    ids += [int(i) for i in extra if i is not None and i not in ids and i < rows]
    if ids:
        config.eos_token_id = ids[0] if len(ids) == 1 else ids
    if config.pad_token_id is None and tokenizer.pad_token_id is not None:
        config.pad_token_id = tokenizer.pad_token_id


def _special_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int | None:
    specials = {t.content: i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    return specials.get(token)


def _as_list(ids: int | list[int] | None) -> list[int]:
    if ids is None:
        return []
    return [int(ids)] if isinstance(ids, int) else [int(i) for i in ids]


def _read_gguf(
    gguf: Path, name: str, progress: ProgressCallback | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    emit(progress, LoadProgress(name, "convert", 0, None, f"converting {name} (only once; minutes on CPU)"))
    with (
        memory_guard(name, CPU),
        as_load_error(f"cannot convert {gguf}"),
        _tensor_progress(name, progress),
        quiet_library_bars(progress is not None),
        lazy_gguf_reading(),
    ):
        # fp32 keeps the dequantized values exact; a smaller dtype is chosen when loading the copy.
        # dequantize=True: with the optional `kernels` package installed, transformers would
        # otherwise keep the weights in packed GGUF blocks, which save_pretrained cannot write.
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent),
            gguf_file=gguf.name,
            dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True),
        )
        emit(progress, LoadProgress(name, "convert", 0, None, f"converting {name}: reading the tokenizer"))
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return model, tokenizer


@contextlib.contextmanager
def _tensor_progress(name: str, progress: ProgressCallback | None) -> Iterator[None]:
    """Report the dequantizing loop tensor by tensor instead of a tqdm bar on stderr.

    transformers exposes that loop only through the `tqdm` its GGUF module imported, so we lend it
    a counting stand-in for the duration. Without this the longest step (one to two minutes) would
    show no progress at all. If a later transformers renames it, we just lose the detail.
    """
    try:
        module = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    except ImportError:
        module = None
    if progress is None or module is None or not hasattr(module, "tqdm"):
        yield
        return

    def counted(items: Sequence[T], *args: object, **kwargs: object) -> Iterator[T]:
        total = len(items)
        for index, item in enumerate(items):
            message = f"converting {name}: tensor {index + 1}/{total}"
            emit(progress, LoadProgress(name, "convert", index, total, message))
            yield item

    original = module.tqdm  # type: ignore[attr-defined]
    module.tqdm = counted  # type: ignore[attr-defined]
    try:
        yield
    finally:
        module.tqdm = original  # type: ignore[attr-defined]


def _save_atomically(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, dest: Path, meta: dict[str, object]
) -> None:
    """Write a staged folder, record what it holds, then rename it into place (see store.staged)."""
    # What save_pretrained writes, roughly: tied tensors may be counted twice, which errs on the safe side.
    need = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    try:
        with staged(dest, folder=True) as tmp:
            _forget_gguf(model)
            sync_eos_ids(model, tokenizer, from_gguf=True)
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            meta["files"] = record_files(tmp)
            # Written last: a folder without it was never finished.
            (tmp / CONVERTED_MARKER).write_text(json.dumps(meta, indent=2) + "\n")
    except OSError as err:
        raise cache_write_error(err, dest, need=need) from err
    except SpecchatError:
        raise
    except Exception as err:
        # safetensors reports a full disk as its own error type, with the OS error in its text.
        code = os_error_code(err)
        if code is not None:
            raise cache_write_error(OSError(code, os.strerror(code)), dest, need=need) from err
        what = f"cannot save the converted {meta['name']} to {dest.parent}"
        raise ModelLoadError(f"{what}: {one_line(err)}") from err


def os_error_code(err: BaseException) -> int | None:
    """The errno a library wrapped into its own exception text ("... (os error 28)"), if any."""
    match = re.search(r"\(os error (\d+)\)", str(err))
    return int(match.group(1)) if match else None


def _forget_gguf(model: PreTrainedModel) -> None:
    """Make the model a plain one before saving: its weights are dequantized tensors by now.

    The GGUF loader leaves its quantizer attached (save_pretrained refuses "quantized" models) and
    a `quantization_config` naming the GGUF file in the config. Saved, that config would bring a
    GGUF quantizer back on every load of the copy, which warns, blocks dtype casts and collides with
    --quant's bitsandbytes config.
    """
    model.hf_quantizer = None  # type: ignore[assignment]  # nn.Module's __setattr__ confuses mypy
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def _transformers_version() -> str:
    import transformers

    return str(transformers.__version__)
