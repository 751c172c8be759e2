"""Fixtures for the model-loading tests: a private cache dir, tiny HF folders, a tiny GGUF."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from specchat.models.names.catalog import Chunk, PackagedModel
from specchat.testing.tiny_models import TinyPair, make_tiny_pair, save_tiny_pair


@pytest.fixture(autouse=True)
def private_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """Every test gets its own SPECCHAT_CACHE_DIR: nothing touches the user's real cache."""
    path = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(path))
    # No test may reach the network, even by accident through a hub id.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    yield path


@pytest.fixture(scope="session")
def tiny_pair() -> TinyPair:
    return make_tiny_pair(seed=0)


@pytest.fixture(scope="session")
def tiny_folders(tiny_pair: TinyPair, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(target folder, draft folder) in Hugging Face format, written once per session."""
    return save_tiny_pair(tiny_pair, tmp_path_factory.mktemp("tiny"))


def _permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (convert_hf_to_gguf.py); transformers undoes it when reading."""
    rows = weights.shape[0]
    return (
        weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_tiny_gguf(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    path: Path,
    qtype: GGMLQuantizationType | None = None,
    *,
    architecture: str = "llama",
    rope_freqs: np.ndarray | None = None,
    name: str = "tiny llama",
) -> Path:
    """Write `model` as a llama GGUF with a byte-level BPE vocabulary, like llama.cpp would: F32,
    or its matrices quantized to ``qtype`` by gguf-py (norms stay F32, as llama-quantize leaves them).
    ``architecture`` names another family in the file; ``rope_freqs`` adds Llama 3's factors."""
    from gguf import GGUFWriter, quants

    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    writer = GGUFWriter(str(path), architecture)
    writer.add_name(name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    assert config.num_key_value_heads is not None and config.rope_parameters is not None, "set by LlamaConfig"
    rope_theta = config.rope_parameters["rope_theta"]
    assert rope_theta is not None
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope_theta))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    _add_tokenizer(writer, tokenizer)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    for name, weights in _gguf_tensors(model).items():
        if qtype is None or weights.ndim == 1:
            writer.add_tensor(name, weights)
        else:
            writer.add_tensor(name, quants.quantize(weights, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_tokenizer(writer: object, tokenizer: PreTrainedTokenizerFast) -> None:
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    tokens = [token for token, _ in vocab]
    specials = set(tokenizer.all_special_tokens)
    writer.add_tokenizer_model("gpt2")  # type: ignore[attr-defined]
    writer.add_token_list(tokens)  # type: ignore[attr-defined]
    writer.add_token_types([3 if t in specials else 1 for t in tokens])  # type: ignore[attr-defined]
    # No merges: every token is one character, so scores alone describe the vocabulary.
    writer.add_token_scores([0.0] * len(tokens))  # type: ignore[attr-defined]
    writer.add_bos_token_id(tokenizer.bos_token_id)  # type: ignore[attr-defined]
    writer.add_eos_token_id(tokenizer.eos_token_id)  # type: ignore[attr-defined]
    writer.add_unk_token_id(tokenizer.unk_token_id)  # type: ignore[attr-defined]
    writer.add_chat_template(tokenizer.chat_template)  # type: ignore[attr-defined]


def _gguf_tensors(model: LlamaForCausalLM) -> dict[str, np.ndarray]:
    config = model.config
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    tensors = {
        "token_embd.weight": state["model.embed_tokens.weight"],
        "output_norm.weight": state["model.norm.weight"],
        "output.weight": state["lm_head.weight"],
    }
    names = {
        "attn_norm": "input_layernorm", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
        "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }  # fmt: skip
    kv_heads = config.num_key_value_heads
    assert kv_heads is not None, "set by LlamaConfig"
    for i in range(config.num_hidden_layers):
        hf = f"model.layers.{i}."
        for gguf_name, hf_name in names.items():
            tensors[f"blk.{i}.{gguf_name}.weight"] = state[f"{hf}{hf_name}.weight"]
        q, k = state[f"{hf}self_attn.q_proj.weight"], state[f"{hf}self_attn.k_proj.weight"]
        tensors[f"blk.{i}.attn_q.weight"] = _permute(q, config.num_attention_heads)
        tensors[f"blk.{i}.attn_k.weight"] = _permute(k, kv_heads)
    return tensors


@pytest.fixture(scope="session")
def tiny_gguf(tiny_pair: TinyPair, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid tiny GGUF of the tiny target (about 300 KB)."""
    return write_tiny_gguf(
        tiny_pair.target, tiny_pair.tokenizer, tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    )


TINY_PACKAGED = "tiny-packaged"


@pytest.fixture
def tiny_packaged(tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PackagedModel:
    """The tiny GGUF as a packaged model: three chunk "packages" with a pinned sha256.

    It goes through exactly the path the real pair takes (assemble, verify, convert, load), in
    well under a second, so damage to every stage can be tried in CI.
    """
    from specchat.models.names import assemble, catalog

    whole = tiny_gguf.read_bytes()
    cuts = [0, len(whole) // 3, 2 * len(whole) // 3, len(whole)]
    folders = {}
    for n in range(1, 4):
        folder = tmp_path / "site-packages" / f"tiny_packaged_part{n}"
        (folder / "data").mkdir(parents=True)
        (folder / "data" / f"part{n:02d}.bin").write_bytes(whole[cuts[n - 1] : cuts[n]])
        folders[f"tiny_packaged_part{n}"] = folder
    monkeypatch.setattr(assemble, "locate_package", folders.get)
    model = PackagedModel(
        name=TINY_PACKAGED,
        role="single",
        file="tiny-packaged.gguf",
        size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
        chunks=tuple(Chunk(f"tiny_packaged_part{n}", f"data/part{n:02d}.bin") for n in range(1, 4)),
        pip_hint="pip install tiny-packaged",
        description="the tiny test model, packaged",
    )
    monkeypatch.setitem(catalog.PACKAGED, model.name, model)
    return model
