"""Tiny seeded models and a character-level tokenizer, for fast tests of the real engine.

They live in the package (not under tests/) so the UI tests, the screenshot script and the
engine tests build exactly the same models. Importing this module loads torch and
transformers; nothing in the application imports it.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

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


# ------------------------------------------------------------------ a tiny thinking model
THINKING_TEMPLATE = (
    # Qwen3's chat template without its tool calls: past replies lose their reasoning, and
    # enable_thinking=false puts an empty <think></think> in the generation prompt.
    "{%- if messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}"
    "{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set content = message.content %}"
    "{%- if '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)
THINKING_SPECIALS = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
REASONING_SCRIPT = [
    *("Let", " me", " think", " about", " it", " one", " word", " at", " a", " time", ","),
    *(" the", " user", " greets", ";", " I", " reply", " kindly", "."),
]
ANSWER_SCRIPT = ["Hello", " there", "!", " Nice", " to", " meet", " you"]
THINKING_WORDS = ["system", "user", "assistant", "\n", "\n\n", " hi", " hello", " what", "?", " "]
THINKING_PIECES = r" ?[A-Za-z]+| ?[0-9]+|\n+| +|[^\sA-Za-z0-9]"
"""Words with their leading space, runs of line breaks, and single punctuation marks."""
DRAFT_MISTAKES = {" about": " word", " user": " reply", " kindly": "!"}
"""Where the thinking draft guesses wrong: all inside the reasoning, so reasoning and answer
accept differently (the answer's drafts all pass)."""


def make_thinking_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer with Qwen3's special tokens and a thinking chat template."""
    from tokenizers import Regex

    words = THINKING_SPECIALS + THINKING_WORDS + REASONING_SCRIPT + ANSWER_SCRIPT
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(words))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(THINKING_PIECES), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.add_tokens(THINKING_SPECIALS[2:], special_tokens=True)
    tokenizer.chat_template = THINKING_TEMPLATE
    return tokenizer


def script_model(
    tokenizer: PreTrainedTokenizerFast,
    follows: dict[str, str],
    *,
    margin: float = 10.0,
    max_positions: int = 512,
) -> Any:
    """A tiny Qwen3 that, whatever came before, writes after each token the one ``follows`` names
    (after any other: the end of its turn), with probability about 1 − vocab·e^−margin.

    Its attention and MLP write nothing to the residual stream, so the last token's one-hot
    embedding reaches the head, which holds the table: a real Qwen3 forward, KV cache and all,
    whose next token is exact by construction (no training, the same on every machine).
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    vocab = len(tokenizer)
    hidden = 64
    assert vocab <= hidden, "the one-hot embedding needs a dimension per token"
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    end = tokenizer.eos_token_id
    with torch.no_grad():
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[:, :vocab] = torch.eye(vocab)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        head = torch.zeros(vocab, hidden)
        for token in range(vocab):
            after = follows.get(str(tokenizer.convert_ids_to_tokens(token)))
            following = tokenizer.convert_tokens_to_ids(after) if after is not None else end
            # The final RMSNorm scales a one-hot row to sqrt(hidden): divide it back out.
            head[following, token] = margin / hidden**0.5
        model.lm_head.weight.copy_(head)
    model.generation_config.eos_token_id = end
    return model.eval()


def thinking_script() -> dict[str, str]:
    """The target's table: the generation prompt's line break opens <think>, then the reasoning,
    </think>, a blank line and the answer (the blank line alone when thinking is switched off)."""
    chain = ["\n", "<think>", *REASONING_SCRIPT, "</think>", "\n\n", *ANSWER_SCRIPT, "<|im_end|>"]
    return dict(pairwise(chain))


@dataclass
class ThinkingPair:
    target: Any
    draft: Any
    tokenizer: PreTrainedTokenizerFast


def make_thinking_pair(max_positions: int = 512) -> ThinkingPair:
    """A tiny Qwen3 thinking target (see :func:`script_model`) and a draft that agrees with it
    everywhere but three places in the reasoning (:data:`DRAFT_MISTAKES`)."""
    tokenizer = make_thinking_tokenizer()
    script = thinking_script()
    target = script_model(tokenizer, script, max_positions=max_positions)
    draft = script_model(tokenizer, {**script, **DRAFT_MISTAKES}, max_positions=max_positions)
    return ThinkingPair(target, draft, tokenizer)


def save_thinking_pair(pair: ThinkingPair, folder: Path) -> tuple[Path, Path]:
    """Write the pair as two Hugging Face folders (for ``specchat chat --target … --draft …``)."""
    paths = (folder / "tiny-qwen3-thinking", folder / "tiny-qwen3-thinking-draft")
    for model, path in zip((pair.target, pair.draft), paths, strict=True):
        model.save_pretrained(path)
        pair.tokenizer.save_pretrained(path)
    return paths
