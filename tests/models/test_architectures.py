"""Architectures as data: the table decides what runs on the fast path, and says why not.

Llama 3.x RoPE scaling runs on both roads: a Hugging Face model's rotary module, and a GGUF's
``rope_freqs`` factors as llama.cpp's converter writes them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Phi3Config, Phi3ForCausalLM

from specchat.kernels import cpu_supports
from specchat.kernels.native import native_model
from specchat.models.architectures import (
    ARCHITECTURES,
    BY_MODEL_TYPE,
    FAST_NAMES,
    exact_context,
    fast_path_problem,
)
from specchat.models.compute.lean import LeanCausalLM, lean_supported
from specchat.models.compute.packing import from_hf, pack_gguf
from specchat.testing.tiny_models import make_tokenizer
from tests.models.conftest import write_tiny_gguf

needs_kernels = pytest.mark.skipif(cpu_supports() is not None, reason=f"no kernels here: {cpu_supports()}")

LLAMA3_ROPE: dict[str, Any] = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
IDS = torch.tensor([[1, 5, 9, 12, 7, 30, 22, 4] * 12])  # 96 positions: past the original 64


def llama3_model(seed: int = 7) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(make_tokenizer()), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rope_parameters=dict(LLAMA3_ROPE), bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    return model


def converter_rope_freqs(head_dim: int) -> np.ndarray:
    """The ``rope_freqs`` factors llama.cpp's convert_hf_to_gguf.py writes for Llama 3 scaling."""
    base, factor = LLAMA3_ROPE["rope_theta"], LLAMA3_ROPE["factor"]
    low, high = LLAMA3_ROPE["low_freq_factor"], LLAMA3_ROPE["high_freq_factor"]
    old = LLAMA3_ROPE["original_max_position_embeddings"]
    factors = []
    for freq in 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)):
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got - expected).norm() / expected.norm())


def test_every_family_is_one_entry_with_its_reason() -> None:
    assert set(FAST_NAMES) == {"llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3"}
    assert len(BY_MODEL_TYPE) == sum(len(a.model_types) for a in ARCHITECTURES)  # no type in two entries
    assert fast_path_problem("llama") is None
    assert fast_path_problem("gemma3_text") is None
    assert "soft-capping" in (fast_path_problem("gemma2") or "")
    assert "not 'mamba'" in (fast_path_problem("mamba") or "")


def test_llama3_scaling_runs_on_the_lean_forward() -> None:
    model = llama3_model()
    assert lean_supported(model) is None
    with torch.inference_mode():
        expected = model(input_ids=IDS).logits[0]
        got = LeanCausalLM(model)(IDS, None, logits_to_keep=IDS.shape[1]).logits[0]
    assert relative_error(got, expected) < 1e-4


def test_a_dynamic_scaling_is_refused_with_its_name() -> None:
    model = llama3_model()
    model.config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    assert "'dynamic'" in (lean_supported(model) or "")


@needs_kernels
def test_llama3_scaling_runs_on_the_kernels_from_hugging_face() -> None:
    model = llama3_model()
    with torch.inference_mode():
        expected = model(input_ids=IDS).logits[0]
    got = from_hf(model, bits=8)(IDS, None, logits_to_keep=IDS.shape[1]).logits[0]
    assert relative_error(got, expected) < 0.03


@needs_kernels
def test_llama3_scaling_runs_on_the_kernels_from_a_gguf(tmp_path: Path) -> None:
    model = llama3_model()
    freqs = converter_rope_freqs(16)
    path = write_tiny_gguf(model, make_tokenizer(), tmp_path / "llama3.gguf", rope_freqs=freqs)
    packed = pack_gguf(str(path))
    hf_inv_freq = model.model.rotary_emb.inv_freq.float()
    assert torch.allclose(packed.tensors["inv_freq"], hf_inv_freq, rtol=1e-5)
    assert not torch.allclose(packed.tensors["inv_freq"], hf_inv_freq * 8, rtol=0.5)  # the factors did act
    with torch.inference_mode():
        expected = model(input_ids=IDS).logits[0]
    got = native_model(packed, model.config)(IDS, None, logits_to_keep=IDS.shape[1]).logits[0]
    assert relative_error(got, expected) < 0.03  # an F32 file is requantized to q8


@pytest.mark.parametrize(("architecture", "named"), [("gemma2", "soft-capping"), ("mamba", "mamba")])
def test_a_family_the_decoders_cannot_run_yet_is_refused_by_name(
    architecture: str, named: str, tmp_path: Path
) -> None:
    path = write_tiny_gguf(llama3_model(), make_tokenizer(), tmp_path / "x.gguf", architecture=architecture)
    with pytest.raises(ValueError, match=named) as refused:
        pack_gguf(str(path))
    assert "\n" not in str(refused.value)


def phi3_model(seed: int = 8, sliding_window: int | None = None) -> Phi3ForCausalLM:
    torch.manual_seed(seed)
    config = Phi3Config(
        vocab_size=len(make_tokenizer()), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, sliding_window=sliding_window, tie_word_embeddings=False,
    )  # fmt: skip
    model = Phi3ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    return model


def write_phi3_gguf(model: Phi3ForCausalLM, path: Path) -> Path:
    """A phi3 GGUF as llama.cpp's converter lays it out: fused attn_qkv and ffn_up (gate then up),
    rows in Hugging Face order (phi3 rotates halves in llama.cpp too, so nothing is permuted)."""
    from gguf import GGUFWriter

    config = model.config
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    writer = GGUFWriter(str(path), "phi3")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    assert config.num_key_value_heads is not None, "set by Phi3Config"
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    tensors = {
        "token_embd.weight": state["model.embed_tokens.weight"],
        "output_norm.weight": state["model.norm.weight"],
        "output.weight": state["lm_head.weight"],
    }
    names = {
        "attn_norm": "input_layernorm", "attn_qkv": "self_attn.qkv_proj", "attn_output": "self_attn.o_proj",
        "ffn_norm": "post_attention_layernorm", "ffn_up": "mlp.gate_up_proj", "ffn_down": "mlp.down_proj",
    }  # fmt: skip
    for i in range(config.num_hidden_layers):
        for gguf_name, hf_name in names.items():
            tensors[f"blk.{i}.{gguf_name}.weight"] = state[f"model.layers.{i}.{hf_name}.weight"]
    for name, weights in tensors.items():
        writer.add_tensor(name, weights)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@needs_kernels
def test_phi3_fused_matrices_are_split_on_both_roads(tmp_path: Path) -> None:
    model = phi3_model()
    with torch.inference_mode():
        expected = model(input_ids=IDS).logits[0]
    from_hugging_face = from_hf(model, bits=8)(IDS, None, logits_to_keep=IDS.shape[1]).logits[0]
    assert relative_error(from_hugging_face, expected) < 0.03
    path = str(write_phi3_gguf(model, tmp_path / "phi3.gguf"))
    as_q8 = native_model(pack_gguf(path, mode="q8"), model.config)
    same_q8_rows = as_q8(IDS, None, logits_to_keep=IDS.shape[1]).logits[0]
    assert torch.equal(same_q8_rows, from_hugging_face)
    native = native_model(pack_gguf(path), model.config)  # the file's F32 weights kept: closer still
    from_gguf = native(IDS, None, logits_to_keep=IDS.shape[1]).logits[0]
    assert relative_error(from_gguf, expected) < 1e-4
    rows = [native(IDS[:, :1], None, logits_to_keep=1)]
    for position in range(1, 12):
        rows.append(native(IDS[:, position : position + 1], rows[-1].cache, logits_to_keep=1))
    assert torch.equal(torch.cat([r.logits[0] for r in rows]), from_gguf[:12])


def test_phi3_is_not_run_by_the_lean_forward_which_does_not_split() -> None:
    assert "Llama-style layers only" in (lean_supported(phi3_model()) or "")
    assert lean_supported(phi3_model(), for_kernels=True) is None


def test_a_windowed_family_is_capped_at_its_window() -> None:
    assert exact_context(phi3_model(sliding_window=48).config) == 48
    assert exact_context(phi3_model().config) == 256
    qwen_like = LlamaConfig(max_position_embeddings=4096)
    qwen_like.sliding_window, qwen_like.use_sliding_window = 1024, False  # qwen2: a window it does not use
    assert exact_context(qwen_like) == 4096
    gemma_like = LlamaConfig(max_position_embeddings=4096)
    gemma_like.sliding_window, gemma_like.layer_types = 512, ["sliding_attention"] * 5 + ["full_attention"]
    assert exact_context(gemma_like) == 4096
