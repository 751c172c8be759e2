"""What a user's GGUF file holds, and whether specchat's fast path runs it: ``specchat models FILE``.

Only the header is read (the tensors are memory-mapped, never touched), so a 10 GB file is
described in a moment. Every string taken from the file is made visible and clipped before it
is shown: a file's name or architecture may hold terminal control sequences.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specchat.kernels.formats import packed_bytes, super_block_for
from specchat.models.architectures import BY_NAME, fast_path_problem
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
packing rules are specchat.kernels.native.KEPT_TYPES; every other type becomes q8;
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
    """The report for ``path``; raises ValueError (one line) for a file that is not a readable GGUF."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except (ValueError, OSError, IndexError, KeyError) as error:  # gguf-py raises what it meets
        reason = visible(clipped(str(error), 200))  # gguf-py's message may quote the file's bytes
        raise ValueError(f"{visible(path.name)} is not a GGUF file specchat can read ({reason})") from None
    arch = _text(reader, "general.architecture") or "?"

    def number(key: str) -> int | None:
        value = _field(reader, f"{arch}.{key}")
        return int(value) if isinstance(value, int | float) else None

    report = GgufReport(
        path=path,
        size=path.stat().st_size,
        architecture=arch,
        name=_text(reader, "general.name") or path.stem,
        context_length=number("context_length"),
        layers=number("block_count"),
        hidden=number("embedding_length"),
        heads=number("attention.head_count"),
        kv_heads=number("attention.head_count_kv"),
        vocab=None,
        rope=_rope(reader, arch),
    )
    head_dim = number("attention.key_length") or (report.hidden or 0) // (report.heads or 1)
    # The rotary frequencies (a file's rope_freqs are folded into them), and a second table for
    # windowed layers that rotate with their own base (Gemma 3).
    family = BY_NAME.get(arch)
    windowed = family is not None and family.sliding_window and (number("attention.sliding_window") or 0) > 0
    packed = head_dim // 2 * 4 * (2 if windowed else 1)
    head_has_own_tensor = "output.weight" in _names(reader)
    for tensor in reader.tensors:
        if tensor.name == "rope_freqs.weight":
            continue
        group = GROUPS.get(tensor.name.split(".")[-2] if tensor.name.startswith("blk.") else tensor.name[:-7])
        type_name = tensor.tensor_type.name
        if group is None or len(tensor.shape) < 2:
            packed += int(tensor.n_elements) * 4  # vectors (norms, biases) are kept as float32
            continue
        report.types.setdefault(group, Counter())[type_name] += 1
        k, n = int(tensor.shape[0]), int(tensor.shape[1])
        if group == ("output head" if "output.weight" in _names(reader) else "embedding"):
            report.vocab = n
        kind = KERNEL_FORMAT.get(type_name, "q8")
        super_block = SUPER_BLOCK.get(type_name, 32 if type_name in KERNEL_FORMAT else super_block_for(k, 16))
        copies = 2 if tensor.name == "token_embd.weight" and not head_has_own_tensor else 1
        packed += copies * packed_bytes(kind, n, k, super_block)  # a tied head is packed as its own matrix
    report.packed_size = packed
    report.problem = gguf_problem(reader)
    return report


def gguf_problem(reader: Any) -> str | None:
    """Why specchat's decoders cannot compute the model in an open GGUF as llama.cpp does (None:
    they can). Packing and ``specchat models FILE`` both ask this, so they never disagree."""
    arch = _text(reader, "general.architecture") or "?"
    names = _names(reader)
    heads = _field(reader, f"{arch}.attention.head_count")
    hidden = _field(reader, f"{arch}.embedding_length")
    head_dim = _field(reader, f"{arch}.attention.key_length") or (
        hidden // heads if hidden and heads else None
    )
    scaling = _text(reader, f"{arch}.rope.scaling.type") or "none"
    if problem := fast_path_problem(arch):
        return problem
    if "rope_factors_short.weight" in names:
        return "LongRoPE scaling (short and long factors) is not supported yet"
    if scaling not in ("none", "linear"):
        return f"RoPE scaling {scaling!r} is not supported yet (linear and Llama 3 factors are)"
    if head_dim and _field(reader, f"{arch}.rope.dimension_count") not in (None, head_dim):
        return "rotary embeddings over part of each head are not supported yet"
    if any(name.endswith("attn_qkv.bias") for name in names):
        return "a fused q/k/v bias is not supported yet"
    return None


def report_lines(report: GgufReport) -> list[str]:
    """The report as lines of plain text, each string from the file made visible."""
    from specchat.models.cache import human_bytes

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


def _field(reader: Any, key: str) -> Any:
    found = reader.fields.get(key)
    return None if found is None else found.contents()


def _text(reader: Any, key: str) -> str | None:
    value = _field(reader, key)
    return None if value is None else str(value)


def _names(reader: Any) -> set[str]:
    return {t.name for t in reader.tensors}


def _rope(reader: Any, arch: str) -> str:
    base = _field(reader, f"{arch}.rope.freq_base") or 10000.0
    scaling = _text(reader, f"{arch}.rope.scaling.type") or "none"
    if "rope_freqs.weight" in _names(reader):
        scaling = "per-frequency factors (Llama 3)"
    if "rope_factors_short.weight" in _names(reader):
        scaling = "LongRoPE"
    return f"base {base:g}, scaling {scaling}"
