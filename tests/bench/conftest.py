"""Tiny seeded models for the benchmark tests: the real engine and harness, in seconds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from specchat.bench.prompts import BenchPrompt
from specchat.engine.session import ChatEngine
from specchat.testing.tiny_models import TinyPair, make_model, make_tokenizer, perturbed_copy, save_tiny_pair


@pytest.fixture(autouse=True)
def private_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No test reads the user's config or cache, or reaches the network."""
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.setenv("SPECCHAT_CONFIG", str(tmp_path_factory.mktemp("config") / "config.toml"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    yield


@pytest.fixture(scope="session")
def long_pair() -> TinyPair:
    """A tiny pair whose context holds the shipped prompts (character-level: ~1000 tokens)."""
    tokenizer = make_tokenizer()
    target = make_model(len(tokenizer), 0, max_positions=4096, logit_scale=3.0)
    return TinyPair(target=target, draft=perturbed_copy(target, 0.3, 1), tokenizer=tokenizer)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Tiny models gain nothing from threads, and lose a lot when the machine is busy."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def engine(long_pair: TinyPair, one_thread: None) -> ChatEngine:
    return ChatEngine(long_pair.target, long_pair.tokenizer, long_pair.draft)


@pytest.fixture(scope="session")
def pair_folders(long_pair: TinyPair, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return save_tiny_pair(long_pair, tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def prompts() -> list[BenchPrompt]:
    copy = "the cat sat on the mat. the cat sat on"
    return [
        BenchPrompt("copy-1", "code", ({"role": "user", "content": copy},)),
        BenchPrompt("chat-1", "chat", ({"role": "user", "content": "hello, how are you today?"},)),
    ]
