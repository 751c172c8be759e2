"""Impossible sizes handed straight to the C++ decoder, past every Python check.

The validation layer refuses a model file whose metadata disagrees with its tensors before any
native code runs; these cases check the second line of defence: the decoder's entry checks
(core/decoder.h, qgemm.cpp), which must turn any size they cannot compute with into a Python
error, whatever a caller hands them. Each ``ABUSES`` entry builds a model (or a pass) from a valid
packed fixture with one thing wrong. tests/kernels/test_decoder_checks.py runs each with the
shipped kernels; :func:`run_all` runs them all in the sanitized runner (AddressSanitizer and
UndefinedBehaviorSanitizer), where a read past a buffer would end the process with a report.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "gguf" / "llama-Q8_0.gguf"


@cache
def _packed() -> Any:
    from specchat.models.compute.packing import pack_gguf

    return pack_gguf(str(FIXTURE))


def fresh() -> Any:
    """A deep copy of the packed fixture (1 layer, hidden 256, 4 heads of 64, 2 for k/v, 320 rows)."""
    return copy.deepcopy(_packed())


def build(packed: Any) -> Any:
    from specchat.kernels.native import native_model

    return native_model(packed, SimpleNamespace())


def with_shape(**changes: Any) -> Callable[[], Any]:
    def make() -> Any:
        packed = fresh()
        packed.shape = replace(packed.shape, **changes)
        return build(packed)

    return make


def _heads_128_wide() -> Any:
    packed = fresh()
    packed.shape = replace(packed.shape, head_dim=128)
    packed.tensors["inv_freq"] = torch.ones(64)  # past the rotary table's own check
    return build(packed)


def _no_layers() -> Any:
    packed = fresh()
    packed.shape = replace(packed.shape, layers=0)
    return build(packed)


def _wider_embedding() -> Any:
    from specchat.kernels.formats import quantize_q8

    packed = fresh()
    packed.add_matrix("embed", quantize_q8(torch.randn(160, 512).numpy()))
    return build(packed)


def _short_scales() -> Any:
    packed = fresh()
    packed.tensors["layers.0.q.sc"] = packed.tensors["layers.0.q.sc"][:1].clone()
    return build(packed)


def _rows_past_the_blocks() -> Any:
    packed = fresh()
    meta = packed.matrices["layers.0.q"]
    packed.matrices["layers.0.q"] = replace(meta, rows=meta.rows + 64)
    return build(packed)


def _short_norm() -> Any:
    packed = fresh()
    packed.tensors["layers.0.attn_norm"] = packed.tensors["layers.0.attn_norm"][:128].clone()
    return build(packed)


def _negative_window() -> Any:
    model = build(fresh())
    model._model.set_layer_extras(0, None, None, None, None, -5, False)
    return model


def _forward(ids: list[int], **changes: Any) -> Callable[[], Any]:
    """A pass over ``ids`` with the given arguments of the C++ forward changed."""

    def run() -> Any:
        model = build(fresh())
        cache = model.new_cache()
        cache.reserve(len(ids))
        arguments: dict[str, Any] = {
            "ids": torch.tensor(ids), "keys": cache.keys, "values": cache.values,
            "past": 0, "n_logits": 1, "head_rows": 0,
        }  # fmt: skip
        arguments.update(changes)
        return model._model.forward(**arguments)

    return run


def _small_cache() -> Any:
    model = build(fresh())
    cache = model.new_cache()
    cache.reserve(1)
    keys = [k[:, :1].contiguous() for k in cache.keys]
    values = [v[:, :1].contiguous() for v in cache.values]
    return model._model.forward(torch.tensor([1, 2, 3]), keys, values, 0, 1, 0)


def _wrong_cache_heads() -> Any:
    model = build(fresh())
    keys = [torch.zeros(1, 8, 64)]
    return model._model.forward(torch.tensor([1]), keys, keys, 0, 1, 0)


ABUSES: dict[str, Callable[[], Any]] = {
    "1024 heads": with_shape(heads=1024, kv_heads=1024),
    "3 key/value heads": with_shape(kv_heads=3),
    "no key/value heads": with_shape(kv_heads=0),
    "heads 128 wide": _heads_128_wide,
    "heads 40 wide": with_shape(head_dim=40),
    "no layers": _no_layers,
    "an embedding wider than the layers": _wider_embedding,
    "a scale array cut short": _short_scales,
    "rows past the channel blocks": _rows_past_the_blocks,
    "a norm too short": _short_norm,
    "a negative window": _negative_window,
    "an id past the embedding": _forward([1, 5000]),
    "a negative id": _forward([-1]),
    "no ids": _forward([]),
    "a negative past": _forward([1], past=-4),
    "more logits than rows": _forward([1], n_logits=2),
    "a K/V cache too small": _small_cache,
    "a K/V cache of the wrong shape": _wrong_cache_heads,
    "a negative head_rows": _forward([1], head_rows=-1),
}


def run_all() -> None:
    """Every abuse must raise a Python error (the sanitized runner calls this: any read or write
    past a buffer on the way ends the process with a report instead)."""
    failures = []
    for name, abuse in ABUSES.items():
        try:
            abuse()
        except (ValueError, RuntimeError, IndexError):
            continue
        failures.append(name)
    build(fresh())(torch.tensor([[1, 5, 9]]), None, logits_to_keep=3)  # and a valid pass runs clean
    if failures:
        raise AssertionError(f"not refused: {failures}")
