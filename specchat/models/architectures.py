"""The decoder architectures specchat knows, as data: one entry per family.

GGUF packing (specchat.models.compute.packing.pack_gguf), Hugging Face packing and the lean forward
(specchat.models.compute.lean.lean_supported) and ``specchat models FILE`` all read this table, so
adding a family is one entry here, plus a decoder branch when it needs arithmetic the C++ and
lean decoders do not have yet (see docs/extending.md, "Adding an architecture").

Every entry states what the family computes; ``missing`` lists what of that the decoders do not
compute yet. An entry with nothing missing runs on the fast path; the others are refused there
with that list as the reason, rather than decoded wrongly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GGUF_TENSOR_NAMES: dict[str, str] = {
    "embed": "token_embd.weight",
    "head": "output.weight",
    "norm": "output_norm.weight",
    "rope_freqs": "rope_freqs.weight",
    "q": "attn_q",
    "k": "attn_k",
    "v": "attn_v",
    "o": "attn_output",
    "gate": "ffn_gate",
    "up": "ffn_up",
    "down": "ffn_down",
    "attn_norm": "attn_norm",
    "ffn_norm": "ffn_norm",
    "q_norm": "attn_q_norm",
    "k_norm": "attn_k_norm",
    "post_attn_norm": "post_attention_norm",
    "post_ffn_norm": "post_ffw_norm",
}
"""specchat's tensor names → llama.cpp's (per-layer ones under ``blk.N.``); the same for every family."""

STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
"""RoPE scalings that are a fixed change of the rotary frequencies (and, for yarn, of their
magnitude): transformers' rotary module holds the result, and a GGUF carries it as metadata or a
``rope_freqs`` tensor. Dynamic scalings change with the sequence length and are refused."""


@dataclass(frozen=True)
class Architecture:
    """What one decoder family computes, as far as the decoders need to know."""

    name: str
    """GGUF ``general.architecture``; also the Hugging Face ``model_type`` unless listed below."""
    hf_model_types: tuple[str, ...] = ()
    qk_permuted_in_gguf: bool = False
    """llama.cpp's converter reorders q/k rows for its interleaved rotary layout; the decoders
    here rotate halves, as transformers does, so the rows are put back."""
    norm: str = "rms"
    """"rms": x·w/rms(x); "rms+1": x·(1+w)/rms(x) (Gemma; llama.cpp's converter adds the 1)."""
    norm_placement: str = "pre"
    """"pre": a norm before attention and the MLP; "pre+post": also one on each block's output."""
    activation: str = "silu"
    """Of the gated MLP: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)."""
    qk_norm: bool = False
    """An RMSNorm over each head of q and k before the rotation."""
    fused_qkv: bool = False
    """q, k and v in one matrix (and gate and up in another): split when packing."""
    sliding_window: bool = False
    """Some layers attend only to the last ``window`` positions."""
    embedding_scale: bool = False
    """Embeddings multiplied by √hidden."""
    logit_softcap: bool = False
    """Final (and attention) logits through c·tanh(x/c)."""
    missing: tuple[str, ...] = field(default=())
    """What the decoders do not compute yet; empty: the family runs on the fast path."""

    @property
    def fast(self) -> bool:
        return not self.missing

    @property
    def llama_style(self) -> bool:
        """A Llama layer and nothing more (what the lean forward and Hugging Face peers compute)."""
        return self == Architecture(self.name, self.hf_model_types, self.qk_permuted_in_gguf)

    @property
    def model_types(self) -> tuple[str, ...]:
        return self.hf_model_types or (self.name,)

    def why_not_fast(self) -> str | None:
        if self.fast:
            return None
        return f"specchat's decoders do not compute {self.name}'s {', '.join(self.missing)} yet"


ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture("llama", qk_permuted_in_gguf=True),
    Architecture("mistral", qk_permuted_in_gguf=True),
    Architecture("qwen2"),
    Architecture("qwen3", qk_norm=True),
    Architecture(
        "gemma3",
        hf_model_types=("gemma3_text",),
        norm="rms+1",
        norm_placement="pre+post",
        activation="gelu_tanh",
        qk_norm=True,
        sliding_window=True,
        embedding_scale=True,
    ),
    Architecture(
        "gemma2",
        norm="rms+1",
        norm_placement="pre+post",
        activation="gelu_tanh",
        sliding_window=True,
        embedding_scale=True,
        logit_softcap=True,
        missing=("attention and final logit soft-capping",),
    ),
    Architecture("phi3", fused_qkv=True),
)

BY_NAME: dict[str, Architecture] = {arch.name: arch for arch in ARCHITECTURES}
BY_MODEL_TYPE: dict[str, Architecture] = {t: arch for arch in ARCHITECTURES for t in arch.model_types}
FAST_NAMES: tuple[str, ...] = tuple(arch.name for arch in ARCHITECTURES if arch.fast)


def fast_path_problem(name: str) -> str | None:
    """None if the fast path runs GGUF architecture or HF model type ``name``, else why not (one clause)."""
    arch = BY_NAME.get(name) or BY_MODEL_TYPE.get(name)
    if arch is None:
        return f"specchat's decoders run {', '.join(FAST_NAMES)} models, not {name!r}"
    return arch.why_not_fast()


def exact_context(config: Any) -> int | None:
    """The longest context the decoders compute as the family does, for a transformers config.

    The decoders attend to every position. A family whose layers all attend through a window
    (Mistral v0.1's 4096, Phi-3-mini's 2047) computes the same while the context fits that
    window, and something else past it: so its context is capped at the window, and a longer
    conversation gets the engine's "context holds N tokens" line instead of different text.
    """
    positions = getattr(config, "max_position_embeddings", None)
    window = getattr(config, "sliding_window", None)
    if not window or not getattr(config, "use_sliding_window", True):
        return positions
    if "full_attention" in (getattr(config, "layer_types", None) or ()):
        return positions  # windowed and full layers mixed (Gemma): the decoders window each layer
    return min(positions, int(window)) if positions else int(window)
