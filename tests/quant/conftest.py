"""Tiny seeded targets for the bitsandbytes tests, saved as Hugging Face folders.

The target gets a few *outlier features* (hidden dimensions whose norm weights are large), as
trained LLMs have: LLM.int8 treats activations above 6 specially, and tiny random models
never produce them on their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from specchat.testing.tiny_models import make_model, make_tokenizer, perturbed_copy

OUTLIER_DIMS = (3, 17, 40)


def with_outlier_features(model: LlamaForCausalLM, scale: float = 30.0) -> LlamaForCausalLM:
    """Scale a few hidden dimensions of every norm's output, so those activations exceed 6."""
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                norm.weight[list(OUTLIER_DIMS)] *= scale
    return model


def save_pair(
    folder: Path, target: LlamaForCausalLM, draft: LlamaForCausalLM, chars: str | None
) -> tuple[Path, Path]:
    tokenizer = make_tokenizer(chars) if chars else make_tokenizer()
    paths = (folder / "target", folder / "draft")
    for model, path in zip((target, draft), paths, strict=True):
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return paths


@pytest.fixture(scope="session")
def quant_folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(target, draft) over the usual ~50-character vocabulary; the draft disagrees often."""
    vocab = len(make_tokenizer())
    target = with_outlier_features(make_model(vocab, seed=5, logit_scale=2.5))
    draft = perturbed_copy(target, noise=0.5, seed=6)
    return save_pair(tmp_path_factory.mktemp("quant"), target, draft, None)


SMALL_VOCAB = "abcd"  # with <unk>, <s>, </s>: 7 tokens, 49 two-token outcomes


@pytest.fixture(scope="session")
def small_vocab_folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 7-token vocabulary, so that the target's exact distribution can be enumerated.

    64 wide: bitsandbytes' CPU 4-bit kernel needs output widths that are multiples of 32. One
    layer: thousands of samples go through bitsandbytes' Python wrappers, which cost more than
    the arithmetic at this size.
    """
    vocab = len(make_tokenizer(SMALL_VOCAB))
    target = with_outlier_features(make_model(vocab, seed=3, hidden_size=64, layers=1, logit_scale=1.5))
    draft = perturbed_copy(target, noise=1.5, seed=4)
    return save_pair(tmp_path_factory.mktemp("small"), target, draft, SMALL_VOCAB)


@pytest.fixture(autouse=True)
def private_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No test reads the user's config or cache, or reaches the network."""
    monkeypatch.setenv("SPECCHAT_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    yield
