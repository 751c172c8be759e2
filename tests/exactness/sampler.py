"""Sampling the first two tokens of many replies through the public engine API.

Lives in its own module so that worker processes can import it: the test spreads seeds over
one process per core, and every sample's seed is fixed, so the counts do not depend on how
the seeds are split.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from specchat.engine.backend import Controls
from specchat.engine.events import TokenEvent
from specchat.engine.session import ChatEngine
from specchat.testing.tiny_models import make_model, make_tokenizer, perturbed_copy

VOCAB_CHARS = "abcd"
"""With <unk>, <s> and </s>: a 7-token vocabulary, 49 two-token outcomes (enumerable exactly)."""
PROMPT = [1, 3, 4, 3, 4, 3]
"""<s> a b a b a: the n-gram drafter finds a continuation to copy from the first round."""


@dataclass(frozen=True)
class Case:
    name: str
    drafter: str
    schedule: str
    gamma: int
    temperature: float
    top_k: int
    top_p: float

    def controls(self) -> Controls:
        return Controls(
            gamma=self.gamma,
            schedule=self.schedule,
            drafter=self.drafter,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            max_new_tokens=8,  # lets the first round draft all γ tokens; only two are read
        )


_ENGINE: ChatEngine | None = None


def tiny_engine() -> ChatEngine:
    """One seeded tiny pair per process (1 layer: the sampler, not the model, is under test)."""
    global _ENGINE
    if _ENGINE is None:
        torch.set_num_threads(1)
        tokenizer = make_tokenizer(VOCAB_CHARS)
        target = make_model(
            len(tokenizer), seed=3, hidden_size=32, layers=1, logit_scale=1.5, max_positions=64
        )
        draft = perturbed_copy(target, noise=1.5, seed=4)
        engine = ChatEngine(target, tokenizer, draft)
        # Every token is an outcome, </s> included: nothing may end a reply before its second token.
        engine.stop_ids = frozenset()
        engine._decoder.stop_ids = frozenset()
        _ENGINE = engine
    return _ENGINE


def sample_counts(case: Case, seeds: range) -> tuple[np.ndarray, Counter[str]]:
    """Counts of (first, second) token pairs over replies seeded ``seeds``, and the kinds
    (accepted, correction, bonus, target) those tokens were produced as."""
    engine = tiny_engine()
    width = engine.vocab_width
    counts = np.zeros(width * width, dtype=np.int64)
    kinds: Counter[str] = Counter()
    controls = case.controls()
    for seed in seeds:
        controls.seed = seed
        events = engine.stream_ids(PROMPT, controls)
        first, second = itertools.islice((e for e in events if isinstance(e, TokenEvent)), 2)
        counts[first.token_id * width + second.token_id] += 1
        kinds[first.kind] += 1
        kinds[second.kind] += 1
    return counts, kinds


def shaped(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Temperature, top-k, then top-p (the smallest most-likely set whose mass reaches top_p),
    in float64, written independently of the engine's sampling code."""
    z = logits.astype(np.float64) / temperature
    kth = np.sort(z, axis=-1)[..., -top_k][..., None]
    z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    order = np.argsort(-p, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(p, order, axis=-1)
    mass_before = np.cumsum(sorted_p, axis=-1) - sorted_p
    margin = np.abs(mass_before - top_p).min()
    if margin < 1e-4:
        raise ValueError("top-p sits on a boundary of this distribution: float32 and float64 would disagree")
    kept_sorted = np.where(mass_before < top_p, sorted_p, 0.0)
    kept = np.zeros_like(p)
    np.put_along_axis(kept, order, kept_sorted, axis=-1)
    return kept / kept.sum(axis=-1, keepdims=True)


def exact_two_token_law(case: Case) -> np.ndarray:
    """P(first = i, second = j) under the target alone, flattened as i * V + j."""
    target = tiny_engine().target.model
    with torch.inference_mode():
        first_logits = target(torch.tensor([PROMPT])).logits[0, -1].numpy()
        vocab = first_logits.shape[-1]
        extended = torch.tensor([[*PROMPT, t] for t in range(vocab)])
        second_logits = target(extended).logits[:, -1].numpy()
    first = shaped(first_logits, case.temperature, case.top_k, case.top_p)
    second = shaped(second_logits, case.temperature, case.top_k, case.top_p)
    return (first[:, None] * second).reshape(-1)
