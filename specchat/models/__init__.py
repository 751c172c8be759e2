"""Loading models: packaged names, HF folders and ids, GGUF files, quantization, device and dtype.

`from specchat.models import list_models, LoadProgress, ...` stays light; the names that need torch
and transformers (load_model, load_pair, load_for_decoding, resolve_device, resolve_dtype,
check_tokenizers_compatible) are imported on first use, so `specchat models` and `--help` start fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from specchat.models.names.catalog import DEFAULT_DRAFT, DEFAULT_TARGET, PACKAGED
from specchat.models.records import DecodingPair, LoadedModel, LoadProgress, ModelInfo, ProgressCallback

if TYPE_CHECKING:
    from specchat.models.cache.listing import list_models
    from specchat.models.cache.paths import cache_dir
    from specchat.models.loading.compat import check_tokenizers_compatible
    from specchat.models.loading.device import resolve_device, resolve_dtype
    from specchat.models.loading.hf import load_model
    from specchat.models.loading.loader import load_for_decoding, load_pair

_HEAVY = {
    # Light, but it brings platformdirs: the engine's GPU probe imports specchat.models.compute.rows on a
    # machine without it.
    "cache_dir": "specchat.models.cache.paths",
    "load_model": "specchat.models.loading.hf",
    "load_pair": "specchat.models.loading.loader",
    "load_for_decoding": "specchat.models.loading.loader",
    "resolve_device": "specchat.models.loading.device",
    "resolve_dtype": "specchat.models.loading.device",
    "check_tokenizers_compatible": "specchat.models.loading.compat",
    # Not heavy, but listing reads the packed cache's format: loaded on first use like the rest.
    "list_models": "specchat.models.cache.listing",
}

__all__ = [
    "DEFAULT_DRAFT",
    "DEFAULT_TARGET",
    "PACKAGED",
    "DecodingPair",
    "LoadProgress",
    "LoadedModel",
    "ModelInfo",
    "ProgressCallback",
    "cache_dir",
    "check_tokenizers_compatible",
    "list_models",
    "load_for_decoding",
    "load_model",
    "load_pair",
    "resolve_device",
    "resolve_dtype",
]


def __getattr__(name: str) -> Any:
    if name in _HEAVY:
        return getattr(importlib.import_module(_HEAVY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
