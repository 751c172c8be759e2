"""Packing a model for specchat's kernels: a GGUF file's tensors (:func:`pack_gguf`, at their own
bits where a kernel format holds them exactly) or a loaded Hugging Face model's (:func:`pack_hf`,
quantized), into the :class:`~specchat.kernels.native.PackedModel` the native decoder runs on.
The architecture table (:mod:`specchat.models.architectures`) says what each family needs; the
GGUF validation layer (:mod:`specchat.models.gguf.check`, :mod:`specchat.models.gguf.shape`) has
checked a file before any of it is packed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specchat.kernels.formats import (
    Unpacked,
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
from specchat.kernels.native import (
    EXTRA_NORMS,
    PROJECTIONS,
    DecoderOptions,
    MatrixSink,
    NativeCausalLM,
    PackedModel,
    Shape,
    native_model,
)
from specchat.kernels.repack import NATIVE_TYPES, Packed, repack
from specchat.models.architectures import BY_MODEL_TYPE, BY_NAME, GGUF_TENSOR_NAMES


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
    """Quantize a loaded Hugging Face model for the kernels (tests, drafts, HF folders): any family
    the architecture table (specchat.models.architectures) runs on the fast path.

    ``bits`` 4 quantizes every matrix to q4, 8 to q8; ``head_rows`` keeps only the first ids of
    the output head (drafts only: see specchat.models.compute.cpu_quant's narrow head); ``on_layer`` as
    in :func:`pack_gguf`.
    """
    from specchat.models.compute.lean import lean_supported

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
    native: bool = True,
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
    ``native``: kept types are laid out by :func:`specchat.kernels.repack.repack` (False: by
    numpy, the reference it matches byte for byte; slower by an order of magnitude).
    """
    if mode not in KEPT_TYPES:
        raise ValueError(f"unknown packing mode {mode!r}")
    from specchat.models.gguf.check import read_gguf
    from specchat.models.gguf.shape import decoder_dims, gguf_problem

    if source is None:
        source = read_gguf(Path(path))
    problem = gguf_problem(source)
    if problem is None:
        dims = decoder_dims(source)
        problem = gguf_problem(source, dims)
    if problem is not None:
        raise ValueError(f"{problem}: use --cpu-path int8/dyn8+head32768 or none")
    packer = GgufPacker(source, dims, mode=mode, head_rows=head_rows, sink=sink, native=native)
    return packer.pack(on_layer)


class GgufPacker:
    """Packs one validated GGUF file (``source`` as :func:`read_gguf` returned it, ``dims`` as
    :func:`decoder_dims` read them) for the kernels: see :func:`pack_gguf` for the arguments.

    A matrix comes out of the file either streamed (a range of rows at a time, into the sink) or
    whole, where a layer's rows must be split (fused q/k/v, gate/up) or reordered (llama.cpp's
    q/k permutation); norms and biases are dequantized to float vectors.
    """

    def __init__(
        self,
        source: Any,
        dims: Any,
        *,
        mode: str,
        head_rows: int | None,
        sink: MatrixSink | None,
        native: bool,
    ) -> None:
        self.source = source
        self.tensors = source.tensors
        self.dims = dims
        self.mode = mode
        self.head_rows = head_rows
        self.native = native
        self.architecture = BY_NAME[source.architecture or "?"]
        self.shape = Shape(
            layers=dims.layers,
            hidden=dims.hidden,
            heads=dims.heads,
            kv_heads=dims.kv_heads,
            head_dim=dims.head_dim,
            vocab=min(dims.head_rows, head_rows) if head_rows else dims.head_rows,
            eps=dims.eps,
            rope_theta=dims.rope_theta,
        )
        self.step = PACK_ROWS if sink is not None else None
        self.packed = PackedModel(self.shape, 1.0, {}, {"inv_freq": self._inv_freq()}, sink=sink)

    def pack(self, on_layer: Callable[[int, int], None] | None = None) -> PackedModel:
        """The packed model: embedding, head and final norm, then each layer (``on_layer`` after
        each), then the family's options."""
        dims, packed = self.dims, self.packed
        self._add_streamed("embed", "token_embd.weight")
        head_name = "token_embd.weight" if dims.tied else "output.weight"
        narrow = self.head_rows if self.head_rows is not None and self.head_rows < dims.head_rows else None
        self._add_streamed("head", head_name, narrow)
        packed.tensors["norm"] = self._vector("output_norm.weight")
        for i in range(self.shape.layers):
            self._pack_layer(i)
            if on_layer is not None:
                on_layer(i + 1, self.shape.layers)
        self._family_options()
        return packed

    def _inv_freq(self) -> torch.Tensor:
        factors = (
            np.asarray(self.source.tensor_data("rope_freqs.weight"), np.float32).reshape(-1)
            if "rope_freqs.weight" in self.tensors
            else None
        )
        return _gguf_rotary_frequencies(self.shape, self.dims.rope_scaling, self.dims.rope_factor, factors)

    def _pack_layer(self, i: int) -> None:
        """Layer i's projections (with their biases) and norms."""
        packed, tensors = self.packed, self.tensors
        projections = self._layer_matrices(i)
        for part in PROJECTIONS:
            name = f"layers.{i}.{part}"
            if part not in projections:
                self._add_streamed(name, gguf_tensor_name(name))
            else:
                packed.add_matrix(name, projections.pop(part))
            bias = gguf_tensor_name(f"{name}.bias")
            if bias in tensors:
                packed.tensors[f"{name}.bias"] = self._vector(bias)
        for part in ("attn_norm", "ffn_norm", *EXTRA_NORMS):
            name = gguf_tensor_name(f"layers.{i}.{part}")
            if part in ("attn_norm", "ffn_norm") or name in tensors:
                packed.tensors[f"layers.{i}.{part}"] = self._vector(name)

    def _family_options(self) -> None:
        """What the family changes in the forward: windowed layers, activation, embedding scale."""
        architecture = self.architecture
        if architecture.sliding_window:
            _gguf_windows(self.packed, self.dims.window, self.shape)
        if architecture.activation != "silu" or architecture.embedding_scale:
            scale = float(np.float32(math.sqrt(self.dims.hidden))) if architecture.embedding_scale else 1.0
            self.packed.options = replace(
                self.packed.options, activation=architecture.activation, embed_scale=scale
            )

    def _keeps_native(self, type_name: str) -> bool:
        """Whether a tensor of this type is kept at its own bits and laid out natively."""
        return self.native and KEPT_TYPES[self.mode].get(type_name) is not None and type_name in NATIVE_TYPES

    def _parts(
        self, name: str, rows: int | None = None, step: int | None = None, laid_out: bool = True
    ) -> Iterator[Unpacked | Packed]:
        """The tensor ``name`` (its first ``rows`` rows) as ranges of ``step`` rows (all at once:
        None), in the kernels' formats; ``laid_out``: a kept type's rows come already in the
        kernels' layout (natively: the same bytes, on every core)."""
        import gguf

        tensor = self.tensors[name]
        k, n = tensor.dims[0], tensor.dims[1]
        raw = np.asarray(self.source.tensor_data(name))
        kept = KEPT_TYPES[self.mode].get(tensor.type_name)
        count = n if rows is None else min(rows, n)
        for start in range(0, count, step or count):
            part = raw[start : min(count, start + (step or count))]
            if rows is None and laid_out and self._keeps_native(tensor.type_name):
                yield repack(part, tensor.type_name, part.shape[0], k)
            elif kept is not None and rows is None:
                yield kept(part, part.shape[0], k)
            else:
                weights = gguf.quants.dequantize(part, tensor.ggml_type).reshape(-1, k)
                yield (quantize_q4 if self.mode == "q4" else quantize_q8)(weights)
        del raw
        self.source.release(name)

    def _matrix(self, name: str) -> Unpacked:
        """The whole tensor ``name`` at once, in numpy's layout (its rows may be split or reordered)."""
        [whole] = self._parts(name, laid_out=False)
        assert isinstance(whole, Unpacked)
        return whole

    def _add_streamed(self, name: str, gguf_name: str, rows: int | None = None) -> None:
        n = self.tensors[gguf_name].dims[1]
        count = n if rows is None else min(rows, n)
        self.packed.add_matrix_parts(name, self._parts(gguf_name, rows, self.step), count)

    def _vector(self, name: str) -> torch.Tensor:
        import gguf

        tensor = self.tensors[name]
        values = gguf.quants.dequantize(np.asarray(self.source.tensor_data(name)), tensor.ggml_type)
        return torch.from_numpy(np.asarray(values, dtype=np.float32).reshape(-1).copy())

    def _unpermuted(self, part: str, i: int) -> Unpacked | Packed:
        """Layer i's q or k matrix with llama.cpp's permutation of its rows undone."""
        name = gguf_tensor_name(f"layers.{i}.{part}")
        tensor = self.tensors[name]
        k, n = tensor.dims[0], tensor.dims[1]
        order = _unpermute_order(n, self.shape.heads if part == "q" else self.shape.kv_heads)
        if self._keeps_native(tensor.type_name):
            whole = repack(np.asarray(self.source.tensor_data(name)), tensor.type_name, n, k, order)
            self.source.release(name)
            return whole
        return self._matrix(name).take_rows(order)

    def _layer_matrices(self, i: int) -> dict[str, Unpacked | Packed]:
        """Layer i's projections that need the whole matrix at once: a family that fuses them
        (q/k/v, gate/up) has its rows split, one that permutes q and k has them unpermuted."""
        architecture = self.architecture
        if not architecture.fused_qkv:
            whole = ("q", "k") if architecture.qk_permuted_in_gguf else ()
            return {part: self._unpermuted(part, i) for part in whole}
        return {
            **split_qkv(self._matrix(f"blk.{i}.attn_qkv.weight"), self.shape),
            **split_gate_up(self._matrix(f"blk.{i}.ffn_up.weight")),
            "o": self._matrix(gguf_tensor_name(f"layers.{i}.o")),
            "down": self._matrix(gguf_tensor_name(f"layers.{i}.down")),
        }
