"""Tiny seeded models and a character-level tokenizer, for fast tests of the real engine.

They live in the package (not under tests/) so the UI tests, the screenshot script and the
engine tests build exactly the same models. Importing this module loads torch and
transformers; nothing in the application imports it.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]
CHARS = string.ascii_lowercase + " .,:!?'\n" + string.digits
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>a:{% endif %}"
)


def make_tokenizer(chars: str = CHARS) -> PreTrainedTokenizerFast:
    """A character-level tokenizer with <s>, </s> and a chat template (about 50 tokens)."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + list(dict.fromkeys(chars)))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_model(
    vocab_size: int,
    seed: int,
    *,
    hidden_size: int = 64,
    layers: int = 2,
    max_positions: int = 256,
    logit_scale: float = 1.0,
    heads: int = 4,
) -> LlamaForCausalLM:
    """A randomly initialised Llama; ``logit_scale`` sharpens its distributions.

    Its heads are hidden_size / heads wide, with half as many K/V heads (grouped-query attention).
    """
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(heads // 2, 1),
        max_position_embeddings=max_positions,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model.eval()


def perturbed_copy(model: LlamaForCausalLM, noise: float, seed: int) -> LlamaForCausalLM:
    """A draft that agrees with ``model`` often but not always: its weights plus noise."""
    draft = LlamaForCausalLM(model.config)
    draft.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * noise * param.std())
    return draft.eval()


@dataclass
class TinyPair:
    target: LlamaForCausalLM
    draft: LlamaForCausalLM
    tokenizer: PreTrainedTokenizerFast


def make_tiny_pair(seed: int = 0, *, draft_noise: float = 0.3, logit_scale: float = 8.0) -> TinyPair:
    """A target and a draft sharing a tokenizer, with acceptance well between 0 and 1."""
    tokenizer = make_tokenizer()
    target = make_model(len(tokenizer), seed, logit_scale=logit_scale)
    draft = perturbed_copy(target, draft_noise, seed + 1)
    return TinyPair(target=target, draft=draft, tokenizer=tokenizer)


def save_tiny_pair(pair: TinyPair, folder: Path) -> tuple[Path, Path]:
    """Write the pair as two Hugging Face folders (for loading through the real loader)."""
    paths = (folder / "tiny-target", folder / "tiny-draft")
    for model, path in zip((pair.target, pair.draft), paths, strict=True):
        model.save_pretrained(path)
        pair.tokenizer.save_pretrained(path)
    return paths
