"""A GGUF model's dimensions, each checked against the tensors that hold it: the only place a GGUF's
numbers become decoder dimensions.

The second half of specchat's validation layer (the first, :mod:`specchat.models.gguf.check`,
walks the bytes). A file whose metadata says 1024 heads while its query matrix holds 4, or whose
embedding has 16 rows for a 320-token vocabulary, would make native code index past its buffers;
here it gets one line naming the key, its value and what the tensors hold instead, before
anything is packed, converted or run. Packing (:func:`specchat.models.compute.packing.pack_gguf`),
``specchat models FILE`` and the conversion for the stock path all take their dimensions from
:func:`decoder_dims` (and :func:`check_metadata` for families the decoders do not know).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from specchat.errors import ModelLoadError
from specchat.models.architectures import BY_NAME, Architecture, fast_path_problem
from specchat.models.gguf.check import GgufFile
from specchat.models.gguf.value_types import ARRAY, FLOAT_TYPES, INTEGER_TYPES, STRING, TYPE_NAMES
from specchat.untrusted import clipped, visible

MAX_DIMENSION = 1 << 31
"""No count or width in a real model comes near this; past it the kernels' 64-bit offsets could
overflow once multiplied together."""
KERNEL_BLOCK = 16
"""The CPU kernels compute head, hidden and MLP widths in blocks of this many values."""
_LAYER = re.compile(r"blk\.(\d+)\.")


class MetadataError(ModelLoadError):
    """A GGUF whose metadata disagrees with its tensors, or holds a value no model can have."""


@dataclass(frozen=True)
class DecoderDims:
    """The decoder's dimensions, as the tensors hold them (the metadata agreed)."""

    architecture: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    """The MLP's width."""
    embed_rows: int
    head_rows: int
    """Rows of the output head (the embedding's when the head is tied to it)."""
    tied: bool
    tokens: int | None
    """The tokenizer's vocabulary size, where the file has one."""
    eps: float
    rope_theta: float
    rope_scaling: str
    rope_factor: float
    window: int
    """Gemma's sliding window (0: none)."""
    context_length: int | None


class _Metadata:
    """Typed access to one architecture's keys, each refusal one line naming the key."""

    def __init__(self, gguf: GgufFile) -> None:
        self.gguf = gguf
        self.arch = gguf.architecture or "?"

    def key(self, suffix: str) -> str:
        return f"{self.arch}.{suffix}"

    def bad(self, message: str) -> MetadataError:
        return MetadataError(f"{self.gguf.name}: {message}")

    def disagrees(self, message: str) -> MetadataError:
        return self.bad(
            f"{message}: the file's metadata disagrees with its tensors (a damaged or hand-edited file)"
        )

    def integer(self, suffix: str, default: int | None = None, *, required: bool = False) -> int | None:
        key = self.key(suffix)
        entry = self.gguf.entries.get(key)
        if entry is None:
            if required:
                raise self.bad(f"{key} is missing")
            return default
        if entry.kind == ARRAY:
            raise self.bad(
                f"{key} holds {entry.count} values (one per layer); specchat's decoders need one for "
                "the whole model"
            )
        if entry.kind not in INTEGER_TYPES:
            raise self.bad(f"{key} is a {TYPE_NAMES.get(entry.kind, entry.kind)}, not a whole number")
        value = int(self.gguf.value(key))
        if not 0 <= value < MAX_DIMENSION:
            raise self.bad(f"{key} is {value:,}, which no model has")
        return value

    def number(self, suffix: str, default: float | None = None, *, required: bool = False) -> float | None:
        key = self.key(suffix)
        entry = self.gguf.entries.get(key)
        if entry is None:
            if required:
                raise self.bad(f"{key} is missing")
            return default
        if entry.kind not in INTEGER_TYPES | FLOAT_TYPES:
            raise self.bad(f"{key} is a {TYPE_NAMES.get(entry.kind, entry.kind)}, not a number")
        return float(self.gguf.value(key))

    def text(self, suffix: str, default: str) -> str:
        key = self.key(suffix)
        entry = self.gguf.entries.get(key)
        if entry is None:
            return default
        if entry.kind != STRING:
            raise self.bad(f"{key} is a {TYPE_NAMES.get(entry.kind, entry.kind)}, not text")
        return str(self.gguf.value(key))


def check_metadata(gguf: GgufFile) -> None:
    """What every GGUF must hold, whatever its family: a norm epsilon that is a small positive
    number, a context of at least one token, an embedding row for every token of the vocabulary."""
    meta = _Metadata(gguf)
    _epsilon(meta)
    _context_length(meta)
    embed = gguf.tensors.get("token_embd.weight")
    if embed is not None:
        _tokens(meta, _rows(embed.dims))


def decoder_dims(gguf: GgufFile) -> DecoderDims:
    """The dimensions of a model of a family specchat's decoders know (BY_NAME), every one checked
    against the tensors; MetadataError (one line: the key, its value, what the tensors hold) when
    they disagree or a value is impossible."""
    meta = _Metadata(gguf)
    family = BY_NAME.get(meta.arch)
    if family is None:
        raise ValueError(f"no decoder dimensions for the {meta.arch!r} family")
    tensors = gguf.tensors
    embed = _tensor(meta, "token_embd.weight", 2)
    hidden = embed.dims[0]
    stated_hidden = meta.integer("embedding_length", required=True)
    if stated_hidden != hidden:
        raise meta.disagrees(
            f"{meta.key('embedding_length')} is {stated_hidden}, but token_embd.weight rows are {hidden} wide"
        )
    layers = _layers(meta, family)
    heads, kv_heads, head_dim = _heads(meta, family, hidden)
    ffn = _ffn(meta, family, hidden)
    for i in range(layers):
        _check_layer(meta, family, i, hidden, heads, kv_heads, head_dim, ffn)
    _check_vector(meta, "output_norm.weight", hidden, required=True)
    embed_rows = _rows(embed.dims)
    tied = "output.weight" not in tensors
    head_rows = embed_rows
    if not tied:
        head = _tensor(meta, "output.weight", 2)
        if head.dims[0] != hidden:
            raise meta.disagrees(
                f"output.weight reads {head.dims[0]} values, but {meta.key('embedding_length')} is {hidden}"
            )
        head_rows = head.dims[1]
        if head_rows > embed_rows:
            raise meta.disagrees(
                f"output.weight has {head_rows} rows but token_embd.weight {embed_rows}: ids the head can "
                "produce would have no embedding"
            )
    tokens = _tokens(meta, embed_rows)
    rope_dims = meta.integer("rope.dimension_count")
    if rope_dims is not None and rope_dims > head_dim:
        raise meta.disagrees(
            f"{meta.key('rope.dimension_count')} is {rope_dims}, but the heads are {head_dim} wide"
        )
    if "rope_freqs.weight" in tensors:
        _check_vector(meta, "rope_freqs.weight", head_dim // 2, required=True)
    return DecoderDims(
        architecture=meta.arch,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        ffn=ffn,
        embed_rows=embed_rows,
        head_rows=head_rows,
        tied=tied,
        tokens=tokens,
        eps=_epsilon(meta),
        rope_theta=_positive(meta, "rope.freq_base", 10000.0),
        rope_scaling=meta.text("rope.scaling.type", "none"),
        rope_factor=_positive(meta, "rope.scaling.factor", 1.0),
        window=(meta.integer("attention.sliding_window", 0) or 0) if family.sliding_window else 0,
        context_length=_context_length(meta),
    )


def gguf_problem(gguf: GgufFile, dims: DecoderDims | None = None) -> str | None:
    """Why specchat's decoders cannot compute the model in a checked GGUF as llama.cpp does (None:
    they can). Packing and ``specchat models FILE`` both ask this, so they never disagree."""
    meta = _Metadata(gguf)
    if problem := fast_path_problem(meta.arch):
        return problem
    names = gguf.tensors
    scaling = meta.text("rope.scaling.type", "none")
    if "rope_factors_short.weight" in names:
        return "LongRoPE scaling (short and long factors) is not supported yet"
    if scaling not in ("none", "linear"):
        shown = visible(clipped(scaling, 40))
        return f"RoPE scaling {shown!r} is not supported yet (linear and Llama 3 factors are)"
    if dims is None:
        return None
    if meta.integer("rope.dimension_count") not in (None, dims.head_dim):
        return "rotary embeddings over part of each head are not supported yet"
    value_width = meta.integer("attention.value_length")
    if value_width not in (None, dims.head_dim):
        return f"values {value_width} wide with keys {dims.head_dim} wide are not supported yet"
    if any(name.endswith("attn_qkv.bias") for name in names):
        return "a fused q/k/v bias is not supported yet"
    for what, width in (("heads", dims.head_dim), ("the hidden state", dims.hidden), ("the MLP", dims.ffn)):
        if width % KERNEL_BLOCK:
            return (
                f"{what} {width} wide: the CPU kernels compute in blocks of {KERNEL_BLOCK} values, so they "
                "run only widths that are multiples of 16"
            )
    return None


# ------------------------------------------------------------------------------ the checks
def _rows(dims: tuple[int, ...]) -> int:
    return math.prod(dims[1:]) if len(dims) > 1 else 1


def _tensor(meta: _Metadata, name: str, ndims: int) -> Any:
    found = meta.gguf.tensors.get(name)
    if found is None:
        raise meta.bad(f"the tensor {name} is missing")
    if len(found.dims) != ndims:
        raise meta.bad(f"the tensor {name} has {len(found.dims)} dimensions, not {ndims}")
    return found


def _check_vector(meta: _Metadata, name: str, size: int, *, required: bool = False) -> None:
    found = meta.gguf.tensors.get(name)
    if found is None:
        if required:
            raise meta.bad(f"the tensor {name} is missing")
        return
    if found.dims != (size,):
        raise meta.disagrees(f"{name} holds {list(found.dims)} values where {size} are needed")


def _check_matrix(meta: _Metadata, name: str, inputs: int, rows: int, about: str) -> None:
    """``name`` is [inputs, rows] (GGUF order), where ``about`` says which keys set them."""
    found = _tensor(meta, name, 2)
    if found.dims[0] != inputs:
        raise meta.disagrees(f"{name} reads {found.dims[0]} values, but {about} make {inputs}")
    if found.dims[1] != rows:
        raise meta.disagrees(f"{name} has {found.dims[1]} rows, but {about} make {rows}")


def _layers(meta: _Metadata, family: Architecture) -> int:
    layers = meta.integer("block_count", required=True)
    assert layers is not None
    present = sorted({int(m.group(1)) for name in meta.gguf.tensors if (m := _LAYER.match(name))})
    held = f"tensors for {len(present)} layer{'s' if len(present) != 1 else ''}"
    if layers < 1:
        raise meta.disagrees(f"{meta.key('block_count')} is {layers}, but the file holds {held}")
    if len(present) != layers or (present and present[-1] != layers - 1):
        raise meta.disagrees(f"{meta.key('block_count')} is {layers}, but the file holds {held}")
    return layers


def _heads(meta: _Metadata, family: Architecture, hidden: int) -> tuple[int, int, int]:
    """(heads, key/value heads, head width), each checked against layer 0's q, k and v rows."""
    heads_key, kv_key = meta.key("attention.head_count"), meta.key("attention.head_count_kv")
    heads = meta.integer("attention.head_count", required=True)
    assert heads is not None
    kv_heads = meta.integer("attention.head_count_kv", heads)
    assert kv_heads is not None
    key_length = meta.integer("attention.key_length")
    if heads < 1:
        raise meta.bad(f"{heads_key} is {heads}; a model has at least one attention head")
    if key_length is not None:
        head_dim, width_from = key_length, f"{meta.key('attention.key_length')} = {key_length}"
    else:
        head_dim, width_from = hidden // heads, f"a head width of {hidden} / {heads} = {hidden // heads}"
    q_rows, k_rows, v_rows = _attention_rows(meta, family, hidden)
    if head_dim < 1 or heads * head_dim != q_rows:
        raise meta.disagrees(
            f"{heads_key} = {heads} and {width_from} make {heads * head_dim} query rows, but layer 0's "
            f"query matrix has {q_rows}"
        )
    if kv_heads < 1:
        raise meta.disagrees(
            f"{kv_key} is {kv_heads}, but layer 0's key matrix has {k_rows} rows of key heads"
        )
    if kv_heads * head_dim != k_rows:
        raise meta.disagrees(
            f"{kv_key} = {kv_heads} makes {kv_heads * head_dim} key rows of {head_dim}, but layer 0's key "
            f"matrix has {k_rows}"
        )
    value_length = meta.integer("attention.value_length")
    if kv_heads * (value_length or head_dim) != v_rows:
        what = (
            f"{meta.key('attention.value_length')} = {value_length}"
            if value_length
            else f"heads {head_dim} wide"
        )
        raise meta.disagrees(
            f"{kv_key} = {kv_heads} and {what} make {kv_heads * (value_length or head_dim)} value rows, "
            f"but layer 0's value matrix has {v_rows}"
        )
    if heads % kv_heads:
        raise meta.bad(
            f"{heads_key} = {heads} query heads cannot share {kv_key} = {kv_heads} key/value heads evenly"
        )
    return heads, kv_heads, head_dim


def _attention_rows(meta: _Metadata, family: Architecture, hidden: int) -> tuple[int, int, int]:
    """Layer 0's q, k and v rows (a fused q/k/v matrix is split as the packer splits it)."""
    if family.fused_qkv:
        qkv = _tensor(meta, "blk.0.attn_qkv.weight", 2)
        if qkv.dims[0] != hidden:
            raise meta.disagrees(
                f"blk.0.attn_qkv.weight reads {qkv.dims[0]} values, but "
                f"{meta.key('embedding_length')} is {hidden}"
            )
        # q has heads × width rows, k and v kv_heads × width each.
        heads = meta.integer("attention.head_count", required=True) or 1
        kv_heads = meta.integer("attention.head_count_kv", heads) or 0
        width = qkv.dims[1] // max(1, heads + 2 * kv_heads)
        return heads * width, qkv.dims[1] - heads * width - kv_heads * width, kv_heads * width
    rows = []
    for part in ("q", "k", "v"):
        tensor = _tensor(meta, f"blk.0.attn_{part}.weight", 2)
        if tensor.dims[0] != hidden:
            raise meta.disagrees(
                f"blk.0.attn_{part}.weight reads {tensor.dims[0]} values, but "
                f"{meta.key('embedding_length')} is {hidden}"
            )
        rows.append(tensor.dims[1])
    return rows[0], rows[1], rows[2]


def _ffn(meta: _Metadata, family: Architecture, hidden: int) -> int:
    down = _tensor(meta, "blk.0.ffn_down.weight", 2)
    ffn = down.dims[0]
    stated = meta.integer("feed_forward_length")
    if stated is not None and stated != ffn:
        raise meta.disagrees(
            f"{meta.key('feed_forward_length')} is {stated}, but blk.0.ffn_down.weight reads {ffn} values"
        )
    return ffn


def _check_layer(
    meta: _Metadata,
    family: Architecture,
    i: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    ffn: int,
) -> None:
    """Every tensor of layer i the packer reads, against the dimensions."""
    blk = f"blk.{i}."
    sizes = f"{meta.key('embedding_length')} and the head counts"
    qd, kvd = heads * head_dim, kv_heads * head_dim
    if family.fused_qkv:
        _check_matrix(meta, f"{blk}attn_qkv.weight", hidden, qd + 2 * kvd, sizes)
        _check_matrix(
            meta, f"{blk}ffn_up.weight", hidden, 2 * ffn, f"{meta.key('embedding_length')} and the MLP width"
        )
    else:
        for part, rows in (("q", qd), ("k", kvd), ("v", kvd)):
            _check_matrix(meta, f"{blk}attn_{part}.weight", hidden, rows, sizes)
            _check_vector(meta, f"{blk}attn_{part}.bias", rows)
        for part in ("gate", "up"):
            _check_matrix(
                meta,
                f"{blk}ffn_{part}.weight",
                hidden,
                ffn,
                f"{meta.key('embedding_length')} and the MLP width",
            )
    _check_matrix(meta, f"{blk}attn_output.weight", qd, hidden, sizes)
    _check_vector(meta, f"{blk}attn_output.bias", hidden)
    _check_matrix(
        meta, f"{blk}ffn_down.weight", ffn, hidden, f"the MLP width and {meta.key('embedding_length')}"
    )
    for norm in ("attn_norm", "ffn_norm"):
        _check_vector(meta, f"{blk}{norm}.weight", hidden, required=True)
    for norm in ("post_attention_norm", "post_ffw_norm"):
        _check_vector(meta, f"{blk}{norm}.weight", hidden)
    for norm in ("attn_q_norm", "attn_k_norm"):
        _check_vector(meta, f"{blk}{norm}.weight", head_dim)


def _tokens(meta: _Metadata, embed_rows: int) -> int | None:
    """The vocabulary's size, which must not exceed the embedding's rows: an id past them would be
    read from past the end of the table."""
    tokens = meta.gguf.array_length("tokenizer.ggml.tokens")
    if tokens is not None and tokens > embed_rows:
        raise meta.disagrees(
            f"tokenizer.ggml.tokens holds {tokens} tokens, but token_embd.weight has {embed_rows} rows "
            f"(ids past {embed_rows - 1} would have no embedding)"
        )
    return tokens


def _epsilon(meta: _Metadata) -> float:
    for suffix in ("attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon"):
        if meta.gguf.has(meta.key(suffix)):
            eps = meta.number(suffix)
            assert eps is not None
            if not (math.isfinite(eps) and 0 < eps < 1):
                raise meta.bad(
                    f"{meta.key(suffix)} is {eps!r}; a norm's epsilon is a small positive number "
                    "(such as 1e-6)"
                )
            return eps
    if meta.arch in BY_NAME:
        raise meta.bad(f"{meta.key('attention.layer_norm_rms_epsilon')} is missing")
    return 1e-6


def _context_length(meta: _Metadata) -> int | None:
    context = meta.integer("context_length")
    if context is not None and context < 1:
        raise meta.bad(
            f"{meta.key('context_length')} is {context}; a model's context holds at least one token"
        )
    return context


def _positive(meta: _Metadata, suffix: str, default: float) -> float:
    value = meta.number(suffix, default)
    assert value is not None
    if not (math.isfinite(value) and value > 0):
        raise meta.bad(f"{meta.key(suffix)} is {value!r}; it must be a positive number")
    return value
