"""NativeCausalLM: a Llama / Qwen2 decoder run entirely by qgemm.cpp, on block-quantized weights.

The whole forward (embedding lookup, norms, rotary attention, MLP, head) runs in C++ with the GIL
released, so a decoding step costs the weights' bytes and little else. Every row of a pass is
computed exactly as a one-row pass computes it (see qgemm.cpp), so speculative decoding on this
model reproduces plain decoding on it bit for bit.

It answers the calls :class:`specchat.engine.kv.CachedLM` makes, like the lean forward
(:mod:`specchat.models.lean`): ``model(input_ids=…, cache=…, logits_to_keep=n)`` returning
``.logits`` and ``.cache``, plus ``config``, ``device``, ``generation_config`` and
``get_output_embeddings``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from specchat.kernels import load
from specchat.kernels.formats import (
    CHANNELS,
    Unpacked,
    pack,
    quantize_q4,
    quantize_q8,
    unpack_bf16,
    unpack_f16,
    unpack_f32,
    unpack_q4_0,
    unpack_q4_1,
    unpack_q4_k,
    unpack_q5_0,
    unpack_q5_1,
    unpack_q5_k,
    unpack_q6_k,
    unpack_q8_0,
)
from specchat.kernels.qlinear import qmat_from_tensors
from specchat.models.architectures import BY_MODEL_TYPE, BY_NAME, GGUF_TENSOR_NAMES
from specchat.models.lean import LeanCache, LeanOutput

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
    cache's file writer, specchat.models.packed_stream)."""

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

    def add_matrix(self, name: str, matrix: Unpacked) -> None:
        self.add_matrix_parts(name, [matrix], matrix.shape[0])

    def add_matrix_parts(self, name: str, parts: Iterable[Unpacked], rows: int) -> None:
        """A matrix of ``rows`` rows given as consecutive row ranges, each a multiple of CHANNELS
        rows but the last: the kernels' layout groups rows by CHANNELS, so packing each range
        gives the same arrays as packing the whole, a range at a time."""
        total = -(-rows // CHANNELS)
        first = 0
        pieces: dict[str, list[np.ndarray]] = {}
        for part in parts:
            if first == 0:
                self.matrices[name] = MatrixMeta(part.kind, part.super_block, part.offset, rows)
            packed = pack(part)
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


def _rope_inverse_frequencies(shape: Shape) -> torch.Tensor:
    dim = shape.head_dim
    return 1.0 / (shape.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def pack_hf(
    hf_model: Any,
    *,
    bits: int = 4,
    head_rows: int | None = None,
    on_layer: Callable[[int, int], None] | None = None,
) -> PackedModel:
    """Quantize a loaded Hugging Face Llama / Qwen2 model for the kernels (tests, drafts, HF folders).

    ``bits`` 4 quantizes every matrix to q4, 8 to q8; ``head_rows`` keeps only the first ids of
    the output head (drafts only: see specchat.models.cpu_quant's narrow head); ``on_layer`` as
    in :func:`pack_gguf`.
    """
    from specchat.models.lean import lean_supported

    reason = lean_supported(hf_model, for_kernels=True)
    if reason is not None:
        raise ValueError(f"the native forward cannot run this model: {reason}")
    config = hf_model.config
    inner = hf_model.model
    heads = config.num_attention_heads
    head = hf_model.get_output_embeddings().weight.detach().float()
    if head_rows is not None:
        head = head[:head_rows]
    shape = Shape(
        layers=len(inner.layers),
        hidden=config.hidden_size,
        heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        vocab=int(head.shape[0]),
        eps=float(config.rms_norm_eps),
        rope_theta=float(getattr(config, "rope_theta", 10000.0)),
    )
    architecture = BY_MODEL_TYPE[config.model_type]
    rotary = inner.rotary_emb
    packed = PackedModel(shape, 1.0, {}, {}, _hf_decoder_options(hf_model, architecture.activation))
    _hf_rotary(packed, rotary, packed.options)
    quantize = quantize_q4 if bits == 4 else quantize_q8
    packed.add_matrix("embed", quantize(inner.embed_tokens.weight.detach().float().numpy()))
    packed.add_matrix("head", quantize(head.numpy()))
    shift = 1.0 if architecture.norm == "rms+1" else 0.0  # Gemma's norms scale by 1 + w
    packed.tensors["norm"] = inner.norm.weight.detach().float() + shift
    for i, layer in enumerate(inner.layers):
        for part, (weight, bias) in _hf_projections(layer, shape).items():
            name = f"layers.{i}.{part}"
            packed.add_matrix(name, quantize(weight.detach().float().numpy()))
            if bias is not None:
                packed.tensors[f"{name}.bias"] = bias.detach().float().clone()
        for part, norm in _hf_norms(layer, architecture.norm_placement).items():
            packed.tensors[f"layers.{i}.{part}"] = norm.weight.detach().float() + shift
        if on_layer is not None:
            on_layer(i + 1, shape.layers)
    return packed


def _hf_norms(layer: Any, placement: str) -> dict[str, Any]:
    """A Hugging Face layer's norms under specchat's names. In a Llama layer the norm before the
    MLP is called post_attention_layernorm; in a Gemma layer that name is the attention output's
    norm, and the one before the MLP is pre_feedforward_layernorm."""
    attn = layer.self_attn
    norms = {"attn_norm": layer.input_layernorm}
    if placement == "pre+post":
        norms |= {
            "post_attn_norm": layer.post_attention_layernorm,
            "ffn_norm": layer.pre_feedforward_layernorm,
            "post_ffn_norm": layer.post_feedforward_layernorm,
        }
    else:
        norms["ffn_norm"] = layer.post_attention_layernorm
    if hasattr(attn, "q_norm"):
        norms |= {"q_norm": attn.q_norm, "k_norm": attn.k_norm}
    return norms


def _hf_decoder_options(hf_model: Any, activation: str) -> DecoderOptions:
    config = hf_model.config
    embed_scale = getattr(hf_model.model.embed_tokens, "scalar_embed_scale", None)
    pre_attn = getattr(config, "query_pre_attn_scalar", None)
    layer_types = getattr(config, "layer_types", None) or ()
    local = tuple(kind == "sliding_attention" for kind in layer_types)
    window = int(getattr(config, "sliding_window", None) or 0)
    return DecoderOptions(
        activation=activation,
        embed_scale=float(np.float32(embed_scale)) if embed_scale is not None else 1.0,
        attn_scale=float(np.float32(pre_attn**-0.5)) if pre_attn else 0.0,
        windows=tuple(window if is_local else 0 for is_local in local) if any(local) else (),
        local_rope=local if any(local) else (),
    )


def _hf_rotary(packed: PackedModel, rotary: Any, options: DecoderOptions) -> None:
    """The rotary frequencies (and their magnitude) the model's rotary module computed; Gemma 3
    keeps one set per layer type."""
    if hasattr(rotary, "inv_freq"):
        packed.tensors["inv_freq"] = rotary.inv_freq.detach().float().clone()
        packed.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        return
    # A model whose layers are all windowed has only the sliding set: it serves as both.
    kind = "full_attention" if hasattr(rotary, "full_attention_inv_freq") else "sliding_attention"
    packed.tensors["inv_freq"] = getattr(rotary, f"{kind}_inv_freq").detach().float().clone()
    packed.rope_scale = float(getattr(rotary, f"{kind}_attention_scaling"))
    if options.local_rope:
        packed.tensors["inv_freq_local"] = rotary.sliding_attention_inv_freq.detach().float().clone()
        packed.options = replace(options, rope_scale_local=float(rotary.sliding_attention_attention_scaling))


def _hf_projections(layer: Any, shape: Shape) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """A Hugging Face decoder layer's seven projections as (weight, bias), fused ones split by rows."""
    attn, mlp = layer.self_attn, layer.mlp
    if hasattr(attn, "qkv_proj"):  # Phi-3
        q_rows, kv_rows = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
        q, k, v = attn.qkv_proj.weight.split([q_rows, kv_rows, kv_rows])
        gate, up = mlp.gate_up_proj.weight.chunk(2)
        return {
            "q": (q, None), "k": (k, None), "v": (v, None), "o": (attn.o_proj.weight, None),
            "gate": (gate, None), "up": (up, None), "down": (mlp.down_proj.weight, None),
        }  # fmt: skip
    modules = {
        "q": attn.q_proj, "k": attn.k_proj, "v": attn.v_proj, "o": attn.o_proj,
        "gate": mlp.gate_proj, "up": mlp.up_proj, "down": mlp.down_proj,
    }  # fmt: skip
    return {part: (module.weight, module.bias) for part, module in modules.items()}


def from_hf(hf_model: Any, *, bits: int = 4, head_rows: int | None = None) -> NativeCausalLM:
    """:func:`pack_hf`, then the model (tests)."""
    packed = pack_hf(hf_model, bits=bits, head_rows=head_rows)
    return native_model(packed, hf_model.config, getattr(hf_model, "generation_config", None))


# ------------------------------------------------------------------------------ from GGUF
KEPT_TYPES: dict[str, dict[str, Callable[[np.ndarray, int, int], Unpacked]]] = {
    "gguf": {
        "Q4_K": unpack_q4_k,
        "Q6_K": unpack_q6_k,
        "Q8_0": unpack_q8_0,
        "Q4_0": unpack_q4_0,
        "Q4_1": unpack_q4_1,
        "Q5_0": unpack_q5_0,
        "Q5_K": unpack_q5_k,
        "Q5_1": unpack_q5_1,
        "F16": unpack_f16,
        "BF16": unpack_bf16,
        "F32": unpack_f32,
    },
    "q4": {"Q4_K": unpack_q4_k, "Q4_0": unpack_q4_0, "Q4_1": unpack_q4_1},
    "q8": {},
}
"""Per packing mode, the GGUF block types whose weights the kernels read unchanged, and how each is
unpacked: "gguf" keeps every type a kernel format holds exactly; "q4" (drafts) keeps only the
4-bit ones, since a draft's bytes per step set its speed; "q8" keeps none. Any other type
(Q2_K, Q3_K, the IQ types…) is dequantized and requantized to the mode's format."""


def _gguf_rotary_frequencies(
    shape: Shape, scaling: str, factor: float, freq_factors: np.ndarray | None
) -> torch.Tensor:
    """The rotary frequencies llama.cpp uses for a GGUF: base^(−2i/d), divided by the file's
    per-frequency factors (``rope_freqs``: how its converter writes Llama 3.x scaling) and by a
    linear scaling factor."""
    inv_freq = _rope_inverse_frequencies(shape)
    if freq_factors is not None:
        if freq_factors.shape != (shape.head_dim // 2,):
            raise ValueError(
                f"rope_freqs holds {freq_factors.size} factors for {shape.head_dim // 2} frequencies"
            )
        inv_freq = inv_freq / torch.from_numpy(freq_factors.copy())
    if scaling == "linear":  # the only other scaling gguf_problem lets through
        inv_freq = inv_freq / factor
    return inv_freq


GEMMA3_WINDOW_PATTERN = 6
"""Gemma 3 layers attend through a window but every sixth (llama.cpp's swa pattern; the same as
transformers' layer_types); those windowed layers rotate with base 10000, unscaled."""
GEMMA3_LOCAL_ROPE_BASE = 10000.0


def _gguf_windows(packed: PackedModel, window: int, shape: Shape) -> None:
    """Gemma 3's windowed layers, as llama.cpp reads them from a GGUF (it stores only the window)."""
    if window <= 0:
        return
    local = tuple(i % GEMMA3_WINDOW_PATTERN < GEMMA3_WINDOW_PATTERN - 1 for i in range(shape.layers))
    packed.tensors["inv_freq_local"] = _rope_inverse_frequencies(
        replace(shape, rope_theta=GEMMA3_LOCAL_ROPE_BASE)
    )
    packed.options = replace(
        packed.options, windows=tuple(window if w else 0 for w in local), local_rope=local
    )


def split_qkv(qkv: Unpacked, shape: Shape) -> dict[str, Unpacked]:
    """A fused [q; k; v] matrix as three (rows are output channels: a split keeps every weight)."""
    q_rows, kv_rows = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    bounds = {
        "q": (0, q_rows),
        "k": (q_rows, q_rows + kv_rows),
        "v": (q_rows + kv_rows, q_rows + 2 * kv_rows),
    }
    if qkv.shape[0] != q_rows + 2 * kv_rows:
        raise ValueError(f"a fused q/k/v matrix of {qkv.shape[0]} rows, expected {q_rows + 2 * kv_rows}")
    return {part: qkv.take_rows(np.arange(*bound)) for part, bound in bounds.items()}


def split_gate_up(gate_up: Unpacked) -> dict[str, Unpacked]:
    """A fused [gate; up] matrix (Phi-3's gate_up_proj, llama.cpp's phi3 ffn_up) as two."""
    inter = gate_up.shape[0] // 2
    return {"gate": gate_up.take_rows(np.arange(inter)), "up": gate_up.take_rows(np.arange(inter, 2 * inter))}


def _unpermute_order(rows: int, heads: int) -> np.ndarray:
    """Row order that undoes llama.cpp's q/k permutation (transformers' reverse_permute_weights)."""
    order = np.arange(rows).reshape(heads, rows // heads // 2, 2)
    return order.swapaxes(2, 1).reshape(rows)


def gguf_tensor_name(name: str) -> str:
    """specchat's tensor name → the GGUF file's."""
    if not name.startswith("layers."):
        return GGUF_TENSOR_NAMES[name]
    _, index, part, *rest = name.split(".")
    suffix = "bias" if rest == ["bias"] else "weight"
    return f"blk.{index}.{GGUF_TENSOR_NAMES[part]}.{suffix}"


PACK_ROWS = 4096
"""Rows of a matrix unpacked and packed at a time when streaming (a multiple of CHANNELS): a 7B
model's embedding at once would take about 2 GB of temporaries, 4096 of its rows about 50 MB."""


def pack_gguf(
    path: str,
    *,
    mode: str = "gguf",
    head_rows: int | None = None,
    on_layer: Callable[[int, int], None] | None = None,
    sink: MatrixSink | None = None,
    source: Any = None,
) -> PackedModel:
    """The kernels' tensors straight from a GGUF file's quantized blocks.

    ``mode`` "gguf": keep the tensors of every type in :data:`KEPT_TYPES` as they are (the target:
    the very weights llama.cpp reads), requantizing any other type to q8; "q4": keep the 4-bit
    types, requantize the rest to q4 (drafts, fewer bytes); "q8": requantize everything to q8.
    ``on_layer(done, layers)`` runs after each layer: progress for the caller, and the point where
    it may raise to abandon packing.

    The file goes through specchat's validation layer first (:func:`read_gguf`, then
    :func:`decoder_dims`): every dimension used here is one the tensors were checked to hold, and
    a file whose metadata disagrees with them is refused (ModelLoadError) before anything is packed.

    ``sink``: each matrix goes there a range of rows at a time, read from the memory-mapped file
    and released from memory once written (see :class:`PackedModel`), so packing a model needs
    little more memory than one range of rows; without, the whole packed model is returned.
    ``source``: the file as :func:`read_gguf` returned it, when the caller read it already.
    """
    if mode not in KEPT_TYPES:
        raise ValueError(f"unknown packing mode {mode!r}")
    import gguf

    from specchat.models.gguf_check import read_gguf
    from specchat.models.gguf_shape import decoder_dims, gguf_problem

    if source is None:
        source = read_gguf(Path(path))
    arch = source.architecture or "?"
    problem = gguf_problem(source)
    if problem is None:
        dims = decoder_dims(source)
        problem = gguf_problem(source, dims)
    if problem is not None:
        raise ValueError(f"{problem}: use --cpu-path int8/dyn8+head32768 or none")
    tensors = source.tensors
    hidden = dims.hidden
    head_name = "token_embd.weight" if dims.tied else "output.weight"
    vocab = dims.head_rows
    shape = Shape(
        layers=dims.layers,
        hidden=hidden,
        heads=dims.heads,
        kv_heads=dims.kv_heads,
        head_dim=dims.head_dim,
        vocab=min(vocab, head_rows) if head_rows else vocab,
        eps=dims.eps,
        rope_theta=dims.rope_theta,
    )
    factors = (
        np.asarray(source.tensor_data("rope_freqs.weight"), np.float32).reshape(-1)
        if "rope_freqs.weight" in tensors
        else None
    )
    inv_freq = _gguf_rotary_frequencies(shape, dims.rope_scaling, dims.rope_factor, factors)

    step = PACK_ROWS if sink is not None else None

    def parts(name: str, rows: int | None = None, step: int | None = step) -> Iterator[Unpacked]:
        """The tensor ``name`` (its first ``rows`` rows) as ranges of ``step`` rows (all at once:
        None), in the kernels' formats."""
        tensor = tensors[name]
        k, n = tensor.dims[0], tensor.dims[1]
        raw = np.asarray(source.tensor_data(name))
        kept = KEPT_TYPES[mode].get(tensor.type_name)
        count = n if rows is None else min(rows, n)
        for start in range(0, count, step or count):
            part = raw[start : min(count, start + (step or count))]
            if kept is not None and rows is None:
                yield kept(part, part.shape[0], k)
            else:
                weights = gguf.quants.dequantize(part, tensor.ggml_type).reshape(-1, k)
                yield (quantize_q4 if mode == "q4" else quantize_q8)(weights)
        del raw
        source.release(name)

    def matrix(name: str, rows: int | None = None) -> Unpacked:
        [whole] = parts(name, rows, step=None)
        return whole

    def add_streamed(name: str, gguf_name: str, rows: int | None = None) -> None:
        count = tensors[gguf_name].dims[1] if rows is None else min(rows, tensors[gguf_name].dims[1])
        packed.add_matrix_parts(name, parts(gguf_name, rows), count)

    def vector(name: str) -> torch.Tensor:
        tensor = tensors[name]
        values = gguf.quants.dequantize(np.asarray(source.tensor_data(name)), tensor.ggml_type)
        return torch.from_numpy(np.asarray(values, dtype=np.float32).reshape(-1).copy())

    packed = PackedModel(shape, 1.0, {}, {"inv_freq": inv_freq}, sink=sink)
    add_streamed("embed", "token_embd.weight")
    narrow = head_rows if head_rows is not None and head_rows < vocab else None
    add_streamed("head", head_name, narrow)
    packed.tensors["norm"] = vector("output_norm.weight")
    architecture = BY_NAME[arch]

    def layer_matrices(i: int) -> dict[str, Unpacked]:
        """Layer i's projections that need the whole matrix at once: a family that fuses them
        (q/k/v, gate/up) has its rows split, one that permutes q and k has them unpermuted."""
        if not architecture.fused_qkv:
            whole = ("q", "k") if architecture.qk_permuted_in_gguf else ()
            return {part: matrix(gguf_tensor_name(f"layers.{i}.{part}")) for part in whole}
        return {
            **split_qkv(matrix(f"blk.{i}.attn_qkv.weight"), shape),
            **split_gate_up(matrix(f"blk.{i}.ffn_up.weight")),
            "o": matrix(gguf_tensor_name(f"layers.{i}.o")),
            "down": matrix(gguf_tensor_name(f"layers.{i}.down")),
        }

    for i in range(shape.layers):
        projections = layer_matrices(i)
        for part in PROJECTIONS:
            name = f"layers.{i}.{part}"
            if part not in projections:
                add_streamed(name, gguf_tensor_name(name))
            else:
                weights = projections.pop(part)
                if architecture.qk_permuted_in_gguf and part in ("q", "k"):
                    heads_of = shape.heads if part == "q" else shape.kv_heads
                    weights = weights.take_rows(_unpermute_order(weights.shape[0], heads_of))
                packed.add_matrix(name, weights)
            bias = gguf_tensor_name(f"{name}.bias")
            if bias in tensors:
                packed.tensors[f"{name}.bias"] = vector(bias)
        for part in ("attn_norm", "ffn_norm", *EXTRA_NORMS):
            name = gguf_tensor_name(f"layers.{i}.{part}")
            if part in ("attn_norm", "ffn_norm") or name in tensors:
                packed.tensors[f"layers.{i}.{part}"] = vector(name)
        if on_layer is not None:
            on_layer(i + 1, shape.layers)
    if architecture.sliding_window:
        _gguf_windows(packed, dims.window, shape)
    if architecture.activation != "silu" or architecture.embedding_scale:
        packed.options = replace(
            packed.options,
            activation=architecture.activation,
            embed_scale=float(np.float32(math.sqrt(hidden))) if architecture.embedding_scale else 1.0,
        )
    return packed
