"""Make the tiny GGUF fixtures in tests/fixtures/gguf with llama.cpp's own tools.

    .venv/bin/pip install sentencepiece   # the converter imports it even for BPE models
    .venv/bin/python scripts/make_gguf_fixtures.py [--llama-cpp DIR] [--out tests/fixtures/gguf]

For each family it builds a tiny seeded Hugging Face model (one layer, hidden 256 so the
K-quants' 256-wide super-blocks fit every matrix, head_dim 64, grouped K/V heads), saves it with
a tiny byte-level BPE tokenizer, converts it to an F32 GGUF with llama.cpp's
``convert_hf_to_gguf.py`` and quantizes that with ``llama-quantize --pure`` (every matrix in the
one type) into each type the tests read. MANIFEST.json records each file's sha256, the seed,
the config and the llama.cpp version. Everything is seeded: running it again with the same
llama.cpp build gives the same files.

This is a maintainer tool: sentencepiece is not one of specchat's dependencies.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LLAMA_CPP = Path("/work/peers/llamacpp-avx2/bin")
SEED = 25

FAST_TYPES = ("Q4_K", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_K", "Q5_1")
OTHER_TYPES = ("Q8_0", "Q4_K")
FLOAT_TYPES = {"llama": ("F16", "BF16")}
"""The float types, for one family: at 2 bytes a weight each file is about 1.5 MB."""

COMMON: dict[str, Any] = {
    "hidden_size": 256,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

FAMILIES: dict[str, dict[str, Any]] = {
    # Ties as the family's small models do: Llama 3.2 1B/3B and Qwen2 0.5B tie, Mistral does not.
    "llama": {"model_type": "llama", "intermediate_size": 512, "tie_word_embeddings": True},
    "qwen2": {"model_type": "qwen2", "intermediate_size": 512, "tie_word_embeddings": True},
    "mistral": {"model_type": "mistral", "intermediate_size": 512, "tie_word_embeddings": False,
                "sliding_window": None},
    # Families with two types only: a narrower MLP keeps the folder small (down's input width,
    # 256, still fits a K-quant super-block).
    "qwen3": {"model_type": "qwen3", "intermediate_size": 256, "tie_word_embeddings": True},
    "gemma3": {"model_type": "gemma3_text", "intermediate_size": 256, "tie_word_embeddings": True,
               "sliding_window": 16, "query_pre_attn_scalar": 64, "rope_local_base_freq": 10000.0,
               "layer_types": ["sliding_attention"]},
    "phi3": {"model_type": "phi3", "intermediate_size": 256, "tie_word_embeddings": False,
             "sliding_window": None},
}  # fmt: skip

FAST_FAMILIES = ("llama", "qwen2", "mistral")

LOGIT_SCALE = 8.0
"""The final norm's weight: sharpens the tiny models' distributions (std 0.02 weights give
near-uniform logits) so argmax and greedy decoding are not a coin toss between near ties."""

CORPUS = [
    "the cat sat on the mat. the dog sat on the log.",
    "speculative decoding drafts tokens with a small model and verifies them with a large one.",
    "a quick brown fox jumps over the lazy dog, again and again and again.",
    "hello world! this is a tiny tokenizer for tiny test models, 0123456789.",
    "Once upon a time there was a little model that could only say a few words.",
]
VOCAB_SIZE = 320
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|endoftext|>", "<|end|>"]
"""The last two are Phi-3's: llama.cpp's vocabulary loader looks them up by text for a phi3
file and fails ("unordered_map::at") without them; every family shares the one tokenizer."""
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)


def make_tokenizer() -> Any:
    """A byte-level BPE (GPT-2's pre-tokenizer and decoder) trained on CORPUS: deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_model(arch: str, vocab: int) -> tuple[Any, dict[str, Any]]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    settings = dict(FAMILIES[arch])
    model_type = settings.pop("model_type")
    fields = {**COMMON, **settings, "vocab_size": vocab}
    config = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        # Gemma's RMSNorm multiplies by (1 + w): the same LOGIT_SCALE either way.
        model.model.norm.weight.fill_(LOGIT_SCALE - 1.0 if arch == "gemma3" else LOGIT_SCALE)
    return model, {"model_type": model_type, **fields}


def save_folder(arch: str, folder: Path) -> dict[str, Any]:
    tokenizer = make_tokenizer()
    model, fields = make_model(arch, len(tokenizer))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # Phi3's converter takes the BPE route only when the tokenizer says it is GPT-2's (it
    # otherwise wants a sentencepiece tokenizer.model); the tokenizer is GPT-2 shaped. (It has
    # its own <unk>: GPT2Tokenizer would otherwise add <|endoftext|> past the vocabulary.)
    config_file = folder / "tokenizer_config.json"
    tok_config = json.loads(config_file.read_text())
    tok_config["tokenizer_class"] = "GPT2Tokenizer"
    config_file.write_text(json.dumps(tok_config, indent=2))
    return fields


def convert_in_this_process(llama_cpp: Path, folder: Path, outfile: Path) -> None:
    """Run llama.cpp's converter here, with its vocabulary check answered for our tokenizer.

    The converter recognises a BPE tokenizer's pre-tokenizer by hashing how it encodes a test
    string (``get_vocab_base_pre``) and refuses hashes it does not know. Ours is a freshly
    trained vocabulary with GPT-2's ByteLevel pre-tokenizer (the same split regex), so its
    hash is new but "gpt-2" (the name the converter gives GPT-2's own hash) is the
    right answer: the patch says so. Gemma3 needs nothing more
    (without a tokenizer.model it takes the same gpt2 route); Phi3 takes it for a tokenizer
    that names GPT2Tokenizer (see save_folder).
    """
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    sys.path.insert(0, str(llama_cpp))
    import conversion.base as base

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    sys.argv = ["convert_hf_to_gguf.py", str(folder), "--outtype", "f32", "--outfile", str(outfile)]
    runpy.run_path(str(llama_cpp / "convert_hf_to_gguf.py"), run_name="__main__")


def run(args: list[str], llama_cpp: Path) -> str:
    env = dict(os.environ, LD_LIBRARY_PATH=str(llama_cpp))
    done = subprocess.run(args, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout + done.stderr


def llama_cpp_version(llama_cpp: Path) -> str:
    text = run([str(llama_cpp / "llama-server"), "--version"], llama_cpp)
    return " ".join(line.strip() for line in text.splitlines() if line.strip().startswith("version"))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-cpp", type=Path, default=DEFAULT_LLAMA_CPP, help="llama.cpp's bin folder")
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "gguf")
    parser.add_argument("--families", nargs="*", default=list(FAMILIES))
    parser.add_argument("--convert", nargs=2, type=Path, metavar=("FOLDER", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    llama_cpp = args.llama_cpp.resolve()
    if args.convert:
        convert_in_this_process(llama_cpp, *args.convert)
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    manifest_file = args.out / "MANIFEST.json"
    manifest = json.loads(manifest_file.read_text()) if manifest_file.exists() else {}
    entries = {e["file"]: e for e in manifest.get("fixtures", [])}
    version = llama_cpp_version(llama_cpp)
    with tempfile.TemporaryDirectory() as scratch:
        for arch in args.families:
            folder = Path(scratch) / arch
            fields = save_folder(arch, folder)
            f32 = Path(scratch) / f"{arch}-F32.gguf"
            # A subprocess: the converter's own gguf-py, and its patch, stay out of this process.
            run([sys.executable, __file__, "--llama-cpp", str(llama_cpp), "--convert", str(folder), str(f32)],
                llama_cpp)  # fmt: skip
            types = FAST_TYPES if arch in FAST_FAMILIES else OTHER_TYPES
            for qtype in (*types, *FLOAT_TYPES.get(arch, ())):
                name = f"{arch}-{qtype}.gguf"
                run(
                    [str(llama_cpp / "llama-quantize"), "--pure", str(f32), str(args.out / name), qtype],
                    llama_cpp,
                )
                entries[name] = {
                    "file": name,
                    "arch": arch,
                    "type": qtype,
                    "sha256": sha256(args.out / name),
                    "bytes": (args.out / name).stat().st_size,
                    "seed": SEED,
                    "logit_scale": LOGIT_SCALE,
                    "config": fields,
                }
                print(f"{name}: {entries[name]['bytes']} bytes", flush=True)
    manifest = {
        "made_by": "scripts/make_gguf_fixtures.py",
        "llama_cpp_version": version,
        "tokenizer": {"kind": "byte-level BPE", "vocab_size": VOCAB_SIZE, "corpus": CORPUS},
        "fixtures": sorted(entries.values(), key=lambda e: e["file"]),
    }
    manifest_file.write_text(json.dumps(manifest, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
