"""Turning library exceptions into the one-line messages the CLI prints."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from specchat.errors import ModelLoadError, OutOfMemoryError, SpecchatError, gist


def one_line(err: BaseException, limit: int = 200) -> str:
    """The gist of a library exception (its type's name when it has no text)."""
    return gist(str(err), limit) or type(err).__name__


def is_oom(err: BaseException) -> bool:
    if isinstance(err, MemoryError | torch.cuda.OutOfMemoryError):
        return True
    # The CPU allocator reports failure as a plain RuntimeError.
    return isinstance(err, RuntimeError) and "can't allocate memory" in str(err)


@contextlib.contextmanager
def memory_guard(name: str, device: torch.device) -> Iterator[None]:
    """Re-raise running out of memory as OutOfMemoryError with what to try instead."""
    try:
        yield
    except (MemoryError, RuntimeError) as err:
        if not is_oom(err):
            raise
        if device.type == "cuda":
            hint = "try a smaller model, --quant 4bit, or --device cpu"
        else:
            hint = "try a smaller model (e.g. smollm2-135m) or close other programs"
        raise OutOfMemoryError(f"ran out of memory loading {name} on {device}; {hint}") from err


@contextlib.contextmanager
def as_load_error(what: str) -> Iterator[None]:
    """Whatever a library trips over (bad config, unsupported architecture, odd metadata) becomes
    ModelLoadError("<what>: <gist>"). Our own errors and running out of memory pass through."""
    try:
        yield
    except Exception as err:
        if isinstance(err, SpecchatError) or is_oom(err):
            raise
        raise ModelLoadError(f"{what}: {one_line(err)}") from err


@contextlib.contextmanager
def quiet_library_bars(quiet: bool) -> Iterator[None]:
    """Hide transformers' own tqdm bars while a caller renders our progress events instead: a
    stray bar on stderr would tear through a running TUI."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    if quiet and was_enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if quiet and was_enabled:
            hf_logging.enable_progress_bar()
