"""NativeCausalLM: a decoder of any of the supported families run entirely by qgemm.cpp, on
block-quantized weights; PackedModel, the plain tensors it runs on (made by
:mod:`specchat.models.compute.packing` from a GGUF file or a Hugging Face model, stored by the packed cache).

The whole forward (embedding lookup, norms, rotary attention, MLP, head) runs in C++ with the GIL
released, so a decoding step costs the weights' bytes and little else. Every row of a pass is
computed exactly as a one-row pass computes it (see qgemm.cpp), so speculative decoding on this
model reproduces plain decoding on it bit for bit.

It answers the calls :class:`specchat.engine.kv.CachedLM` makes, like the lean forward
(:mod:`specchat.models.compute.lean`): ``model(input_ids=…, cache=…, logits_to_keep=n)`` returning
``.logits`` and ``.cache``, plus ``config``, ``device``, ``generation_config`` and
``get_output_embeddings``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np
import torch

from specchat.kernels import load
from specchat.kernels.formats import (
    CHANNELS,
    Unpacked,
    pack,
)
from specchat.kernels.lm import LeanCache, LeanOutput
from specchat.kernels.qlinear import qmat_from_tensors
from specchat.kernels.repack import Packed

PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")
EXTRA_NORMS = ("q_norm", "k_norm", "post_attn_norm", "post_ffn_norm")
"""Per-layer norms some families add to a Llama layer: over each q and k head before the rotation
(Qwen3, Gemma 3), and on the attention's and the MLP's outputs before the residual sum (Gemma)."""


@dataclass(frozen=True)
class Shape:
    """The decoder's dimensions, from a Hugging Face config or GGUF metadata."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    eps: float
    rope_theta: float


@dataclass(frozen=True)
class DecoderOptions:
    """What a family computes beyond a Llama decoder; the defaults are Llama's."""

    activation: str = "silu"
    """Of the gated MLP: "silu" or "gelu_tanh"."""
    embed_scale: float = 1.0
    """Embeddings are multiplied by this (Gemma: √hidden)."""
    attn_scale: float = 0.0
    """Attention logits are multiplied by this; 0: 1/√head_dim."""
    windows: tuple[int, ...] = ()
    """Per layer, how many of the latest positions it attends to (0: all); empty: all, everywhere."""
    local_rope: tuple[bool, ...] = ()
    """Per layer, whether it rotates with ``inv_freq_local`` (Gemma 3's sliding layers)."""
    rope_scale_local: float = 1.0

    @property
    def is_llama(self) -> bool:
        return self == DecoderOptions()


class _Head:
    """Stands in for the output layer: CachedLM asks its weight's shape for the vocabulary width."""

    def __init__(self, vocab: int, hidden: int) -> None:
        self.weight = torch.empty(vocab, hidden, device="meta")


class NativeCausalLM:
    """The decoding forward of a Llama-style model on specchat's CPU kernels."""

    def __init__(
        self,
        model: Any,
        shape: Shape,
        config: Any,
        generation_config: Any = None,
        input_rows: int | None = None,
    ) -> None:
        self._model = model
        self.shape = shape
        self.input_rows = input_rows if input_rows is not None else shape.vocab
        """Rows of the embedding: every id a pass is given must be below it (the decoder checks)."""
        self.config = config
        self.generation_config = generation_config
        self._head = _Head(shape.vocab, shape.hidden)
        self.narrow_head: int | None = None
        """Head rows a pass computes by default (None: all of them). A draft narrows its head to
        its most frequent ids, the fewer bytes per drafted token, and its drafter widens it for
        text that needs the rest (see specchat.engine.drafters.ModelDrafter)."""
        self.rows_exact = True
        """Each row's logits are the same bits whatever the width of the pass it is in (the
        kernels' guarantee, tests/kernels/test_native.py), so a drafter may read the tokens it is
        behind on in the pass it drafts from (see specchat.engine.drafters.ModelDrafter)."""

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def get_output_embeddings(self) -> _Head:
        return self._head

    def new_cache(self) -> LeanCache:
        s = self.shape
        return LeanCache(s.layers, s.kv_heads, s.head_dim, torch.float32)

    def __call__(
        self,
        input_ids: torch.Tensor,
        cache: Any = None,
        use_cache: bool = True,
        logits_to_keep: int = 1,
        head_rows: int | None = None,
        **_: Any,
    ) -> LeanOutput:
        """``head_rows``: the logits of the first ids only (a draft's head over its most frequent
        ids: the other rows are not read at all); ``narrow_head`` when None."""
        if not isinstance(cache, LeanCache):
            if cache is not None and cache.get_seq_length() != 0:
                raise ValueError("the native forward needs its own cache: pass None or an empty cache")
            cache = self.new_cache()
        ids = input_ids[0]
        past = cache.length
        cache.reserve(past + int(ids.shape[0]))
        rows = head_rows if head_rows is not None else self.narrow_head
        logits = self._model.forward(ids, cache.keys, cache.values, past, logits_to_keep, rows or 0)
        cache.length = past + int(ids.shape[0])
        return LeanOutput(logits[None], cache)


# ------------------------------------------------------------------------------ packed models
@dataclass(frozen=True)
class MatrixMeta:
    kind: str
    super_block: int
    offset: int
    rows: int


class MatrixSink(Protocol):
    """Where a streamed packing puts each matrix's arrays instead of keeping them (the packed
    cache's file writer, specchat.models.compute.packed_stream)."""

    def write_rows(self, name: str, rows: np.ndarray, first: int, total: int) -> None:
        """Rows ``first``… of the array ``name``, which has ``total`` rows in all (its other
        dimensions and its type are those of ``rows``)."""


@dataclass
class PackedModel:
    """Everything the kernels need, as plain tensors: what the packed cache stores.

    ``tensors`` holds each matrix's packed arrays as ``{name}.{q,sc,mn,d,dm}`` and each vector
    (norm weights, biases, ``inv_freq``) under its own name. With a ``sink``, the matrices'
    arrays go there as they are packed and only the vectors stay in ``tensors``: a big model is
    then never held whole in memory.
    """

    shape: Shape
    rope_scale: float
    matrices: dict[str, MatrixMeta]
    tensors: dict[str, torch.Tensor]
    options: DecoderOptions = DecoderOptions()
    sink: MatrixSink | None = None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def add_matrix(self, name: str, matrix: Unpacked | Packed) -> None:
        self.add_matrix_parts(name, [matrix], matrix.rows if isinstance(matrix, Packed) else matrix.shape[0])

    def add_matrix_parts(self, name: str, parts: Iterable[Unpacked | Packed], rows: int) -> None:
        """A matrix of ``rows`` rows given as consecutive row ranges, each a multiple of CHANNELS
        rows but the last: the kernels' layout groups rows by CHANNELS, so packing each range
        gives the same arrays as packing the whole, a range at a time. A range may come already
        laid out (:func:`specchat.kernels.repack.repack`, the same bytes)."""
        total = -(-rows // CHANNELS)
        first = 0
        pieces: dict[str, list[np.ndarray]] = {}
        for part in parts:
            if first == 0:
                self.matrices[name] = MatrixMeta(part.kind, part.super_block, part.offset, rows)
            packed = part.arrays if isinstance(part, Packed) else pack(part)
            for field, array in packed.items():
                if self.sink is not None:
                    self.sink.write_rows(f"{name}.{field}", array, first, total)
                else:
                    pieces.setdefault(field, []).append(array)
            first += next(iter(packed.values())).shape[0]
        if first != total:
            raise ValueError(f"{name}: packed {first * CHANNELS} rows of {rows}")
        for field, arrays in pieces.items():
            whole = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
            self.tensors[f"{name}.{field}"] = torch.from_numpy(whole)

    def matrix_tensors(self, name: str) -> dict[str, torch.Tensor]:
        return {
            f: t
            for f in ("q", "qh", "sc", "mn", "d", "dm")
            if (t := self.tensors.get(f"{name}.{f}")) is not None
        }

    def meta(self) -> dict[str, Any]:
        return {
            "shape": asdict(self.shape),
            "rope_scale": self.rope_scale,
            "matrices": {name: asdict(m) for name, m in self.matrices.items()},
            "options": asdict(self.options),
        }

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], tensors: dict[str, torch.Tensor]) -> PackedModel:
        matrices = {name: MatrixMeta(**m) for name, m in meta["matrices"].items()}
        options: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in meta.get("options", {}).items()
        }
        return cls(
            Shape(**meta["shape"]), float(meta["rope_scale"]), matrices, tensors, DecoderOptions(**options)
        )


def native_model(packed: PackedModel, config: Any, generation_config: Any = None) -> NativeCausalLM:
    """The C++ model over ``packed``'s tensors (memory-mapped ones stay mapped: nothing is copied)."""
    ops = load()

    def mat(name: str) -> Any:
        meta = packed.matrices[name]
        bias = packed.tensors.get(f"{name}.bias")
        return qmat_from_tensors(
            meta.kind, packed.matrix_tensors(name), meta.super_block, meta.offset, meta.rows, bias
        )

    s = packed.shape
    model = ops.Model(
        s.heads, s.kv_heads, s.head_dim, s.eps, packed.tensors["inv_freq"], packed.rope_scale,
        mat("embed"), mat("head"), packed.tensors["norm"],
    )  # fmt: skip
    for i in range(s.layers):
        prefix = f"layers.{i}"
        mats = [mat(f"{prefix}.{p}") for p in PROJECTIONS]
        model.add_layer(packed.tensors[f"{prefix}.attn_norm"], packed.tensors[f"{prefix}.ffn_norm"], *mats)
    _set_family_options(model, packed)
    model.validate()  # every size the decoder will compute with (a ValueError if one disagrees)
    return NativeCausalLM(model, s, config, generation_config, packed.matrices["embed"].rows)


def _set_family_options(model: Any, packed: PackedModel) -> None:
    """What the family computes beyond a Llama layer, told to the C++ decoder (nothing for a Llama)."""
    options = packed.options
    if options.activation not in ("silu", "gelu_tanh"):
        raise ValueError(f"the kernels have no {options.activation!r} activation")
    local_freq = packed.tensors.get("inv_freq_local")
    if not options.is_llama or local_freq is not None:
        gelu = options.activation == "gelu_tanh"
        model.set_options(options.embed_scale, options.attn_scale, gelu, local_freq, options.rope_scale_local)
    for i in range(packed.shape.layers):
        norms = [packed.tensors.get(f"layers.{i}.{name}") for name in EXTRA_NORMS]
        window = options.windows[i] if options.windows else 0
        local = bool(options.local_rope[i]) if options.local_rope else False
        if window or local or any(norm is not None for norm in norms):
            model.set_layer_extras(i, *norms, window, local)
