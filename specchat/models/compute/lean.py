"""A lean decoding forward for Llama-style models (Llama, Qwen2, Mistral without sliding window).

On a CPU, once the weights are int8 (see :mod:`specchat.models.compute.cpu_quant`), a 0.5B draft spends
about as long in Python around the GEMMs (module calls, mask and rotary plumbing, output
classes, a cache that concatenates on every step) as in the GEMMs themselves, which inflates c,
the draft's cost relative to the target's. This module runs the same layers, the same weights
and the same projection modules with a short loop instead:

- one preallocated K/V buffer per layer that grows by doubling and crops by moving a length
  (no concatenation per token),
- rotary embeddings computed elementwise for the new positions only,
- attention row by row for short passes (decoding, verification), each row the very call a
  one-token pass makes, so a verify pass reproduces plain decoding bit for bit when the
  projections are row-independent (the packed CPU kernels are); long passes (prefill) use one
  causal SDPA call.

:class:`LeanCausalLM` takes a loaded Hugging Face model and answers the calls the engine's
:class:`~specchat.engine.kv.CachedLM` makes (``model(input_ids=…, cache=…, logits_to_keep=n)``
returning ``.logits`` and ``.cache``, ``config``, ``device``, ``generation_config``,
``get_output_embeddings``). The Hugging Face model itself is left intact (``.hf``), so
``generate`` still works on it, sharing the same weights.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specchat.kernels.lm import LeanCache, LeanOutput
from specchat.models.architectures import BY_MODEL_TYPE, STATIC_ROPE_TYPES, fast_path_problem

ROW_LIMIT = 32
"""Passes over at most this many new positions attend row by row."""


def lean_supported(model: nn.Module, *, for_kernels: bool = False) -> str | None:
    """None if :class:`LeanCausalLM` can run ``model``, else the reason it cannot.

    ``for_kernels``: the caller is the kernels' packing, whose decoder computes every family of
    the architecture table; the lean forward itself computes Llama-style layers only.
    """
    config = getattr(model, "config", None)
    if config is None:
        return "it has no config"
    model_type = str(getattr(config, "model_type", None))
    problem = fast_path_problem(model_type)
    if problem is not None:
        return problem
    arch = BY_MODEL_TYPE[model_type]
    if not for_kernels and not arch.llama_style:
        return f"the lean forward computes Llama-style layers only, not {model_type}'s"
    if arch.activation == "silu" and getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} is not silu"
    # Static scalings live in the rotary module's inv_freq and attention_scaling, which both
    # decoders read; dynamic ones would change them with the sequence length.
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
    if rope_type not in STATIC_ROPE_TYPES:
        return f"rope type {rope_type!r} is not one of {', '.join(STATIC_ROPE_TYPES)}"
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return "sliding-window attention"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "unexpected module layout"
    if next(model.parameters()).device.type != "cpu":
        return "not on the CPU"
    return None


class LeanCausalLM(nn.Module):
    """The decoding forward of a Llama-style Hugging Face model, without the framework around it."""

    embed: Any
    decoder: Any
    norm: Any
    head: Any
    inv_freq: torch.Tensor

    def __init__(self, hf_model: nn.Module) -> None:
        super().__init__()
        reason = lean_supported(hf_model)
        if reason is not None:
            raise ValueError(f"the lean forward cannot run this model: {reason}")
        self.hf = hf_model
        # Any: a Hugging Face model's submodules and config are reached by attribute, which
        # torch's stubs type as Tensor | Module.
        inner: Any = hf_model.model
        config: Any = hf_model.config
        self.embed = inner.embed_tokens
        self.decoder = inner.layers
        self.norm = inner.norm
        self.head = hf_model.get_output_embeddings()  # type: ignore[operator]
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.groups = self.heads // self.kv_heads
        self.scale = self.head_dim**-0.5
        rotary = inner.rotary_emb
        self.register_buffer("inv_freq", rotary.inv_freq.detach().float().clone(), persistent=False)
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        self.eps = [
            (layer.input_layernorm.variance_epsilon, layer.post_attention_layernorm.variance_epsilon)
            for layer in self.decoder
        ]
        self.final_eps = self.norm.variance_epsilon
        self.dtype_ = next(hf_model.parameters()).dtype

    # --- what CachedLM and ChatEngine ask of a model --------------------------------------------
    @property
    def config(self) -> Any:
        return self.hf.config

    @property
    def generation_config(self) -> Any:
        return getattr(self.hf, "generation_config", None)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def get_output_embeddings(self) -> nn.Module:
        return self.head

    @property
    def input_rows(self) -> int:
        return int(self.embed.num_embeddings)

    def new_cache(self) -> LeanCache:
        return LeanCache(len(self.decoder), self.kv_heads, self.head_dim, torch.float32)

    # --- the forward --------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        cache: Any = None,
        use_cache: bool = True,
        logits_to_keep: int = 1,
        **_: Any,
    ) -> LeanOutput:
        if not isinstance(cache, LeanCache):
            if cache is not None and cache.get_seq_length() != 0:
                raise ValueError("the lean forward needs its own cache: pass None or an empty cache")
            cache = self.new_cache()
        ids = input_ids[0]
        length = int(ids.shape[0])
        past = cache.length
        cache.reserve(past + length)
        positions = torch.arange(past, past + length, dtype=torch.float32)
        freqs = positions[:, None] * self.inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        cos = angles.cos() * self.rope_scale
        sin = angles.sin() * self.rope_scale
        hidden = self.embed(ids).float()
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        for index, layer in enumerate(self.decoder):
            eps_in, eps_post = self.eps[index]
            x = _rms(hidden, layer.input_layernorm.weight, eps_in)
            attn = layer.self_attn
            q = attn.q_proj(x).view(length, heads, head_dim).transpose(0, 1)
            k = attn.k_proj(x).view(length, kv_heads, head_dim).transpose(0, 1)
            v = attn.v_proj(x).view(length, kv_heads, head_dim).transpose(0, 1)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            keys, values = cache.keys[index], cache.values[index]
            keys[:, past : past + length] = k
            values[:, past : past + length] = v
            out = self._attend(q, keys, values, past, length)
            hidden = hidden + attn.o_proj(out)
            x = _rms(hidden, layer.post_attention_layernorm.weight, eps_post)
            mlp = layer.mlp
            hidden = hidden + mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
        cache.length = past + length
        last = _rms(hidden[-logits_to_keep:], self.norm.weight, self.final_eps)
        return LeanOutput(self.head(last)[None], cache)

    def _attend(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: int, length: int
    ) -> torch.Tensor:
        """q [heads, L, d] against the cached keys/values [kv_heads, ≥ past+L, d] → [L, heads·d]."""
        kv_heads, groups, head_dim = self.kv_heads, self.groups, self.head_dim
        if length <= ROW_LIMIT:
            rows = []
            for i in range(length):
                seen = past + i + 1
                row = F.scaled_dot_product_attention(
                    q[:, i].reshape(1, kv_heads, groups, head_dim),
                    keys[None, :, :seen],
                    values[None, :, :seen],
                    scale=self.scale,
                )
                rows.append(row.reshape(1, -1))
            return rows[0] if length == 1 else torch.cat(rows)
        total = past + length
        k = keys[:, :total].repeat_interleave(groups, dim=0)
        v = values[:, :total].repeat_interleave(groups, dim=0)
        if past == 0:
            out = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, scale=self.scale)
        else:
            allowed = torch.arange(total)[None, :] <= (past + torch.arange(length))[:, None]
            out = F.scaled_dot_product_attention(
                q[None], k[None], v[None], attn_mask=allowed, scale=self.scale
            )
        return out[0].transpose(0, 1).reshape(length, -1)


def _rms(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = hidden.pow(2).mean(-1, keepdim=True)
    return weight * (hidden * torch.rsqrt(variance + eps))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
