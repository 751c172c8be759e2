"""Write a GGUF of a real Qwen2.5 model's exact shape with random weights, to measure specchat at
a scale whose weights do not install here (speed and memory depend on the bytes, not the values).

The tokenizer, chat template and special tokens are copied from a real Qwen2.5 GGUF (the packaged
1.5B target by default), the vocabulary padded with unused tokens to the shape's embedding rows as
llama.cpp's converter pads the real ones. Matrices are written one tensor at a time (the largest,
a 14B's embedding, takes under 0.5 GB of memory) as random blocks with small scales, either

- of Q4_K_M's mix directly (the default): Q4_K, and Q6_K for the output head and for attn_v and
  ffn_down in the layers llama-quantize gives more bits (its ``use_more_bits``); a minute for a 7B;
- or as Q8_0, which ``--quantize`` then has llama.cpp's llama-quantize turn into Q4_K_M (the
  Q8_0 file deleted after): the same mix by llama.cpp's own rules, but slow (on a loaded 2-core VM
  it had done 24 of a 7B's 339 tensors after 4 minutes).

Kept out of CI: a 7B file is 4.7 GB, a 14B 9 GB.

    python scripts/make_shaped_gguf.py 7b /tmp/q7b.gguf
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class QwenShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool
    context: int = 32768


SHAPES = {
    # From the models' config.json files on the hub (Qwen2.5-{3B,7B,14B}-Instruct and -Coder).
    "3b": QwenShape(
        hidden=2048, layers=36, heads=16, kv_heads=2, intermediate=11008, vocab=151936, tied=True
    ),
    "7b": QwenShape(
        hidden=3584, layers=28, heads=28, kv_heads=4, intermediate=18944, vocab=152064, tied=False
    ),
    "14b": QwenShape(
        hidden=5120, layers=48, heads=40, kv_heads=8, intermediate=13824, vocab=152064, tied=False
    ),
}
Q8_BLOCK = 32
Q8_BYTES = 34  # a float16 scale, then 32 int8 values
K_BLOCK = 256
Q4_K_BYTES = 144  # d, dmin (float16), 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
Q6_K_BYTES = 210  # 128 bytes of low nibbles, 64 of high bits, 16 int8 scales, d (float16)
SMALL = np.frombuffer(np.float16(0.0002).tobytes(), dtype=np.uint8)


def packaged_tokenizer_source() -> Path:
    """The packaged default target's GGUF (assembled on first use by specchat)."""
    from specchat.models.names.assemble import packaged_gguf
    from specchat.models.names.catalog import DEFAULT_TARGET, PACKAGED

    return Path(packaged_gguf(PACKAGED[DEFAULT_TARGET]))


def copied_metadata(source: Path, writer: object, vocab: int) -> None:
    """Every tokenizer.* key of ``source`` (the token list and its types padded to ``vocab``)."""
    import gguf

    reader = gguf.GGUFReader(source)
    for field in reader.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        value = field.contents()
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        if field.name == "tokenizer.ggml.tokens":
            value = value + [f"[PAD{i}]" for i in range(len(value), vocab)]
        elif field.name == "tokenizer.ggml.token_type":
            value = value + [int(gguf.TokenType.UNUSED)] * (vocab - len(value))
        writer.add_key_value(field.name, value, kind, sub_type=sub)  # type: ignore[attr-defined]


def q8_rows(rows: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """Random Q8_0 blocks for a [rows, width] matrix, as GGUF stores them (bytes per row)."""
    blocks = np.empty((rows, width // Q8_BLOCK, Q8_BYTES), dtype=np.uint8)
    scale = np.float16(0.02 / 127)  # values of a trained layer's order, so nothing overflows
    blocks[:, :, :2] = np.frombuffer(scale.tobytes(), dtype=np.uint8)
    blocks[:, :, 2:] = rng.integers(0, 256, size=(rows, width // Q8_BLOCK, 32), dtype=np.uint8)
    return blocks.reshape(rows, -1)


def k_rows(rows: int, width: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    """Random Q4_K or Q6_K blocks for a [rows, width] matrix (bytes per row), every scale small."""
    size = Q4_K_BYTES if kind == "q4_k" else Q6_K_BYTES
    blocks = rng.integers(0, 256, size=(rows, width // K_BLOCK, size), dtype=np.uint8)
    if kind == "q4_k":
        blocks[:, :, 0:2] = SMALL
        blocks[:, :, 2:4] = SMALL
    else:
        blocks[:, :, 208:210] = SMALL
    return blocks.reshape(rows, -1)


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's rule (llama-quant.cpp) for the layers whose attn_v and ffn_down Q4_K_M keeps at Q6_K."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def q4_k_m(
    plan: list[tuple[str, tuple[int, ...], str]], layers: int
) -> list[tuple[str, tuple[int, ...], str]]:
    """The plan with Q4_K_M's types in place of q8."""
    out = []
    for name, dims, kind in plan:
        if kind == "q8":
            layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
            more = name == "output.weight" or (
                name.endswith(("attn_v.weight", "ffn_down.weight")) and use_more_bits(layer, layers)
            )
            kind = "q6_k" if more else "q4_k"
        out.append((name, dims, kind))
    return out


def tensors(shape: QwenShape) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, [rows, width] or [width], "q8" or "f32 ones" / "f32 zeros") in llama.cpp's order."""
    head_dim = shape.hidden // shape.heads
    kv = shape.kv_heads * head_dim
    out: list[tuple[str, tuple[int, ...], str]] = [("token_embd.weight", (shape.vocab, shape.hidden), "q8")]
    for i in range(shape.layers):
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", (shape.hidden,), "ones"),
            (b + "attn_q.weight", (shape.hidden, shape.hidden), "q8"),
            (b + "attn_q.bias", (shape.hidden,), "zeros"),
            (b + "attn_k.weight", (kv, shape.hidden), "q8"),
            (b + "attn_k.bias", (kv,), "zeros"),
            (b + "attn_v.weight", (kv, shape.hidden), "q8"),
            (b + "attn_v.bias", (kv,), "zeros"),
            (b + "attn_output.weight", (shape.hidden, shape.hidden), "q8"),
            (b + "ffn_norm.weight", (shape.hidden,), "ones"),
            (b + "ffn_gate.weight", (shape.intermediate, shape.hidden), "q8"),
            (b + "ffn_up.weight", (shape.intermediate, shape.hidden), "q8"),
            (b + "ffn_down.weight", (shape.hidden, shape.intermediate), "q8"),
        ]
    out.append(("output_norm.weight", (shape.hidden,), "ones"))
    if not shape.tied:
        out.append(("output.weight", (shape.vocab, shape.hidden), "q8"))
    return out


def write_shaped(name: str, path: Path, tokenizer_source: Path, *, q8: bool, seed: int = 0) -> None:
    import gguf

    shape = SHAPES[name]
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name(f"random Qwen2.5-{name.upper()} shape")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(1000000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8 else gguf.LlamaFileType.MOSTLY_Q4_K_M)
    copied_metadata(tokenizer_source, writer, shape.vocab)
    plan = tensors(shape) if q8 else q4_k_m(tensors(shape), shape.layers)
    k_types = {
        "q4_k": (gguf.GGMLQuantizationType.Q4_K, Q4_K_BYTES),
        "q6_k": (gguf.GGMLQuantizationType.Q6_K, Q6_K_BYTES),
    }
    for tensor, dims, kind in plan:
        if kind in k_types:
            rows, width = dims
            ggml, size = k_types[kind]
            row_bytes = width // K_BLOCK * size
            byte = np.dtype(np.uint8)
            writer.add_tensor_info(tensor, (rows, row_bytes), byte, rows * row_bytes, raw_dtype=ggml)
        elif kind == "q8":
            rows, width = dims
            row_bytes = width // Q8_BLOCK * Q8_BYTES
            q8_0, byte = gguf.GGMLQuantizationType.Q8_0, np.dtype(np.uint8)
            writer.add_tensor_info(tensor, (rows, row_bytes), byte, rows * row_bytes, raw_dtype=q8_0)
        else:
            writer.add_tensor_info(tensor, dims, np.dtype(np.float32), 4 * dims[0])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    started = time.monotonic()
    for done, (_, dims, kind) in enumerate(plan, 1):
        if kind == "q8":
            data = q8_rows(dims[0], dims[1], rng)
        elif kind in k_types:
            data = k_rows(dims[0], dims[1], kind, rng)
        else:
            data = (np.ones if kind == "ones" else np.zeros)(dims, dtype=np.float32)
        writer.write_tensor_data(data)
        print(f"\r{done}/{len(plan)} tensors, {time.monotonic() - started:.0f} s", end="", file=sys.stderr)
    writer.close()
    print(file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("output", type=Path, help="the GGUF to write (Q4_K_M with --quantize, else Q8_0)")
    parser.add_argument("--tokenizer-from", type=Path, help="a Qwen2.5 GGUF (default: the packaged target)")
    parser.add_argument(
        "--quantize",
        type=Path,
        help="write Q8_0, then llama.cpp's llama-quantize at this path makes it Q4_K_M",
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    source = args.tokenizer_from or packaged_tokenizer_source()
    q8 = args.output.with_name(args.output.name + ".q8_0") if args.quantize else args.output
    write_shaped(args.shape, q8, source, q8=args.quantize is not None)
    if args.quantize:
        command = [
            str(args.quantize),
            "--allow-requantize",
            str(q8),
            str(args.output),
            "Q4_K_M",
            str(args.threads),
        ]
        print(" ".join(command), file=sys.stderr)
        done = subprocess.run(command, stdout=subprocess.DEVNULL, check=False)
        q8.unlink()
        if done.returncode != 0:
            print(f"llama-quantize failed ({done.returncode})", file=sys.stderr)
            return 1
    print(f"{args.output}: {args.output.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
