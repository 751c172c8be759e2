"""The data the loader hands out. Light on purpose: importing this module loads no torch."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from specchat.untrusted import visible

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

Stage = Literal["assemble", "convert", "load", "quantize", "kernels", "ready", "wait", "notice"]
"""`wait`: another specchat holds what is needed (repeated while waiting, so a listener can cancel);
`notice`: one line worth keeping on screen (a damaged cache entry being rebuilt, say)."""


@dataclass(frozen=True)
class LoadProgress:
    """One step of loading, for the CLI or the TUI to render (models/ imports neither)."""

    model: str
    """Short name or path being loaded."""
    stage: Stage
    done: float
    """Units done: bytes while assembling, steps otherwise."""
    total: float | None
    """None when unknown."""
    message: str
    """A human line, e.g. "assembling qwen-coder-1.5b chunk 3/22"."""


ProgressCallback = Callable[[LoadProgress], None]


@dataclass
class LoadedModel:
    """A model ready to decode: eval mode, on its device, with its tokenizer."""

    name: str
    """Display name: the short name, or the folder / file name."""
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    source: str
    """Where the weights were read from: a folder (the converted cache for GGUF) or a hub id."""
    device: torch.device
    dtype: torch.dtype
    quant: str | None
    """None, "4bit" or "8bit"."""


@dataclass(frozen=True)
class DecodingPair:
    """What an engine decodes with: the target, the draft (if any) and the kernels they run on."""

    target: Any
    """A transformers causal LM, or its lean CPU wrapper (see specchat.models.compute.lean)."""
    draft: Any | None
    tokenizer: PreTrainedTokenizerBase
    target_name: str
    draft_name: str | None
    device: torch.device
    kernels: str
    """The CPU path applied (e.g. "int8/dyn8+head32768"), or "none" for the stock layers."""

    @property
    def label(self) -> str:
        """Where and how it runs, for status lines: "cpu · int8/dyn8+head32768"."""
        return str(self.device) if self.kernels == "none" else f"{self.device} · {self.kernels}"


@dataclass(frozen=True)
class ModelInfo:
    """One row of `specchat models`."""

    name: str
    """What to pass to --model (or --draft)."""
    kind: Literal["packaged", "cached"]
    role: Literal["target", "draft", "single"]
    installed: bool
    """Packaged: every chunk package is installed. Cached: always True."""
    cached: bool
    """A converted or packed (fast-loading) copy exists in the cache."""
    size_bytes: int | None
    """Packaged: the GGUF file. Cached: the converted folder on disk."""
    description: str


def emit(progress: ProgressCallback | None, event: LoadProgress) -> None:
    """Send an event if anyone listens; a progress callback is always optional. Its text names
    models and paths a file's name chose, so it is made visible here, once for every front end."""
    if progress is not None:
        progress(replace(event, model=visible(event.model), message=visible(event.message)))


def notice(progress: ProgressCallback | None, model: str, message: str) -> None:
    """A line the user should read (also logged, for callers that pass no progress callback)."""
    logging.getLogger("specchat.models").info(visible(message))
    emit(progress, LoadProgress(model, "notice", 0, None, message))


class Waiter:
    """Reports waiting for another process as `wait` events, repeated while it lasts."""

    def __init__(self, model: str, progress: ProgressCallback | None) -> None:
        self.model = model
        self.progress = progress
        self.message = f"waiting for another specchat ({model})"

    def notify(self, message: str) -> None:
        self.message = message
        self.heartbeat()

    def heartbeat(self) -> None:
        """A listener may raise from its callback to stop waiting (the TUI does, when it quits)."""
        emit(self.progress, LoadProgress(self.model, "wait", 0, None, self.message))
