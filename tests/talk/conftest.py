"""Tiny seeded pairs for the talk-mode tests (race, self-test, theory)."""

from __future__ import annotations

import pytest
import torch

from specchat.engine.session import ChatEngine
from specchat.testing.tiny_models import TinyPair, make_tiny_pair


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def pair() -> TinyPair:
    return make_tiny_pair(seed=0, draft_noise=0.4, logit_scale=3.0)


@pytest.fixture
def engine(pair: TinyPair) -> ChatEngine:
    return ChatEngine(pair.target, pair.tokenizer, pair.draft)
