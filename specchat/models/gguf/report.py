"""What a user's GGUF file holds, and whether specchat's fast path runs it: ``specchat models FILE``.

Only the header is read (the tensors are never touched), so a 10 GB file is described in a
moment. It goes through the same validation layer as a start (specchat.models.gguf.check, then
gguf_shape), so a file ``generate`` would refuse is refused here with the same line. Every
string taken from the file is made visible and clipped before it is shown: a file's name or
architecture may hold terminal control sequences.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from math import prod
from pathlib import Path

from specchat.kernels.formats import packed_bytes, super_block_for
from specchat.models.architectures import BY_NAME
from specchat.models.gguf.check import GgufFile, read_gguf
from specchat.models.gguf.shape import check_metadata, decoder_dims, gguf_problem
from specchat.untrusted import clipped, visible

GROUPS = {
    "token_embd": "embedding",
    "output": "output head",
    "attn_q": "attention",
    "attn_k": "attention",
    "attn_v": "attention",
    "attn_output": "attention",
    "attn_qkv": "attention",
    "ffn_gate": "MLP",
    "ffn_up": "MLP",
    "ffn_down": "MLP",
}
"""The tensor groups the report counts types in (norms and other vectors stay float32)."""

KERNEL_FORMAT = {
    "Q4_K": "q4", "Q5_K": "q5", "Q6_K": "q6", "Q8_0": "q8",
    "Q4_0": "q4", "Q4_1": "q4", "Q5_0": "q6", "Q5_1": "q5",
    "F16": "f16", "BF16": "f32", "F32": "f32",
}  # fmt: skip
"""GGUF types the target keeps at their own bits, and the kernel format each becomes (the
packing rules are specchat.models.compute.packing.KEPT_TYPES; every other type becomes q8;
tests/models/test_gguf_fixtures.py holds the two to agree)."""

SUPER_BLOCK = {"Q4_K": 256, "Q5_K": 256, "Q6_K": 256}
"""Inputs per super-block of a kept type (the 32-weight types: 32); requantized ones: up to 256."""


@dataclass
class GgufReport:
    path: Path
    size: int
    architecture: str
    name: str
    context_length: int | None
    layers: int | None
    hidden: int | None
    heads: int | None
    kv_heads: int | None
    vocab: int | None
    rope: str
    types: dict[str, Counter[str]] = field(default_factory=dict)
    """Per tensor group, how many tensors of each GGUF type."""
    packed_size: int = 0
    """Bytes of the target's packed weights (the fast path's cache), if it runs."""
    problem: str | None = None
    """Why the fast path does not run this file (None: it does)."""


def describe_gguf(path: Path) -> GgufReport:
    """The report for ``path``. The file goes through the checks a start runs before packing it
    (:func:`read_gguf`, then the dimensions against the tensors): ModelLoadError, one line, for a
    file that is not a sound GGUF or whose metadata disagrees with its tensors."""
    gguf = read_gguf(path)
    arch = gguf.architecture or "?"
    dims = decoder_dims(gguf) if arch in BY_NAME else None
    if dims is None:
        check_metadata(gguf)  # what decoder_dims checks of every family

    def number(key: str) -> int | None:
        value = gguf.value(f"{arch}.{key}")
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

    report = GgufReport(
        path=path,
        size=gguf.size,
        architecture=arch,
        name=_text(gguf, "general.name") or path.stem,
        context_length=dims.context_length if dims else number("context_length"),
        layers=dims.layers if dims else number("block_count"),
        hidden=dims.hidden if dims else number("embedding_length"),
        heads=dims.heads if dims else number("attention.head_count"),
        kv_heads=dims.kv_heads if dims else number("attention.head_count_kv"),
        vocab=None,
        rope=_rope(gguf, arch),
    )
    head_dim = dims.head_dim if dims else (report.hidden or 0) // (report.heads or 1)
    # The rotary frequencies (a file's rope_freqs are folded into them), and a second table for
    # windowed layers that rotate with their own base (Gemma 3).
    windowed = dims is not None and dims.window > 0
    packed = head_dim // 2 * 4 * (2 if windowed else 1)
    head_has_own_tensor = "output.weight" in gguf.tensors
    for tensor in gguf.tensors.values():
        if tensor.name == "rope_freqs.weight":
            continue
        group = GROUPS.get(tensor.name.split(".")[-2] if tensor.name.startswith("blk.") else tensor.name[:-7])
        type_name = tensor.type_name
        if group is None or len(tensor.dims) < 2:
            packed += prod(tensor.dims) * 4  # vectors (norms, biases) are kept as float32
            continue
        report.types.setdefault(group, Counter())[type_name] += 1
        k, n = tensor.dims[0], tensor.dims[1]
        if group == ("output head" if head_has_own_tensor else "embedding"):
            report.vocab = n
        kind = KERNEL_FORMAT.get(type_name, "q8")
        super_block = SUPER_BLOCK.get(type_name, 32 if type_name in KERNEL_FORMAT else super_block_for(k, 16))
        copies = 2 if tensor.name == "token_embd.weight" and not head_has_own_tensor else 1
        packed += copies * packed_bytes(kind, n, k, super_block)  # a tied head is packed as its own matrix
    report.packed_size = packed
    report.problem = gguf_problem(gguf, dims)
    return report


def report_lines(report: GgufReport) -> list[str]:
    """The report as lines of plain text, each string from the file made visible."""
    from specchat.models.cache.paths import human_bytes

    def shown(text: str) -> str:
        return visible(clipped(text, 120))

    lines = [
        f"{shown(report.path.name)}: {shown(report.name)} ({human_bytes(report.size)})",
        f"  architecture    {shown(report.architecture)}",
        f"  shape           {report.layers} layers, hidden {report.hidden}, {report.heads} heads "
        f"({report.kv_heads} for keys and values), vocabulary {report.vocab}",
        f"  context length  {report.context_length or 'not stated'}",
        f"  RoPE            {shown(report.rope)}",
    ]
    for group in ("embedding", "output head", "attention", "MLP"):
        if group in report.types:
            kinds = ", ".join(f"{t} ×{n}" for t, n in report.types[group].most_common())
            lines.append(f"  {group:<15} {kinds}")
    kept = sorted({t for c in report.types.values() for t in c if t in KERNEL_FORMAT})
    requantized = sorted({t for c in report.types.values() for t in c if t not in KERNEL_FORMAT})
    if report.problem is None:
        lines.append(f"  fast path       yes: packed {human_bytes(report.packed_size)}")
        lines.append(f"  own bits        {', '.join(kept) or 'none'}")
        if requantized:
            lines.append(
                f"  requantized     {', '.join(requantized)} → q8 (no kernel format holds them exactly)"
            )
    else:
        lines.append(f"  fast path       no: {shown(report.problem)}")
    return lines


def _text(gguf: GgufFile, key: str) -> str | None:
    value = gguf.value(key)
    return None if value is None else str(value)


def _rope(gguf: GgufFile, arch: str) -> str:
    base = gguf.value(f"{arch}.rope.freq_base")
    base = base if isinstance(base, int | float) and not isinstance(base, bool) else 10000.0
    scaling = _text(gguf, f"{arch}.rope.scaling.type") or "none"
    if "rope_freqs.weight" in gguf.tensors:
        scaling = "per-frequency factors (Llama 3)"
    if "rope_factors_short.weight" in gguf.tensors:
        scaling = "LongRoPE"
    return f"base {base:g}, scaling {scaling}"
